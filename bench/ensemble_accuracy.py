"""Parallel branches across LLMs: the judge ensemble's prediction with and without the
critical-path share, against the simulator.

    python bench/ensemble_accuracy.py [--duration-s 300]

Plan instances/ensemble-4xa6000.yaml (three judges answer side by side, an aggregator follows),
keep the allocation, and at 10%..80% of its capacity compare the simulated mean workflow latency
with the pipeline's prediction: `serial` sums every LLM's contribution as if serial (f = 1 for all),
`shared` weights each by its traced critical-path share f (models/instance/statistic.py). The serial
plan (planned with f = 1) is shown too: what the planner chooses when it counts every judge in full.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from scepsy.models.performance.alp import predict
from scepsy.models.instance.instance import load_instance
from scepsy.models.simulation.simulator import SimulationSettings, simulate
from scepsy.planner.allocation.planning import make_plan

ROOT = Path(__file__).resolve().parent.parent
INSTANCE = ROOT / "instances" / "ensemble-4xa6000.yaml"
LOADS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)


def serial(instance):
    """The instance with every critical-path share 1 (every LLM counted as if serial)."""
    return replace(instance, workflows=tuple(
        replace(w, stages=tuple(replace(s, critical_path=1.0) for s in w.stages)) for w in instance.workflows
    ))


def run(duration_s: float) -> list[dict]:
    instance = load_instance(INSTANCE)
    plan = make_plan(instance)
    capacity = min(w.max_throughput_rps / w.arrival_rate_rps for w in plan.prediction.workflows)
    rows = []
    for load in LOADS:
        loaded = instance.scaled(load * capacity)
        result = simulate(loaded, plan.allocation, SimulationSettings(duration_s=duration_s, seed=0))
        simulated = result.workflows[0].latency_mean_s
        rows.append({
            "load": load, "rate_rps": loaded.workflows[0].arrival_rate, "simulated_s": simulated,
            "serial_s": predict(serial(loaded), plan.allocation).workflows[0].latency_s,
            "shared_s": predict(loaded, plan.allocation).workflows[0].latency_s,
            "f_measured": {s.llm: round(s.critical_path, 3) for s in result.workflows[0].stages},
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=300.0)
    args = parser.parse_args()
    instance = load_instance(INSTANCE)
    shared_plan, serial_plan = make_plan(instance), make_plan(serial(instance))
    for name, plan in (("shared", shared_plan), ("serial (f = 1)", serial_plan)):
        shape = ", ".join(f"{c.llm} {c.share / 10:g}x{c.replicas}" for c in plan.allocation.llms)
        print(f"{name} plan: {shape}")
    rows = run(args.duration_s)
    print("\n| load | rate_rps | simulated_s | serial_s | serial error | shared_s | shared error |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        serial_error = (r["serial_s"] - r["simulated_s"]) / r["simulated_s"]
        shared_error = (r["shared_s"] - r["simulated_s"]) / r["simulated_s"]
        r.update(serial_error=serial_error, shared_error=shared_error)
        print(f"| {r['load']:.0%} | {r['rate_rps']:.3g} | {r['simulated_s']:.3f} | {r['serial_s']:.3f} | {100 * serial_error:+.1f}% | "
              f"{r['shared_s']:.3f} | {100 * shared_error:+.1f}% |")
    print(f"\nMAPE serial: {100 * np.mean([abs(r['serial_error']) for r in rows]):.1f}%, "
          f"shared: {100 * np.mean([abs(r['shared_error']) for r in rows]):.1f}%")
    print(f"critical-path shares measured at 80%: {rows[-1]['f_measured']}")


if __name__ == "__main__":
    main()
