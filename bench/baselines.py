"""Scepsy against per-LLM autoscaling, isolated per-LLM sizing and its own ablations (Fig. 6, 10).

    python bench/baselines.py instances/beam-4xa6000.yaml [--duration-s 400] [--systems ...] [--out-dir docs/figures]

Rates: fractions LOADS of the capacity of the scepsy plan at the instance's own rate (its
predicted max_throughput_rps), so that every curve runs from light load to past saturation.
Each (system, rate) is one simulation (`scepsy sweep` does the same: planner/studies/sweep.py). Writes
<out-dir>/<instance>-sweep.csv and .png and prints the comparison table (markdown).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from scepsy.models.simulation.autoscaler import HpaSettings
from scepsy.models.instance.instance import load_instance
from scepsy.models.simulation.simulator import SimulationSettings
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.studies.sweep import SweepSettings, compare, load_points, plot_sweep, sweep, write_sweep

LOADS = (0.1, 0.3, 0.5, 0.7, 0.9, 1.1, 1.3, 1.6, 2.0)
SYSTEMS = ("scepsy", "k8s-hpa", "per-llm", "scepsy-whole-gpus", "scepsy-tp1", "scepsy-whole-gpus-tp1")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("instance", type=Path)
    parser.add_argument("--duration-s", type=float, default=400.0)
    parser.add_argument("--warmup-s", type=float, default=100.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--out-dir", type=Path, default=Path("docs") / "figures")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG and table from the CSV")
    options = parser.parse_args()
    stem = options.instance.stem
    if options.replot:
        frame = pd.read_csv(options.out_dir / f"{stem}-sweep.csv")
        plot_sweep(frame, options.out_dir / f"{stem}-sweep.png", title=stem)
        _table(stem, frame)
        return
    instance = load_instance(options.instance)
    plan = make_plan(instance)
    capacity = min(w.max_throughput_rps / w.arrival_rate_rps for w in plan.prediction.workflows)
    points = load_points(instance, load_factors=[round(k * capacity, 4) for k in LOADS])
    settings = SweepSettings(
        SimulationSettings(duration_s=options.duration_s, warmup_s=options.warmup_s, seed=options.seed), HpaSettings()
    )
    start = time.perf_counter()
    frame = sweep(instance, points, options.systems.split(","), settings, progress=lambda text: print("#", text, flush=True))
    write_sweep(frame, options.out_dir / f"{stem}-sweep.csv")
    plot_sweep(frame, options.out_dir / f"{stem}-sweep.png", title=stem)
    print(f"# {stem}: {time.perf_counter() - start:.0f} s; scepsy capacity x{capacity:.3g} of the instance's rates")
    _table(stem, frame)


def _table(stem: str, frame: pd.DataFrame) -> None:
    print("\n| instance | workflow | baseline | peak throughput ratio | latency ratio at equal throughput (min / median / max) |")
    print("|---|---|---|---:|---|")
    for c in compare(frame):
        print(f"| {stem} | {c.workflow} | {c.baseline} | {c.peak_throughput_ratio:.2f}x | "
              f"{c.latency_ratio_min:.2f} / {c.latency_ratio_median:.2f} / {c.latency_ratio_max:.2f} |")


if __name__ == "__main__":
    main()
