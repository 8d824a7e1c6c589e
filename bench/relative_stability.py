"""The paper's Fig. 3 observation on simulated beam search: per-LLM relative time is more stable.

    python bench/relative_stability.py [--instance instances/beam-4xa6000.yaml] [--requests 500]

Runs the instance's beam search (its `program:`) on its scepsy plan at its own arrival rate until
`--requests` requests are measured, then reports for each LLM the coefficient of variation
(std / mean over requests) of its absolute time in a request (the union of its call intervals)
and of its relative share (that time over the sum of all LLMs' times), and their ratio.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

import numpy as np

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
    result = simulate(instance, plan.allocation, SimulationSettings(duration_s=duration, seed=options.seed),
                      record_calls=True)
    stats = result.workflow(workflow.name)
    times = {m: np.array(v) for m, v in stats.per_request_llm_time_s.items()}
    total = np.sum(list(times.values()), axis=0)  # per request, over the LLMs
    per_request = Counter((c["request"], c["llm"]) for c in result.calls)  # all requests, for the ranges
    print(f"{options.instance.name}: {stats.completed} requests measured (after {result.warmup_s:.0f} s), "
          f"rate {workflow.arrival_rate:g} requests/s, seed {options.seed}")
    print(f"time in LLMs per request: mean {total.mean():.2f} s, min {total.min():.2f} s, max {total.max():.2f} s\n")
    print("| llm | calls/request min-max | absolute mean_s | absolute CV | relative mean | relative CV | CV ratio |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for llm, absolute in times.items():
        relative = absolute / total
        cv_abs = absolute.std() / absolute.mean()
        cv_rel = relative.std() / relative.mean()
        counts = [n for (r, m), n in per_request.items() if m == llm]
        print(f"| {llm} | {min(counts)}-{max(counts)} | {absolute.mean():.3f} | {cv_abs:.2f} | {relative.mean():.3f} | "
              f"{cv_rel:.2f} | {cv_abs / cv_rel:.1f}x |")


if __name__ == "__main__":
    main()
