"""Each step's settings hold every default once: the command line's flags are the settings'
fields with the same defaults, and the API takes the settings (with overrides of their fields)."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from scepsy import api
from scepsy.cli import deploy as deploy_cli
from scepsy.k8s.manifests import ManifestSettings
from scepsy.models.errors import InputError

# `scepsy manifests` arguments that are not manifest settings: the inputs, the output, and the
# controller's Deployment (api.controller_settings)
NOT_MANIFEST_SETTINGS = {"plan_file", "out", "instance", "controller", "controller_image", "prometheus_url",
                         "prometheus_selector", "settings_file", "json_output"}


def test_every_manifests_flag_is_a_manifest_setting_with_its_default_and_every_setting_has_a_flag():
    flags = {name: p.default for name, p in inspect.signature(deploy_cli.manifests).parameters.items()
             if name not in NOT_MANIFEST_SETTINGS}
    defaults = {f.name: f.default for f in dataclasses.fields(ManifestSettings)}
    assert set(flags) == set(defaults), set(flags) ^ set(defaults)
    disagree = {name: (flags[name], defaults[name]) for name in flags if flags[name] != defaults[name]}
    assert not disagree, f"the CLI's default and the setting's differ (cli, settings): {disagree}"


def test_settings_check_their_values_once_and_the_api_takes_overrides_of_their_fields():
    with pytest.raises(InputError, match="router"):
        ManifestSettings(router="nginx")
    assert api.manifest_settings(engine="sglang") == ManifestSettings(engine="sglang")
    assert api.manifest_settings(ManifestSettings(namespace="a"), engine="sglang").namespace == "a"
    with pytest.raises(InputError, match="is not a manifest setting"):
        api.manifest_settings(engines="sglang")


# `scepsy control` arguments that are not live control settings: the inputs, the simulation's
# (api.simulate_control's arguments), the policy's knobs (below) and the output
NOT_LIVE_SETTINGS = {"instance", "plan", "simulate", "arrivals", "baselines", "plot", "seed", "settings_file", "setting",
                     "json_output", "out", "startup_s", "period_s", "predictor"}
RENAMED = {"prometheus_header": "prometheus_headers"}  # a flag given once per header


def test_every_control_flag_is_a_setting_with_its_default_and_every_setting_has_a_flag():
    from scepsy.cli import control as control_cli
    from scepsy.control.policy import ControlSettings
    from scepsy.control.settings import LiveControlSettings

    parameters = inspect.signature(control_cli.control).parameters
    flags = {RENAMED.get(name, name): p.default for name, p in parameters.items() if name not in NOT_LIVE_SETTINGS}
    defaults = {f.name: f.default for f in dataclasses.fields(LiveControlSettings)}
    assert set(flags) == set(defaults), set(flags) ^ set(defaults)
    flags["prometheus_headers"] = tuple(flags["prometheus_headers"] or ())  # None: no --prometheus-header
    disagree = {name: (flags[name], defaults[name]) for name in flags if flags[name] != defaults[name]}
    assert not disagree, f"the CLI's default and the setting's differ (cli, settings): {disagree}"
    policy = {f.name: f.default for f in dataclasses.fields(ControlSettings)}
    assert {name: parameters[name].default for name in ("startup_s", "period_s", "predictor")} == {
        name: policy[name] for name in ("startup_s", "period_s", "predictor")}


def test_the_live_settings_check_themselves_and_the_api_takes_overrides():
    from scepsy.control.settings import LiveControlSettings

    with pytest.raises(InputError, match="prometheus_url"):
        LiveControlSettings()
    with pytest.raises(InputError, match="act"):
        LiveControlSettings(prometheus_url="http://p:9090", act="maybe")
    with pytest.raises(InputError, match="router"):
        LiveControlSettings(prometheus_url="http://p:9090", router="nginx")
    assert api.live_control_settings(prometheus_url="http://p:9090", periods=2).periods == 2
    with pytest.raises(InputError, match="is not a live control setting"):
        api.live_control_settings(prometheus_url="http://p:9090", period=2)
    assert api.control_settings(period_s=10.0).period_s == 10.0
