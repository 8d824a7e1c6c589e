"""`scepsy profiles import` on real result files from public repositories (tests/fixtures/
bench_results/SOURCES.md): the default `vllm bench serve` result, --max-concurrency runs, a
`vllm bench sweep` directory, SGLang's bench_serving JSONL."""

from __future__ import annotations

import math
import shutil

import pytest

from conftest import REPO, profile_rows
from scepsy.models.errors import InputError
from scepsy.models.instance.instance import load_instance
from scepsy.models.instance.profile import load_profile, read_profile_table, write_profile
from scepsy.tracing.profiling.benchimport import import_bench_results

RESULTS = REPO / "tests" / "fixtures" / "bench_results"
SWEEP = RESULTS / "vllm_sweep_v0.25.1"
COMBINATION = SWEEP / "SERVE--max_num_seqs=4-BENCH--max_concurrency=2-num_prompts=8"


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
