"""Parallel branches across LLMs: the judge ensemble's prediction with and without the
critical-path share, against the simulator.

    python bench/ensemble_accuracy.py [--duration-s 300]

Plan instances/ensemble-4xa6000.yaml (three judges answer side by side, an aggregator follows),
keep the allocation, and at 10%..80% of its capacity compare the simulated mean workflow latency
with the pipeline's prediction: `old` sums every LLM's contribution as if serial (f = 1 for all),
`new` weights each by its traced critical-path share f (models/instance/statistic.py). The old plan
(planned with f = 1) is shown too: what the planner chose when it counted every judge in full.
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
    """The instance with every critical-path share 1 (the pipeline before the share)."""
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
            "old_s": predict(serial(loaded), plan.allocation).workflows[0].latency_s,
            "new_s": predict(loaded, plan.allocation).workflows[0].latency_s,
            "f_measured": {s.llm: round(s.critical_path, 3) for s in result.workflows[0].stages},
        })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=300.0)
    args = parser.parse_args()
    instance = load_instance(INSTANCE)
    new_plan, old_plan = make_plan(instance), make_plan(serial(instance))
    for name, plan in (("new", new_plan), ("old (f = 1)", old_plan)):
        shape = ", ".join(f"{c.llm} {c.share / 10:g}x{c.replicas}" for c in plan.allocation.llms)
        print(f"{name} plan: {shape}")
    rows = run(args.duration_s)
    print("\n| load | rate_rps | simulated_s | old_s | old error | new_s | new error |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        old = (r["old_s"] - r["simulated_s"]) / r["simulated_s"]
        new = (r["new_s"] - r["simulated_s"]) / r["simulated_s"]
        r.update(old_error=old, new_error=new)
        print(f"| {r['load']:.0%} | {r['rate_rps']:.3g} | {r['simulated_s']:.3f} | {r['old_s']:.3f} | {100 * old:+.1f}% | "
              f"{r['new_s']:.3f} | {100 * new:+.1f}% |")
    print(f"\nMAPE old: {100 * np.mean([abs(r['old_error']) for r in rows]):.1f}%, "
          f"new: {100 * np.mean([abs(r['new_error']) for r in rows]):.1f}%")
    print(f"critical-path shares measured at 80%: {rows[-1]['f_measured']}")


if __name__ == "__main__":
    main()
