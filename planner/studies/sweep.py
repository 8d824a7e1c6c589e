"""Throughput-latency sweeps of scepsy and baselines on the simulator (the paper's Fig. 6 and 10).

For every load point and system: build the system's deployment for that load (planners see the
load; the autoscaler reacts to it), simulate the workflows, and record one tidy row per workflow:

    system, load_factor, workflow, offered_rate_rps, throughput_rps, latency_mean_s, latency_p50_s,
    latency_p90_s, latency_p99_s, completed, unfinished, gpus_mean, planned_load, predicted_latency_s

`compare` turns the rows into the paper's two numbers per baseline: the ratio of peak achieved
throughputs (scepsy / baseline) and the ratio of mean latencies at equal throughput (baseline /
scepsy; both curves interpolated in achieved throughput over the range both reach).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import pandas as pd

from scepsy.models.simulation.autoscaler import HpaSettings
from scepsy.models.errors import InfeasibleError, InputError
from scepsy.models.instance.instance import Instance
from scepsy.models.simulation.simulator import SimulationSettings, simulate

from scepsy.planner.studies.baselines import deployment

SWEEP_COLUMNS = (
    "system", "load_factor", "workflow", "offered_rate_rps", "throughput_rps", "latency_mean_s", "latency_p50_s",
    "latency_p90_s", "latency_p99_s", "completed", "unfinished", "gpus_mean", "planned_load", "predicted_latency_s",
)


@dataclass(frozen=True)
class SweepSettings:
    simulation: SimulationSettings = SimulationSettings()
    hpa: HpaSettings = HpaSettings()
    plan_time_limit_s: float = 30.0
    static_path: Path | None = None


def load_points(instance: Instance, rates: Sequence[float] | None = None,
                load_factors: Sequence[float] | None = None) -> list[tuple[float, Instance]]:
    """(load factor, instance at that load): `rates` give every workflow that rate (requests/s);
    `load_factors` multiply the instance's own rates; exactly one of them is given."""
    if (rates is None) == (load_factors is None):
        raise InputError(None, "rates", "give exactly one of `rates` and `load_factors`", "e.g. `rates` 1,2,4")
    if rates is not None:
        base = instance.workflows[0].arrival_rate
        return [(r / base, instance.with_arrival_rates({w.name: r for w in instance.workflows})) for r in rates]
    assert load_factors is not None
    return [(k, instance.scaled(k)) for k in load_factors]


def sweep(instance: Instance, points: Sequence[tuple[float, Instance]], systems: Sequence[str],
          settings: SweepSettings = SweepSettings(), progress: Callable[[str], None] | None = None) -> pd.DataFrame:
    rows = []
    for system in systems:
        for factor, loaded in points:
            try:
                dep = deployment(system, loaded, static_path=settings.static_path, hpa=settings.hpa,
                                 time_limit_s=settings.plan_time_limit_s)
            except InfeasibleError as exc:
                if progress:
                    progress(f"{system} x{factor:g}: infeasible ({exc})")
                continue
            result = simulate(loaded, dep.allocation, settings.simulation, controller=dep.controller)
            for stats in result.workflows:
                rows.append({
                    "system": system,
                    "load_factor": factor,
                    "workflow": stats.name,
                    "offered_rate_rps": stats.offered_rate_rps,
                    "throughput_rps": stats.throughput_rps,
                    "latency_mean_s": stats.latency_mean_s,
                    "latency_p50_s": stats.latency_p50_s,
                    "latency_p90_s": stats.latency_p90_s,
                    "latency_p99_s": stats.latency_p99_s,
                    "completed": stats.completed,
                    "unfinished": stats.unfinished,
                    "gpus_mean": result.gpus_mean,
                    "planned_load": dep.planned_load,
                    "predicted_latency_s": dep.predicted_latency_s.get(stats.name, math.nan),
                })
            if progress:
                progress(f"{system} x{factor:g}")
    frame = pd.DataFrame(rows, columns=list(SWEEP_COLUMNS))
    return frame.sort_values(["workflow", "system", "load_factor"], kind="stable").reset_index(drop=True)


