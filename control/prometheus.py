"""A client of the Prometheus HTTP API for the controller: instant queries, each answered with its
samples or with a typed reason why there are none, never with a made-up zero.

`GET <url>/api/v1/query?query=<PromQL>` (Prometheus docs, "HTTP API", instant queries) answers
`{"status": "success", "data": {"resultType": "vector", "result": [{"metric": {labels}, "value":
[<unix time>, "<value>"]}]}}`; values are strings and may be "NaN", "+Inf" or "-Inf". Each query
is tried `attempts` times with exponential backoff (`backoff_s`, doubled each retry) when
Prometheus cannot be reached, times out (`timeout_s` per try) or answers 5xx or 429; a 4xx (a bad
query) is not retried.

What the controller reads, per LLM, is grouped by the engines' `model_name` label (vLLM and SGLang
both label every metric with the served model name, which the manifests set to the LLM's name;
`selector` narrows to one namespace, e.g. `namespace="scepsy"`):

    rate of finished requests    sum by (model_name) (rate(<finished counter>[window]))
    freshness                    max by (model_name) (timestamp(<finished counter>))
    queue, running               sum by (model_name) (<gauge>)
    KV-cache usage               max by (model_name) (<gauge>)
    mean call latency            sum by (model_name) (rate(<latency histogram>_sum[window]))
                                   / sum by (model_name) (rate(<latency histogram>_count[window]))

(the engines' metric names: k8s/engines.py `METRICS`; the latency histogram is each engine's
end-to-end request latency, vLLM `vllm:e2e_request_latency_seconds`, SGLang
`sglang:e2e_request_latency_seconds`). A mean latency is NaN where no call finished in the window
(0/0): `nan`, never 0; and `stale` with the rate of its LLM.

and, per workflow, from the workflow entry's metrics (tracing/capture/entry_metrics.py), grouped by
its `workflow` label:

    arrival rate                 sum by (workflow) (rate(scepsy_entry_requests_total[window]))
    freshness                    max by (workflow) (timestamp(scepsy_entry_requests_total))
    mean latency                 sum by (workflow) (rate(<duration>_sum[window]))
                                   / sum by (workflow) (rate(<duration>_count[window]))

A Prometheus behind authentication or TLS (a managed service, a proxy such as
kube-rbac-proxy in front of an in-cluster one) is read with `bearer_token_file` (re-read before
every query: a projected service-account token rotates), `headers` (e.g. a tenant header, or
`Authorization: Basic ...`), `ca_file` (the CA bundle that signed its certificate) and
`verify_tls` (False only for a test server's self-signed certificate). An unreadable token file
makes the query's value `Missing` ("error") like any other failure.

A value is `Missing` with a reason: `unreachable`, `timeout`, `error` (Prometheus answered an
error), `no series` (nothing matched: no target up, no LLM of that name, fewer than two samples in
the window), `nan` (NaN or infinite) or `stale` (the newest sample is older than `max_age_s`).
"""

from __future__ import annotations

import math
import ssl
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx

from scepsy.k8s.engines import METRICS
from scepsy.tracing.capture.entry_metrics import DURATION_METRIC, REQUESTS_METRIC

MISSING_REASONS = ("unreachable", "timeout", "error", "no series", "nan", "stale")
LLM_LABEL = "model_name"
WORKFLOW_LABEL = "workflow"  # the entry's label (tracing/capture/entry_metrics.py)


