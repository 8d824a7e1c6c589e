"""The paper's Fig. 3 observation on simulated beam search: per-LLM relative time is more stable.

    python bench/relative_stability.py [--instance instances/beam-4xa6000.yaml] [--requests 500]

Runs the instance's beam search (its `program:`) on its scepsy plan at its own arrival rate until
`--requests` requests are measured, then reports for each LLM the coefficient of variation
(std / mean over requests) of its absolute time in a request (the union of its call intervals)
and of its relative share (that time over the sum of all LLMs' times), and their ratio.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from scepsy.models.instance.instance import load_instance
from scepsy.models.simulation.simulator import SimulationSettings, simulate
from scepsy.planner.allocation.planning import make_plan

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", type=Path, default=ROOT / "instances" / "beam-4xa6000.yaml")
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    options = parser.parse_args()
    instance = load_instance(options.instance)
    workflow = instance.workflows[0]
    plan = make_plan(instance)
    duration = options.requests / workflow.arrival_rate / 0.9  # the first 10% is warm-up
    result = simulate(instance, plan.allocation, SimulationSettings(duration_s=duration, seed=options.seed))
    stats = result.workflow(workflow.name)
    total = stats.llm_time_s  # streamed moments over the measured requests (models/instance/streamed.py)
    print(f"{options.instance.name}: {stats.completed} requests measured (after {result.warmup_s:.0f} s), "
          f"rate {workflow.arrival_rate:g} requests/s, seed {options.seed}")
    print(f"time in LLMs per request: mean {total.mean:.2f} s, min {total.minimum:.2f} s, max {total.maximum:.2f} s\n")
    print("| llm | calls/request min-max | absolute mean_s | absolute CV | relative mean | relative CV | CV ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for llm, spread in stats.spread.items():
        absolute, relative, calls = spread.llm_time_s, spread.time_share, spread.calls
        print(f"| {llm} | {calls.minimum:.0f}-{calls.maximum:.0f} | {absolute.mean:.3f} | {absolute.cv:.2f} | "
              f"{relative.mean:.3f} | {relative.cv:.2f} | {absolute.cv / relative.cv:.1f}x |")

if __name__ == "__main__":
    main()
