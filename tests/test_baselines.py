"""Baselines, ablations and sweeps on the simulator."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from scepsy.cli import app
from scepsy.models.errors import InfeasibleError, InputError
from scepsy.models.instance.instance import load_instance
from scepsy.models.simulation.simulator import SimulationSettings
from scepsy.planner.studies.baselines import deployment, per_llm_allocation, plan_deployment
from scepsy.placement.feasibility.placeability import check_placement
from scepsy.planner.studies.sweep import SWEEP_COLUMNS, SweepSettings, compare, load_points, plot_sweep, sweep

INSTANCES = Path(__file__).resolve().parent.parent / "instances"


@pytest.mark.parametrize("name", ["rag-4xa6000.yaml", "beam-8xa6000.yaml", "combined-8xh100.yaml"])
def test_per_llm_uses_whole_gpus_smallest_tp_and_all_gpus(name):
    instance = load_instance(INSTANCES / name)
    allocation = per_llm_allocation(instance)
    f = instance.cluster.fractions_per_gpu
    assert all(c.share == f and c.replicas >= 1 for c in allocation.llms)
    assert all(c.tp == 1 for c in allocation.llms)  # every shipped model fits one GPU
    assert allocation.gpus() == instance.cluster.gpu_count()
    assert check_placement(instance.cluster, allocation).placeable


def test_per_llm_gives_spare_gpus_to_the_busiest_llm():
    instance = load_instance(INSTANCES / "rag-8xa6000.yaml")
    allocation = per_llm_allocation(instance)
    assert allocation.of("rag-gen").replicas == 6 and allocation.of("embed").replicas == 1


def test_per_llm_needs_a_gpu_per_llm():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml")
    three_llms_two_gpus = instance.cluster.__class__(
        instance.cluster.fractions_per_gpu, instance.cluster.gpu_types,
        (instance.cluster.nodes[0].__class__("a", "A6000", 2, ((0, 1),)),),
    )
    small = instance.__class__(three_llms_two_gpus, instance.llms, instance.workflows)
    with pytest.raises(InfeasibleError, match="one replica of every llm"):
        per_llm_allocation(small)


def test_ablations_restrict_the_plan():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml")
    f = instance.cluster.fractions_per_gpu
    whole = deployment("scepsy-whole-gpus", instance).allocation
    assert all(c.share == f for c in whole.llms)
    tp1 = deployment("scepsy-tp1", instance).allocation
    assert all(c.tp == 1 for c in tp1.llms)
    both = deployment("scepsy-whole-gpus-tp1", instance).allocation
    assert all(c.share == f and c.tp == 1 for c in both.llms)


def test_overloaded_scepsy_plans_for_the_largest_feasible_load():
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml").with_arrival_rates({"beam": 60.0})
    dep = plan_deployment(instance)
    assert 0 < dep.planned_load < 1 and "overloaded" in dep.note


def test_unknown_system_and_missing_static_file():
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml")
    with pytest.raises(InputError, match="unknown system"):
        deployment("magic", instance)
    with pytest.raises(InputError, match="allocation file"):
        deployment("static", instance)


def test_sweep_rows_plot_and_comparison(tmp_path):
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml")
    points = load_points(instance, rates=[4.0, 12.0, 20.0])
    settings = SweepSettings(SimulationSettings(duration_s=60.0, seed=0))
    frame = sweep(instance, points, ["scepsy", "per-llm"], settings)
    assert list(frame.columns) == list(SWEEP_COLUMNS) and len(frame) == 6
    scepsy = frame[frame["system"] == "scepsy"]
    assert scepsy["predicted_latency_s"].notna().all()
    assert (frame["gpus_mean"] <= 4.0 + 1e-9).all()
    plot_sweep(frame, tmp_path / "sweep.png")
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    (comparison,) = compare(frame)
    assert comparison.baseline == "per-llm" and comparison.peak_throughput_ratio > 0
    assert math.isfinite(comparison.latency_ratio_median)


def test_cli_sweep_writes_csv_and_png(tmp_path):
    runner = CliRunner()
    csv, png = tmp_path / "s.csv", tmp_path / "s.png"
    result = runner.invoke(app, ["sweep", str(INSTANCES / "beam-4xa6000.yaml"), "--rates", "1,3", "--baselines",
                                 "scepsy-tp1", "--duration-s", "40", "--out-csv", str(csv), "--out-png", str(png), "--json"])
    assert result.exit_code == 0, result.output
    assert set(pd.read_csv(csv)["system"]) == {"scepsy", "scepsy-tp1"} and png.is_file()
    assert json.loads(result.output)["comparisons"][0]["baseline"] == "scepsy-tp1"
    bad = runner.invoke(app, ["sweep", str(INSTANCES / "beam-4xa6000.yaml"), "--rates", "1", "--baselines", "ayo"])
    assert bad.exit_code == 2 and "unknown system" in bad.output
    neither = runner.invoke(app, ["sweep", str(INSTANCES / "beam-4xa6000.yaml")])
    assert neither.exit_code == 2
