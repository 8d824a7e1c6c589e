"""Shared fixtures: paths of the shipped instances and a writer for small instance files."""

from __future__ import annotations

import copy
import importlib.util
import os
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import settings

# CI replays the same examples on every run, so that a red CI names a change, not a draw; local runs
# keep drawing new examples (and keep the failures they find in .hypothesis/).
settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

REPO = Path(__file__).resolve().parents[1]
INSTANCES = REPO / "instances"
if str(REPO) not in sys.path:  # examples/ is not part of the package; its tests import it from here
    sys.path.insert(0, str(REPO))


def load_script(name: str, path: Path):
    """A script of the repository outside the package (bench/, instances/, tests/golden/) as a module."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


def profile_rows(gpu_type: str = "A6000", tps=(1, 2), fractions=(0.5, 1.0), light_s: float = 1.0, capacity_rps: float = 10.0):
    """A small, hand-checkable profile: latency light_s*(1 + r/T) at r = T/4, T/2, T, one unstable row."""
    rows = []
    for tp in tps:
        for fraction in fractions:
            cap = capacity_rps * tp * fraction
            light = light_s / tp
            for point in (0.25, 0.5, 1.0, 1.5):
                rate = point * cap
                latency = light * (1 + min(point, 1.0))
                rows.append(dict(gpu_type=gpu_type, tp=tp, fraction=fraction, arrival_rate=rate,
                                 throughput=min(rate, cap), latency_mean=latency, latency_p50=latency * 0.9,
                                 latency_p90=latency * 1.5, latency_p99=latency * 2))
    return pd.DataFrame(rows)


BASE_INSTANCE = {
    "cluster": {
        "fractions_per_gpu": 10,
        "gpu_types": {"A6000": {"memory_gib": 48}},
        "nodes": [{"name": "node", "count": 1, "gpu_type": "A6000", "gpus": 4, "nvlink_domains": [[0, 1], [2, 3]]}],
    },
    "llms": [
        {"name": "gen", "model": "m/gen", "weights_gib": 2.5, "min_kv_gib": 1.0, "tp_degrees": [1, 2], "profile": "gen.csv"},
        {"name": "ver", "model": "m/ver", "weights_gib": 16.0, "min_kv_gib": 2.0, "tp_degrees": [1, 2], "profile": "ver.csv"},
    ],
    "workflows": [
        {"name": "beam", "arrival_rate": 1.0, "stages": [
            {"llm": "gen", "invocations": 9.0, "parallelism": 3.0},
            {"llm": "ver", "invocations": 6.0, "parallelism": 2.0},
        ]}
    ],
}


@pytest.fixture
def write_instance(tmp_path):
    """write_instance(mutate=None, profiles=None) -> path of a valid instance (after `mutate(doc)`)."""

    def write(mutate=None, profiles=None, name="instance.yaml"):
        doc = copy.deepcopy(BASE_INSTANCE)
        if mutate is not None:
            mutate(doc)
        for llm_name, frame in (profiles or {"gen.csv": profile_rows(light_s=1.0, capacity_rps=20.0),
                                             "ver.csv": profile_rows(light_s=2.0, capacity_rps=8.0)}).items():
            frame.to_csv(tmp_path / llm_name, index=False)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path

    return write


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """vllm(name, count=1, cache_tokens=8192, **server_args) -> `count` real vLLM replicas of the tiny
    Llama served as `name` (tests/support/vllm_server.py), started side by side, each on a port of its
    own, ready when returned, stopped with the module; skips, naming the missing piece and the command
    that installs it, where vLLM cannot run. A failing test's report shows their logs' tails."""
    from contextlib import ExitStack

    from support import vllm_server

    reason = vllm_server.missing()
    folder = tmp_path_factory.mktemp("vllm")
    with ExitStack() as stack:
        def start(name: str, count: int = 1, cache_tokens: int = 8192, **server_args) -> list[vllm_server.VllmServer]:
            if reason:
                pytest.skip(reason)
            return stack.enter_context(vllm_server.vllm_replicas(name, count, cache_tokens, log_dir=folder,
                                                                 model_dir=folder / "tiny-llama", **server_args))

        yield start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and "support.vllm_server" in sys.modules:
        logs = sys.modules["support.vllm_server"].running_logs()
        if logs:
            report.sections.append(("vLLM server logs", logs))


# The longest test files (each a minute or more of the run on two cores), longest first: the
# workers start with them and the many short files fill the end of the run on all (pytest-xdist
# hands out files in collection order with --no-loadscope-reorder; by default it would start with the
# files that hold the most tests, and a long file of few tests would run alone at the end)
LONGEST_FILES = (
    "test_claims.py", "test_gateway_routing.py", "test_e2e_vllm.py", "test_control_live.py", "test_plan_readers.py",
    "test_typing.py", "test_otel_spans.py", "test_k8s_validate.py", "test_emulator.py", "test_fuzz.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