@dataclass(frozen=True)
class Missing:
    """Why a query or an LLM's value has no usable number."""

    reason: str  # one of MISSING_REASONS
    detail: str

    def __post_init__(self) -> None:
        if self.reason not in MISSING_REASONS:
            raise ValueError(f"unknown reason {self.reason!r}")

    def text(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float  # may be NaN or infinite: checked by the reader that uses it
    time_s: float  # the evaluation time Prometheus reports


@dataclass(frozen=True)
class Answer:
    """An instant query's samples, or why there are none (`missing`)."""

    query: str
    samples: tuple[Sample, ...] = ()
    missing: Missing | None = None
    attempts: int = 1

    def by(self, label: str) -> dict[str, float]:
        return {s.labels.get(label, ""): s.value for s in self.samples}


RATE_WINDOW_S = 60.0  # the rate window: 4 scrapes at the PodMonitors' 15 s interval


@dataclass(frozen=True)
class PrometheusSettings:
    url: str
    timeout_s: float = 5.0  # per try; a Prometheus slower than this counts as unreachable for the period
    attempts: int = 3  # tries per query: a restart of Prometheus or a dropped connection is retried
    backoff_s: float = 0.5  # wait before the second try, doubled before each further one
    window_s: float = RATE_WINDOW_S
    max_age_s: float = 60.0  # a newest sample older than this is stale (4 missed scrapes)
    selector: str = ""  # extra label matchers, e.g. 'namespace="scepsy"'
    engine: str = "vllm"  # whose metric names to read (k8s/engines.py METRICS)
    bearer_token_file: str | None = None  # `Authorization: Bearer <its content>` on every query
    ca_file: str | None = None  # CA bundle (PEM) that verifies an https Prometheus; None: the system's
    verify_tls: bool = True  # False: accept any certificate (a test server's self-signed one)
    headers: tuple[tuple[str, str], ...] = ()  # extra request headers, (name, value)

    def tls(self) -> ssl.SSLContext | bool:
        """httpx's `verify`: an SSL context of the CA bundle, the system's trust, or False."""
        if not self.verify_tls:
            return False
        if self.ca_file is not None:
            return ssl.create_default_context(cafile=self.ca_file)
        return True


MAX_TOKEN_BYTES = 64 * 1024  # a service-account JWT is about a kilobyte


def read_token(path: str) -> str:
    """The bearer token in a file (stripped), read with a size bound; OSError or ValueError."""
    with open(path, "rb") as stream:
        data = stream.read(MAX_TOKEN_BYTES + 1)
    if len(data) > MAX_TOKEN_BYTES:
        raise ValueError(f"{path} is over {MAX_TOKEN_BYTES} bytes: not a token")
    token = data.decode("utf-8", errors="strict").strip()
    if not token:
        raise ValueError(f"{path} is empty")
    return token


@dataclass
class PrometheusClient:
    """Instant queries against one Prometheus; `sleep` is injected (tests record the backoff)."""

    settings: PrometheusSettings
    sleep: Callable[[float], None] = time.sleep
    transport: httpx.BaseTransport | None = None
    _client: httpx.Client | None = field(default=None, init=False, repr=False)

    def _http(self) -> httpx.Client:
        if self._client is None:
            self._client = httpx.Client(base_url=self.settings.url.rstrip("/"), timeout=self.settings.timeout_s,
                                        transport=self.transport, headers=dict(self.settings.headers),
                                        verify=self.settings.tls())
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def query(self, promql: str) -> Answer:
        """An instant query at Prometheus' now, retried with backoff on transport failures."""
        missing: Missing | None = None
        attempts = max(1, self.settings.attempts)
        for attempt in range(1, attempts + 1):
            if attempt > 1:
                self.sleep(self.settings.backoff_s * 2 ** (attempt - 2))
            answer, retry = self._once(promql, attempt)
            if not retry:
                return answer
            missing = answer.missing
        return Answer(promql, missing=missing, attempts=attempts)

    def _once(self, promql: str, attempt: int) -> tuple[Answer, bool]:
        where = self.settings.url
        headers = {}
        if self.settings.bearer_token_file is not None:
            try:
                headers["Authorization"] = f"Bearer {read_token(self.settings.bearer_token_file)}"
            except (OSError, ValueError) as exc:
                return Answer(promql, missing=Missing("error", f"cannot read the bearer token file ({exc})"), attempts=attempt), False
        try:
            response = self._http().get("/api/v1/query", params={"query": promql}, headers=headers)
        except httpx.TimeoutException:
            return Answer(promql, missing=Missing("timeout", f"no answer from {where} within {self.settings.timeout_s:g} s"), attempts=attempt), True
        except httpx.ConnectError as exc:
            if "CERTIFICATE_VERIFY_FAILED" in str(exc):  # retrying cannot help: the CA bundle is wrong
                return Answer(promql, missing=Missing("unreachable", f"{where}'s TLS certificate does not verify against "
                                                      f"{self.settings.ca_file or 'the system CA bundle'}"), attempts=attempt), False
            return Answer(promql, missing=Missing("unreachable", f"cannot reach {where} ({type(exc).__name__})"), attempts=attempt), True
        except httpx.HTTPError as exc:
            return Answer(promql, missing=Missing("unreachable", f"cannot reach {where} ({type(exc).__name__})"), attempts=attempt), True
        retry = response.status_code >= 500 or response.status_code == 429
        try:
            body = response.json()
        except ValueError:
            return Answer(promql, missing=Missing("error", f"{where} answered HTTP {response.status_code}, not JSON"), attempts=attempt), retry
        if response.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else None
            return Answer(promql, missing=Missing("error", f"{where} answered HTTP {response.status_code}: {error or 'no error text'}"), attempts=attempt), retry
        data = body.get("data")
        if not isinstance(data, dict) or data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
            kind = data.get("resultType") if isinstance(data, dict) else type(data).__name__
            return Answer(promql, missing=Missing("error", f"expected a vector, got {kind!r}"), attempts=attempt), False
        samples = []
        for item in data["result"]:
            try:
                stamp, text = item["value"]
                samples.append(Sample(dict(item.get("metric") or {}), float(text), float(stamp)))
            except (KeyError, TypeError, ValueError):
                return Answer(promql, missing=Missing("error", f"unreadable sample {item!r}"), attempts=attempt), False
        if not samples:
            return Answer(promql, missing=Missing("no series", f"nothing matched {promql}"), attempts=attempt), False
        return Answer(promql, tuple(samples), attempts=attempt), False


# ---------------------------------------------------------------------------------------------
# What the controller reads


def _matchers(selector: str) -> str:
    return "{" + selector + "}" if selector else ""


def _window(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def rate_query(settings: PrometheusSettings) -> str:
    counter = METRICS[settings.engine].requests_finished
    return f"sum by ({LLM_LABEL}) (rate({counter}{_matchers(settings.selector)}[{_window(settings.window_s)}]))"


def freshness_query(settings: PrometheusSettings) -> str:
    counter = METRICS[settings.engine].requests_finished
    return f"max by ({LLM_LABEL}) (timestamp({counter}{_matchers(settings.selector)}))"


def gauge_query(settings: PrometheusSettings, metric: str, how: str = "sum") -> str:
    return f"{how} by ({LLM_LABEL}) ({metric}{_matchers(settings.selector)})"


def _mean_query(settings: PrometheusSettings, histogram: str, label: str) -> str:
    """The mean of a histogram's observations in the window, per `label`: NaN where there was none (0/0)."""
    matchers, window = _matchers(settings.selector), _window(settings.window_s)
    return (f"sum by ({label}) (rate({histogram}_sum{matchers}[{window}]))"
            f" / sum by ({label}) (rate({histogram}_count{matchers}[{window}]))")


def llm_latency_query(settings: PrometheusSettings) -> str:
    """Mean latency of the calls each LLM's engines finished in the window."""
    return _mean_query(settings, METRICS[settings.engine].request_latency, LLM_LABEL)


@dataclass(frozen=True)
class LlmSamples:
    """One period's reading of every LLM: a number or why there is none."""

    time_s: float | None  # Prometheus' evaluation time of the rates (None: no answer)
    rates_rps: Mapping[str, float | Missing]
    waiting: Mapping[str, float | Missing]
    running: Mapping[str, float | Missing]
    kv_usage: Mapping[str, float | Missing]
    queries: tuple[Answer, ...]
    latency_s: Mapping[str, float | Missing] = field(default_factory=dict)  # mean call latency over the window

    @property
    def unanswered(self) -> Missing | None:
        """Why Prometheus gave nothing this period (unreachable, timeout, error), else None."""
        missing = self.queries[0].missing if self.queries else None
        return missing if missing is not None and missing.reason != "no series" else None

    def problems(self) -> list[str]:
        """One line per LLM whose rate is missing (what the loop says on stderr)."""
        return [f"{llm}: {value.text()}" for llm, value in sorted(self.rates_rps.items()) if isinstance(value, Missing)]


def _per_name(answer: Answer, names: list[str], label: str = LLM_LABEL) -> dict[str, float | Missing]:
    """Each name's value in the answer (grouped by `label`), or why there is none."""
    out: dict[str, float | Missing] = {}
    values = answer.by(label)
    for name in names:
        if answer.missing is not None and answer.missing.reason != "no series":
            out[name] = answer.missing
        elif name not in values:
            out[name] = Missing("no series", f"no {name} series in {answer.query}")
        elif not math.isfinite(values[name]):
            out[name] = Missing("nan", f"{name}: {values[name]} from {answer.query}")
        else:
            out[name] = values[name]
    return out


def _stale(rates: dict[str, float | Missing], ages: Mapping[str, float | Missing], now: float | None, max_age_s: float) -> None:
    """Mark each rate whose newest sample is older than `max_age_s` (or has no time) missing, in place."""
    for name, newest in ages.items():
        if isinstance(rates[name], Missing) or now is None:
            continue
        if isinstance(newest, Missing):
            rates[name] = Missing(newest.reason, f"no sample time for {name}: {newest.detail}")
        elif now - newest > max_age_s:
            rates[name] = Missing("stale", f"{name}: newest sample is {now - newest:.0f} s old (limit {max_age_s:g} s)")


def read_llms(client: PrometheusClient, llms: list[str]) -> LlmSamples:
    """The per-LLM rates (finished requests per second over the window), queue, running, KV
    usage and mean call latency over the window; a rate whose newest sample is older than
    `max_age_s` is `stale`, and so is that LLM's latency."""
    settings = client.settings
    names = METRICS[settings.engine]
    rates = client.query(rate_query(settings))
    down = rates.missing is not None and rates.missing.reason != "no series"  # do not wait on it four more times

    def ask(promql: str) -> Answer:
        return rates if down else client.query(promql)

    fresh = ask(freshness_query(settings))
    rates_rps = _per_name(rates, llms)
    now = next((s.time_s for s in rates.samples), None)
    ages = _per_name(fresh, llms)
    _stale(rates_rps, ages, now, settings.max_age_s)
    waiting = ask(gauge_query(settings, names.waiting))
    running = ask(gauge_query(settings, names.running))
    kv = ask(gauge_query(settings, names.kv_cache_usage, "max"))
    latency = ask(llm_latency_query(settings))
    latency_s = _per_name(latency, llms)
    _stale(latency_s, ages, now, settings.max_age_s)
    return LlmSamples(now, rates_rps, _per_name(waiting, llms), _per_name(running, llms), _per_name(kv, llms),
                      (rates, fresh, waiting, running, kv, latency), latency_s)


# ---------------------------------------------------------------------------------------------
# The workflow entry's demand (tracing/capture/entry_metrics.py)


def workflow_rate_query(settings: PrometheusSettings) -> str:
    return f"sum by ({WORKFLOW_LABEL}) (rate({REQUESTS_METRIC}{_matchers(settings.selector)}[{_window(settings.window_s)}]))"


def workflow_freshness_query(settings: PrometheusSettings) -> str:
    return f"max by ({WORKFLOW_LABEL}) (timestamp({REQUESTS_METRIC}{_matchers(settings.selector)}))"


def workflow_latency_query(settings: PrometheusSettings) -> str:
    """Mean latency of the workflow requests finished in the window."""
    return _mean_query(settings, DURATION_METRIC, WORKFLOW_LABEL)


@dataclass(frozen=True)
class WorkflowSamples:
    """One period's reading of the entry: per workflow, the arrival rate and the mean latency of
    the finished workflow requests, each a number or why there is none."""

    rates_rps: Mapping[str, float | Missing]
    latency_s: Mapping[str, float | Missing]
    queries: tuple[Answer, ...]

    @property
    def absent(self) -> bool:
        """No workflow has a series: the entry is not deployed, not scraped or saw no workflow request."""
        return all(isinstance(v, Missing) and v.reason == "no series" for v in self.rates_rps.values())


def read_workflows(client: PrometheusClient, workflows: list[str], down: Missing | None = None) -> WorkflowSamples:
    """The entry's arrival rate (workflow requests per second over the window, `stale` as the
    per-LLM rates) and mean latency per workflow; `down`: Prometheus did not answer this period
    (read_llms), so nothing is asked again."""
    settings = client.settings
    if down is not None:
        answer = Answer(workflow_rate_query(settings), missing=down)
        return WorkflowSamples(_per_name(answer, workflows, WORKFLOW_LABEL), _per_name(answer, workflows, WORKFLOW_LABEL), (answer,))
    rates = client.query(workflow_rate_query(settings))
    if rates.missing is not None:  # the entry's counter is not there: its latency is not either
        return WorkflowSamples(_per_name(rates, workflows, WORKFLOW_LABEL), _per_name(rates, workflows, WORKFLOW_LABEL), (rates,))
    fresh = client.query(workflow_freshness_query(settings))
    latency = client.query(workflow_latency_query(settings))
    rates_rps = _per_name(rates, workflows, WORKFLOW_LABEL)
    _stale(rates_rps, _per_name(fresh, workflows, WORKFLOW_LABEL), next((s.time_s for s in rates.samples), None), settings.max_age_s)
    return WorkflowSamples(rates_rps, _per_name(latency, workflows, WORKFLOW_LABEL), (rates, fresh, latency))
