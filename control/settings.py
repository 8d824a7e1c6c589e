"""The settings of a live `scepsy control` run: the loop's own (LiveSettings) and the whole run's
(LiveControlSettings: the Prometheus it reads, the cluster it acts on, how it acts, where it
reports, and the manifest settings the plan was deployed with). The policy's knobs are
control/policy.py ControlSettings. Every default is here once (or in the settings it names); the
command line builds these settings from its flags and `scepsy.api.control` takes them
(docs/control.md, "Running it live")."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from scepsy.k8s.manifests import ManifestSettings
from scepsy.models.errors import InputError

ACT_MODES = ("apply", "dry-run", "gauges")


@dataclass(frozen=True)
class LiveSettings:
    """The live loop's knobs; docs/control.md gives reasons."""

    act: str = "apply"  # apply | dry-run | gauges
    ready_timeout_s: float = 900.0  # a new replica not Ready after 15 minutes is stuck (a 70B model loads in 5-10)
    retry_s: float = 30.0  # first wait after a failed apply: API server hiccups clear in seconds
    max_retry_s: float = 600.0  # the longest wait between retries: ten minutes

    def __post_init__(self) -> None:
        if self.act not in ACT_MODES:
            raise InputError(None, "act", f"unknown mode {self.act!r}", f"use one of: {', '.join(ACT_MODES)}")
        for name in ("ready_timeout_s", "retry_s", "max_retry_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InputError(None, name, f"{value!r} is not a positive number of seconds", "give e.g. 60")


@dataclass(frozen=True)
class LiveControlSettings:
    """One live run's settings, checked as they are made (an InputError names the field)."""

    prometheus_url: str | None = None  # the Prometheus that scrapes the engines (HTTP API); required
    prometheus_selector: str = ""  # label matchers narrowing the engines' series, e.g. 'namespace="scepsy"'
    prometheus_bearer_token_file: str | Path | None = None
    prometheus_ca_file: str | Path | None = None
    prometheus_verify_tls: bool = True
    prometheus_headers: tuple[str, ...] = ()  # "Name: value"
    namespace: str = ManifestSettings.namespace
    kubeconfig: str | Path | None = None  # None: in the cluster, else ~/.kube/config
    context: str | None = None
    act: str = LiveSettings.act
    ready_timeout_s: float = LiveSettings.ready_timeout_s
    metrics_port: int = 9464  # /metrics and /healthz; 0: any free port
    metrics_host: str = "127.0.0.1"  # 0.0.0.0 in a pod
    leader_identity: str | None = None  # run only while holding the Lease scepsy-controller; None: no election
    log: str | Path = Path("scepsy-control.jsonl")  # one JSON line per period, appended
    periods: int | None = None  # None: until interrupted
    # the manifest settings the plan was deployed with
    engine: str = ManifestSettings.engine
    gpu_sharing: str = ManifestSettings.gpu_sharing
    router: str = ManifestSettings.router
    image: str | None = ManifestSettings.image

    def __post_init__(self) -> None:
        if self.prometheus_url is None:
            raise InputError(None, "prometheus_url", "the live controller reads the engines' rates from Prometheus",
                             "give its http(s) URL, e.g. http://prometheus.monitoring:9090")
        if not self.prometheus_url.startswith(("http://", "https://")):
            raise InputError(None, "prometheus_url", f"{self.prometheus_url!r} is not an http(s) URL",
                             "give e.g. http://prometheus.monitoring:9090")
        if not 0 <= self.metrics_port <= 65535:
            raise InputError(None, "metrics_port", f"{self.metrics_port} is not a port", "give 1 to 65535, or 0 for any free port")
        if self.periods is not None and self.periods < 1:
            raise InputError(None, "periods", f"{self.periods} is below 1",
                             "give the number of periods to run, or none to run until interrupted")
        self.live_settings()
        self.manifest_settings()

    def live_settings(self) -> LiveSettings:
        """The loop's settings (checked there)."""
        return LiveSettings(act=self.act, ready_timeout_s=self.ready_timeout_s)

    def manifest_settings(self) -> ManifestSettings:
        """The manifest settings the running deployment was written with (checked there)."""
        return ManifestSettings(engine=self.engine, gpu_sharing=self.gpu_sharing, namespace=self.namespace,
                                router=self.router, image=self.image)
