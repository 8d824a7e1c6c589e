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