def write_sweep(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(path, index=False, float_format="%.6g", lineterminator="\n")


def plot_sweep(frame: pd.DataFrame, path: Path, title: str = "") -> None:
    """Throughput (x) against mean latency (y), one line per system up to its peak throughput
    (points past it, where more load gives less throughput, are crosses), one panel per workflow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workflows = sorted(frame["workflow"].unique())
    fig, axes = plt.subplots(1, max(len(workflows), 1), figsize=(5.5 * max(len(workflows), 1), 4.2), squeeze=False)
    for ax, workflow in zip(axes[0], workflows):
        part = frame[frame["workflow"] == workflow]
        for system in sorted(part["system"].unique()):
            points = part[part["system"] == system].sort_values("load_factor")
            xs, ys = _curve(points)
            line = ax.plot(xs, ys, "-o" if system == "scepsy" else "--.", label=system, markersize=4)[0]
            past = points.iloc[len(xs):]  # past the peak: more load, less throughput (overloaded)
            ax.plot(past["throughput_rps"], past["latency_mean_s"], "x", color=line.get_color(), markersize=5)
        ax.set_xlabel("throughput (requests/s)")
        ax.set_ylabel("mean latency (s)")
        ax.set_yscale("log")
        ax.set_title(f"{title} {workflow}".strip())
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


@dataclass(frozen=True)
class Comparison:
    workflow: str
    baseline: str
    peak_throughput_ratio: float  # scepsy peak / baseline peak
    latency_ratio_min: float  # baseline / scepsy mean latency at equal throughput
    latency_ratio_median: float
    latency_ratio_max: float
    overlap_rps: tuple[float, float]  # the throughput range both curves reach

    def to_json(self) -> dict:
        def num(value: float) -> float | None:
            return float(f"{value:.6g}") if math.isfinite(value) else None

        return {
            "workflow": self.workflow,
            "baseline": self.baseline,
            "peak_throughput_ratio": num(self.peak_throughput_ratio),
            "latency_ratio_min": num(self.latency_ratio_min),
            "latency_ratio_median": num(self.latency_ratio_median),
            "latency_ratio_max": num(self.latency_ratio_max),
        }


def _curve(part: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """Achieved throughput (increasing) and mean latency, keeping the rising part of the curve."""
    part = part.sort_values("load_factor")
    xs: list[float] = []
    ys: list[float] = []
    for x, y in zip(part["throughput_rps"], part["latency_mean_s"]):
        if not math.isfinite(y):
            continue
        if xs and x <= xs[-1]:
            break  # past the peak: throughput no longer rises with load
        xs.append(x)
        ys.append(y)
    return np.array(xs), np.array(ys)


def compare(frame: pd.DataFrame, reference: str = "scepsy") -> list[Comparison]:
    out = []
    for workflow in sorted(frame["workflow"].unique()):
        part = frame[frame["workflow"] == workflow]
        ref = part[part["system"] == reference]
        if ref.empty:
            continue
        ref_x, ref_y = _curve(ref)
        ref_peak = ref["throughput_rps"].max()
        for system in sorted(set(part["system"]) - {reference}):
            other = part[part["system"] == system]
            x, y = _curve(other)
            lo, hi = max(ref_x.min(initial=math.inf), x.min(initial=math.inf)), min(ref_x.max(initial=0), x.max(initial=0))
            ratios = np.array([])
            if len(ref_x) >= 2 and len(x) >= 2 and hi > lo:
                grid = np.linspace(lo, hi, 25)
                ratios = np.interp(grid, x, y) / np.interp(grid, ref_x, ref_y)
            out.append(Comparison(
                workflow=workflow,
                baseline=system,
                peak_throughput_ratio=float(ref_peak / other["throughput_rps"].max()),
                latency_ratio_min=float(ratios.min()) if ratios.size else math.nan,
                latency_ratio_median=float(np.median(ratios)) if ratios.size else math.nan,
                latency_ratio_max=float(ratios.max()) if ratios.size else math.nan,
                overlap_rps=(float(lo), float(hi)) if ratios.size else (math.nan, math.nan),
            ))
    return out
