"""Prediction accuracy: the Aggregate LLM Pipeline against the workflow simulator.

    python bench/prediction_accuracy.py [--duration-s 600] [--out docs/prediction-accuracy.csv]

For every shipped instance: plan it at its own rates (scepsy plan, CP-SAT), keep that allocation,
and for load fractions 10%..80% of the plan's capacity (the largest load factor its prediction
allows, min over workflows of max_throughput_rps / arrival_rate) compare the predicted mean
workflow latency (models/performance/alp.py) with the simulated one (models/simulation/simulator.py, seed 0).
Prints a markdown table per instance and the mean absolute percentage error (MAPE) overall.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd

from scepsy.models.performance.alp import predict
from scepsy.models.instance.instance import load_instance
from scepsy.models.simulation.simulator import SimulationSettings, simulate
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.allocation.planning import make_plan

ROOT = Path(__file__).resolve().parent.parent
INSTANCES = sorted((ROOT / "instances").glob("*.yaml"))
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def run(path: Path, duration_s: float, seed: int) -> list[dict]:
    instance = load_instance(path)
    plan = make_plan(instance, PlanSettings())
    capacity = min(w.max_throughput_rps / w.arrival_rate_rps for w in plan.prediction.workflows)
    rows = []
    for fraction in FRACTIONS:
        loaded = instance.scaled(fraction * capacity)
        prediction = predict(loaded, plan.allocation)
        result = simulate(loaded, plan.allocation, SimulationSettings(duration_s=duration_s, seed=seed))
        for w in result.workflows:
            predicted = prediction.workflow(w.name).latency_s
            rows.append({
                "instance": path.stem,
                "workflow": w.name,
                "load_fraction": fraction,
                "rate_rps": w.offered_rate_rps,
                "predicted_latency_s": predicted,
                "simulated_latency_s": w.latency_mean_s,
                "error": (predicted - w.latency_mean_s) / w.latency_mean_s,
                "throughput_rps": w.throughput_rps,
                "completed": w.completed,
                **{f"n_{s.llm}": s.invocations for s in w.stages},
                **{f"p_{s.llm}": s.parallelism for s in w.stages},
            })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--duration-s", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args()
    rows = []
    for path in INSTANCES:
        start = time.perf_counter()
        rows += run(path, options.duration_s, options.seed)
        print(f"# {path.stem}: {time.perf_counter() - start:.1f} s")
    frame = pd.DataFrame(rows)
    if options.out:
        frame.to_csv(options.out, index=False, float_format="%.6g", lineterminator="\n")
    print("\n| instance | workflow | load | rate_rps | predicted_s | simulated_s | error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['instance']} | {r['workflow']} | {r['load_fraction']:.0%} | {r['rate_rps']:.3g} | "
              f"{r['predicted_latency_s']:.3f} | {r['simulated_latency_s']:.3f} | {100 * r['error']:+.1f}% |")
    print("\n| instance | workflow | MAPE |")
    print("|---|---|---:|")
    for (inst, wf), part in frame.groupby(["instance", "workflow"], sort=True):
        print(f"| {inst} | {wf} | {100 * part['error'].abs().mean():.1f}% |")
    print(f"\noverall MAPE: {100 * frame['error'].abs().mean():.1f}% over {len(frame)} points")


if __name__ == "__main__":
    main()
