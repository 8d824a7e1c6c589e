"""`scepsy profiles import`: vLLM and SGLang benchmark results of several versions."""

from __future__ import annotations

import json

import pytest

from scepsy.models.errors import InputError
from scepsy.tracing.profiling.benchimport import import_bench_results

# vllm bench serve (>= 0.5) with --percentile-metrics e2el --metric-percentiles 50,90,99
VLLM_NEW = {"date": "20250101-000000", "backend": "vllm", "model_id": "m", "num_prompts": 100, "request_rate": 2.0,
            "burstiness": 1.0, "max_concurrency": None, "duration": 50.2, "completed": 100, "failed": 0,
            "request_throughput": 1.99, "mean_e2el_ms": 1500.0, "median_e2el_ms": 1400.0, "std_e2el_ms": 300.0,
            "p50_e2el_ms": 1400.0, "p90_e2el_ms": 1900.0, "p99_e2el_ms": 2500.0, "mean_ttft_ms": 50.0}
# benchmark_serving.py of vLLM 0.4: typo'd throughput key, request latency percentiles in ms, no mean
VLLM_OLD = {"backend": "vllm", "request_rate": 4, "duration": 30.0, "completed": 100, "total_output_tokens": 12800,
            "request_inthroughput": 3.3, "median_request_latency": 2000.0, "p90_request_latency": 3000.0,
            "p99_request_latency": 4000.0, "mean_ttft_ms": 100.0, "mean_tpot_ms": 15.0}
SGLANG = {"backend": "sglang", "dataset_name": "random", "request_rate": 8.0, "max_concurrency": 256, "duration": 20.0,
          "completed": 160, "request_throughput": 7.9, "mean_e2e_latency_ms": 800.0, "median_e2e_latency_ms": 700.0,
          "std_e2e_latency_ms": 100.0, "p99_e2e_latency_ms": 1600.0, "concurrency": 6.3}


def test_vllm_and_sglang_versions(tmp_path):
    (tmp_path / "new.json").write_text(json.dumps(VLLM_NEW))
    (tmp_path / "old.json").write_text(json.dumps(VLLM_OLD))
    (tmp_path / "sg.jsonl").write_text(json.dumps(SGLANG) + "\n" + json.dumps({**SGLANG, "request_rate": "inf"}) + "\n")
    result = import_bench_results([tmp_path / "new.json", tmp_path / "old.json", tmp_path / "sg.jsonl"], "H100", 2, 0.5)
    rows = result.rows.set_index("arrival_rate")
    assert list(result.rows.columns)[:3] == ["gpu_type", "tp", "fraction"]
    assert [rows.at[2.0, c] for c in ("throughput", "latency_mean", "latency_p50", "latency_p90", "latency_p99")] == [1.99, 1.5, 1.4, 1.9, 2.5]
    # old vLLM: mean estimated from TTFT + TPOT x (128 - 1) = 100 + 1905 ms, p50/p90/p99 measured
    assert rows.at[4.0, "throughput"] == 3.3 and rows.at[4.0, "latency_mean"] == pytest.approx(2.005)
    assert rows.at[4.0, "latency_p90"] == 3.0
    # SGLang without p90: interpolated between p50 and p99 by rank (700 + 900 * 40 / 49 ms)
    assert rows.at[8.0, "latency_p90"] == pytest.approx((700 + 900 * 40 / 49) / 1000)
    assert any("latency_mean estimated" in n for n in result.notes) and any("p90 interpolated" in n for n in result.notes)
    # SGLang at request_rate inf with max_concurrency 256: a closed-loop point at its throughput
    closed = result.rows[result.rows["concurrency"].notna()]
    assert closed[["arrival_rate", "throughput", "concurrency"]].values.tolist() == [[7.9, 7.9, 256.0]]
    assert not result.skipped and any("closed-loop run at concurrency 256" in n for n in result.notes)
    assert set(result.rows["gpu_type"]) == {"H100"} and set(result.rows["tp"]) == {2}


def test_percentile_list_and_throughput_from_counts(tmp_path):
    result = {"request_rate": 1.0, "completed": 50, "duration": 100.0, "mean_e2el_ms": 10.0,
              "percentiles_e2el_ms": [[50, 9.0], [90, 12.0], [99, 20.0]]}
    (tmp_path / "r.json").write_text(json.dumps(result))
    row = import_bench_results([tmp_path / "r.json"], "A", 1, 1.0).rows.iloc[0]
    assert (row["throughput"], row["latency_p50"], row["latency_p90"], row["latency_p99"]) == (0.5, 0.009, 0.012, 0.02)


def test_missing_latency_is_a_clear_error(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"request_rate": 1.0, "request_throughput": 1.0}))
    with pytest.raises(InputError, match="mean_e2el_ms"):
        import_bench_results([tmp_path / "bad.json"], "A", 1, 1.0)
    (tmp_path / "inf.json").write_text(json.dumps({**VLLM_NEW, "request_rate": "inf"}))
    with pytest.raises(InputError, match="finite"):
        import_bench_results([tmp_path / "inf.json"], "A", 1, 1.0)
