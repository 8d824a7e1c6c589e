"""What-if grids: parsing, cluster resizing, one row per point and LLM, parallel = serial."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest

from scepsy.models.errors import InputError
from scepsy.models.instance.instance import load_instance
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.studies.whatif import Point, cheapest_clusters, parse_clusters, parse_rates, point_instance, run_grid

from conftest import INSTANCES

BEAM = INSTANCES / "beam-4xa6000.yaml"


def test_rate_ranges_are_inclusive():
    assert parse_rates("1:20:1") == [float(r) for r in range(1, 21)]
    assert parse_rates("0.5:1.5:0.5") == [0.5, 1.0, 1.5]
    assert parse_rates("2,5,7.5") == [2.0, 5.0, 7.5]
    for bad in ("1:5:0", "a:b:c", "0,1", ""):
        with pytest.raises(InputError):
            parse_rates(bad)
    assert parse_clusters("16,4,8,4") == [4, 8, 16]


def test_cluster_sizes_are_whole_nodes():
    instance = load_instance(BEAM)
    bigger = instance.with_cluster_size(12)
    assert [n.name for n in bigger.cluster.nodes] == ["a6000-0", "a6000-1", "a6000-2"]
    assert bigger.cluster.nodes[0].domains == ((0, 1), (2, 3))
    with pytest.raises(InputError):
        instance.with_cluster_size(6)


def test_total_rate_keeps_the_mix():
    instance = load_instance(INSTANCES / "combined-8xh100.yaml")
    scaled = instance.with_total_rate(30.0)
    rates = [w.arrival_rate for w in scaled.workflows]
    assert sum(rates) == pytest.approx(30.0) and rates[0] / rates[1] == pytest.approx(20.0 / 40.0)


def test_grid_rows_match_single_plans():
    instance = load_instance(BEAM)
    frame = run_grid(instance, [2.0, 30.0], [4, 8], PlanSettings())
    assert len(frame) == 2 * 2 * len(instance.llms)
    assert list(frame.columns[:3]) == ["rate_rps", "cluster_gpus", "feasible"]
    infeasible = frame[(frame.rate_rps == 30.0) & (frame.cluster_gpus == 4)]
    assert not infeasible.feasible.any() and infeasible.reason.str.contains("throughput").all()
    row = frame[(frame.rate_rps == 2.0) & (frame.cluster_gpus == 8) & (frame.llm == "gen")].iloc[0]
    plan = make_plan(point_instance(instance, Point(2.0, 8)))
    assert row.workflow_latency_s == pytest.approx(plan.objective_value)
    assert row.replicas == plan.allocation.of("gen").replicas
    best = cheapest_clusters(frame)
    assert dict(zip(best.rate_rps, best.cluster_gpus)) == {2.0: 4, 30.0: 8}


def test_parallel_grid_equals_serial(tmp_path):
    instance = load_instance(BEAM)
    serial = run_grid(instance, [3.0, 6.0], [4, 8], PlanSettings())
    parallel = run_grid(instance, [3.0, 6.0], [4, 8], PlanSettings(), workers=2)
    columns = [c for c in serial.columns if c != "wall_time_s"]
    pd.testing.assert_frame_equal(serial[columns], parallel[columns])


def test_whatif_command_writes_table_and_plots(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "scepsy", "whatif", str(BEAM), "--rates", "2:6:4", "--clusters", "4,8",
         "--out", str(tmp_path / "grid.parquet"), "--plots", str(tmp_path / "plots")],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "cluster_gpus" in result.stdout
    table = pd.read_parquet(tmp_path / "grid.parquet")
    assert len(table) == 2 * 2 * 2
    for name in ("latency_vs_rate.png", "gpus_per_llm.png", "cheapest_cluster.png"):
        assert (tmp_path / "plots" / name).stat().st_size > 1000
    bad = subprocess.run([sys.executable, "-m", "scepsy", "whatif", str(BEAM), "--rates", "1:x", "--clusters", "4"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "--rates" in bad.stderr


# ---------------------------------------------------------------------------------------------
# Capacity-study axes (planner/studies/scenarios.py) and the table's derived columns

from dataclasses import replace  # noqa: E402

from scepsy.models.instance.instance import Node  # noqa: E402
from scepsy.planner.studies.scenarios import Axes, scenarios  # noqa: E402
from scepsy.planner.studies.whatif import forecast_table, frontier, run_study, write_table  # noqa: E402

COMBINED = INSTANCES / "combined-8xh100.yaml"


def test_per_workflow_rates_are_a_product_with_the_last_one_fastest():
    instance = load_instance(COMBINED)
    every = scenarios(instance, Axes(workflow_rates={"rag": [2.0, 4.0, 6.0]}, clusters=[8, 16]))
    assert len(every) == 6
    assert [dict(s.rates) for s in every[:3]] == [{"beam": 20.0, "rag": r} for r in (2.0, 4.0, 6.0)]
    both = scenarios(instance, Axes(workflow_rates={"beam": [1.0, 2.0], "rag": [3.0, 4.0]}, clusters=[8]))
    assert [tuple(r for _, r in s.rates) for s in both] == [(1.0, 3.0), (1.0, 4.0), (2.0, 3.0), (2.0, 4.0)]
    with pytest.raises(InputError, match="^rates: both `rates` and `rate` given"):
        scenarios(instance, Axes(total_rates=[1.0], workflow_rates={"rag": [1.0]}))


def test_mixes_build_clusters_of_the_named_gpu_types():
    beam = load_instance(BEAM)
    h100 = load_instance(COMBINED).cluster.gpu_types["H100"]
    cluster = replace(beam.cluster, gpu_types={**beam.cluster.gpu_types, "H100": h100},
                      nodes=beam.cluster.nodes + (Node("h100", "H100", 4, ((0, 1, 2, 3),)),))
    mixed = replace(beam, cluster=cluster)
    every = scenarios(mixed, Axes(clusters=[8], mixes=["A6000", "H100", "A6000+H100"]))
    types = [sorted(n.gpu_type for n in s.instance(mixed).cluster.nodes) for s in every]
    assert types == [["A6000", "A6000"], ["H100", "H100"], ["A6000", "H100"]]
    with pytest.raises(InputError, match=": mix: .B200. names GPU types without nodes"):
        scenarios(mixed, Axes(mixes=["B200"]))


def test_forecast_runs_out_and_prices_give_cost_per_thousand_requests(tmp_path):
    """beam on 4 and 8 A6000s, 3 req/s growing 40% a month: each cluster runs out in the month
    its first infeasible scenario is; two prices share the plans and scale the cost."""
    instance = load_instance(BEAM)
    axes = Axes(clusters=[4, 8], growth_per_month=0.4, months=8, prices={"A6000": [1.0, 2.0]})
    frame = run_study(instance, axes, PlanSettings())
    points = frame.drop_duplicates("scenario")
    assert sorted(points["month"].unique()) == list(range(9))
    assert points["rate_beam_rps"].tolist()[:3] == pytest.approx([3.0, 4.2, 5.88])
    forecast = forecast_table(frame)
    for _, row in forecast.iterrows():
        mine = points[(points.cluster_gpus == row.cluster_gpus) & (points.price_A6000_per_gpu_hour == 1.0)]
        first_infeasible = mine[~mine.feasible]["month"].min()
        assert row.runs_out_month == first_infeasible
    assert forecast.set_index("cluster_gpus")["runs_out_month"][4] < forecast.set_index("cluster_gpus")["runs_out_month"][8]
    feasible = points[points.feasible]
    cheap, dear = (feasible[feasible.price_A6000_per_gpu_hour == p].reset_index() for p in (1.0, 2.0))
    assert (cheap["objective_value"] == dear["objective_value"]).all()
    assert dear["cost_per_1k_requests"].tolist() == pytest.approx((2 * cheap["cost_per_1k_requests"]).tolist())
    row = cheap.iloc[0]
    assert row.cost_per_1k_requests == pytest.approx(row.gpus_used * 1.0 / (3.6 * row.rate_rps))
    write_table(frame, tmp_path / "study.csv")
    assert pd.read_csv(tmp_path / "study.csv").shape == frame.shape


def test_replicas_moved_between_neighbouring_rates():
    instance = load_instance(BEAM)
    frame = run_study(instance, Axes(total_rates=[1.0, 3.0, 6.0], clusters=[8]), PlanSettings())
    for llm, rows in frame.groupby("llm"):
        rows = rows.sort_values("rate_rps").reset_index()
        assert rows["replicas_moved"].isna().iloc[0]  # the first rate has no neighbour below
        for k in (1, 2):
            before, after = rows.iloc[k - 1].to_dict(), rows.iloc[k].to_dict()
            same = (before["gpu_type"], before["tp"], before["fraction"]) == (after["gpu_type"], after["tp"], after["fraction"])
            expected = abs(after["replicas"] - before["replicas"]) if same else after["replicas"] + before["replicas"]
            assert after["replicas_moved"] == expected
    totals = frame.groupby("scenario")[["replicas_moved", "replicas_moved_total"]].agg({"replicas_moved": "sum", "replicas_moved_total": "first"})
    assert (totals["replicas_moved"].iloc[1:] == totals["replicas_moved_total"].iloc[1:]).all()


def test_frontier_keeps_the_scenarios_nothing_beats():
    instance = load_instance(BEAM)
    frame = run_study(instance, Axes(total_rates=[2.0], clusters=[4, 8, 12]), PlanSettings())
    front = frontier(frame)
    points = frame.drop_duplicates("scenario")
    for _, row in points.iterrows():
        dominated = ((front.cluster_gpus <= row.cluster_gpus) & (front.workflow_latency_s <= row.workflow_latency_s)).any()
        assert dominated
    assert front["workflow_latency_s"].is_monotonic_decreasing


def test_a_scenario_that_fails_keeps_its_rows_with_the_reason():
    frame = run_study(load_instance(BEAM), Axes(total_rates=[1.0, 2.0], clusters=[4]), PlanSettings(backend="nope"))
    assert len(frame) == 2 * 2 and (frame.status == "error").all() and frame.reason.str.contains("backend").all()


def test_whatif_command_axes_and_bad_input(tmp_path):
    out = tmp_path / "fig9.csv"
    result = subprocess.run(
        [sys.executable, "-m", "scepsy", "whatif", str(COMBINED), "--rate", "beam=5", "--rate", "rag=2,4",
         "--clusters", "64", "--out", str(out), "--plots", str(tmp_path / "plots")],
        capture_output=True, text=True,
    )
    assert result.returncode == 0, result.stderr
    table = pd.read_csv(out)
    assert set(table.rate_beam_rps) == {5.0} and set(table.rate_rag_rps) == {2.0, 4.0}
    assert (tmp_path / "plots" / "frontier.png").stat().st_size > 1000
    for args, option in ((["--rate", "nope=1"], "--rate"), (["--mix", "B200"], "--mix"), (["--months", "3"], "--months"),
                         (["--executor", "ray"], "--executor"), (["--price", "H100=x"], "--price")):
        bad = subprocess.run([sys.executable, "-m", "scepsy", "whatif", str(COMBINED), "--clusters", "8", *args],
                             capture_output=True, text=True)
        assert bad.returncode == 2 and option in bad.stderr and "Traceback" not in bad.stderr, (args, bad.stderr)
