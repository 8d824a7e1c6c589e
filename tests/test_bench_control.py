"""bench/control.py: knobs other than the defaults reach the controller's settings with their
types, and the scenarios of a results file stay apart where their knobs differ."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scepsy.control.policy import ControlSettings

from conftest import load_script

ROOT = Path(__file__).resolve().parent.parent


def _bench():
    return load_script("control_bench", ROOT / "bench" / "control.py")


def test_a_setting_overrides_its_knob_with_the_defaults_type():
    settings = _bench().control_settings(60.0, ["predictor=kalman", "confirm_periods=3", "burst_z=0"])
    assert settings == ControlSettings(startup_s=60.0, predictor="kalman", confirm_periods=3, burst_z=0.0)
    assert isinstance(settings.confirm_periods, int) and isinstance(settings.burst_z, float)


def test_an_unknown_knob_is_refused_by_name():
    with pytest.raises(SystemExit, match="no knob 'burst'"):
        _bench().control_settings(60.0, ["burst=1"])


def test_scenarios_with_other_knobs_are_not_merged(tmp_path):
    base = {"startup_s": 60.0, "peak": 0.8, "start_min": 0.0, "minutes": 60.0, "seed": 0}
    system = {"name": "scepsy-control", "workflows": []}
    lines = [{"scenario": {**base, "settings": []}, "systems": [system]},
             {"scenario": {**base, "settings": ["predictor=kalman"]}, "systems": [system]},
             {"scenario": dict(base), "systems": [{"name": "static-peak", "workflows": []}]},
             {"scenario": {**base, "shape": "ramp"}, "systems": [system]}]
    path = tmp_path / "control.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    merged = _bench().scenarios(path)
    assert [sorted(s["name"] for s in systems) for _, systems, _ in merged] == [["scepsy-control", "static-peak"], ["scepsy-control"],
                                                                                     ["scepsy-control"]]
