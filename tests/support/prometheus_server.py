"""A real Prometheus server (the Debian package `prometheus`, binary /usr/bin/prometheus) on loopback,
scraping the targets a test gives it, with its TSDB in a temporary folder.

The scrape configuration is generated (one job per LLM with the engines' `/metrics` as static
targets, each target labelled `llm`), Prometheus listens on a free loopback port, and `start`
returns once the HTTP API answers; `wait_for_targets` polls `GET /api/v1/targets` until every
target's `health` is "up", and `wait_for` polls an instant query until it has a result, so that no
test sleeps a fixed time. Prometheus' own flags: `--config.file`, `--storage.tsdb.path`,
`--web.listen-address` (Prometheus docs, "Configuration" and `prometheus --help`), and
`--web.config.file` for a test that gives `web_config` (Prometheus docs, "HTTPS and
authentication": `tls_server_config` makes it serve https, `basic_auth_users` maps a user to a
bcrypt hash); `ready_headers` and `ca_file` are what the readiness check then needs.
"""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import httpx
import yaml

BINARY = "prometheus"
PATIENCE_S = 120.0  # how long to wait for Prometheus to come up or see a target (a loaded CI is slow)


def available() -> bool:
    return shutil.which(BINARY) is not None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def scrape_config(targets: Mapping[str, Sequence[str]], interval_s: float = 1.0) -> dict:
    """A Prometheus configuration scraping each LLM's engines (host:port) every `interval_s`."""
    interval = f"{interval_s:g}s"
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval, "scrape_timeout": interval},
        "scrape_configs": [
            {"job_name": f"engines-{llm}", "metrics_path": "/metrics", "static_configs": [{"targets": list(hosts), "labels": {"llm": llm}}]}
            for llm, hosts in sorted(targets.items())
        ],
    }


class PrometheusServer:
    def __init__(self, folder: Path, targets: Mapping[str, Sequence[str]], interval_s: float = 1.0,
                 web_config: Mapping | None = None, ready_headers: Mapping[str, str] | None = None, ca_file: Path | None = None):
        self.web_config = web_config
        self.ready_headers = dict(ready_headers or {})
        self.ca_file = ca_file
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.config = folder / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(scrape_config(targets, interval_s), sort_keys=False))
        self.log = folder / "prometheus.log"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.web_config and "tls_server_config" in self.web_config else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> None:
        argv = [BINARY, f"--config.file={self.config}", f"--storage.tsdb.path={self.folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"]
        if self.web_config is not None:
            web = self.folder / "web.yml"
            web.write_text(yaml.safe_dump(dict(self.web_config), sort_keys=False))
            argv.append(f"--web.config.file={web}")
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        self._poll(lambda: self._ready(), "Prometheus to answer /-/ready")

    def stop(self) -> None:
        """Stop Prometheus (SIGTERM, then wait): afterwards its port refuses connections."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.process.returncode}: {self.log.read_text()[-2000:]}")
        try:
            verify = ssl.create_default_context(cafile=str(self.ca_file)) if self.ca_file is not None else True
            return httpx.get(self.url + "/-/ready", timeout=5.0, headers=self.ready_headers, verify=verify).status_code == 200
        except httpx.HTTPError:
            return False

    def _poll(self, condition: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            if condition():
                return
            time.sleep(0.2)
        raise AssertionError(f"waited {PATIENCE_S:g} s for {what}; log: {self.log.read_text()[-2000:]}")

    def targets(self) -> list[dict]:
        return httpx.get(self.url + "/api/v1/targets", timeout=5.0).json()["data"]["activeTargets"]

    def wait_for_targets(self, count: int) -> None:
        """Until `count` targets are active and every one is up (scraped successfully)."""
        self._poll(lambda: len(found := self.targets()) == count and all(t["health"] == "up" for t in found),
                   f"{count} targets up")

    def query(self, promql: str) -> list[dict]:
        body = httpx.get(self.url + "/api/v1/query", params={"query": promql}, timeout=5.0).json()
        return body["data"]["result"]

    def wait_for(self, promql: str, condition: Callable[[list[dict]], bool] = bool) -> list[dict]:
        """Until the instant query's result satisfies `condition` (default: not empty)."""
        found: list[dict] = []

        def check() -> bool:
            nonlocal found
            found = self.query(promql)
            return condition(found)

        self._poll(check, f"{promql} to hold")
        return found
