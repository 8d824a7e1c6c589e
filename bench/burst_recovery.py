"""Recovery after a burst, per shipped instance and engine scheduling policy.

    python bench/burst_recovery.py --all
    python bench/burst_recovery.py instances/beam-4xa6000.yaml --policies fcfs,priority
    python bench/burst_recovery.py instances/beam-4xa6000.yaml --grid --policies priority

Each instance is planned (its own objective); every workflow is loaded at the recovery limit the
plan prints for it (`recovery_limit_rps`, models/performance/recovery.py; `--base` gives a share of
the claim instead) before and after the burst, with `--height` x the `max_throughput_rps` the plan
claims for it for `--length-s` from 60 s
(planner/studies/bursts.py), against the same arrivals without the burst. A row is recovered when,
in the five minutes that open five minutes after the burst's end, at least 97% of the reference
run's rate is served and the mean latency is within 25% of the reference's; `recovery_s` is the
time from the burst's end to the first minute from which every minute's arrivals are served within
25% of the reference latency. `--grid` varies the burst's height and length and the load after it.
`--entry` holds each LLM's calls beyond the plan's `entry_limit` at the workflow entry
(models/simulation/entry.py), as `scepsy proxy --max-in-flight` does. `--preemption-threshold T`
runs SGLang's priority preemption (a waiting call that does not fit preempts running calls whose
tag is more than T seconds newer; models/performance/replica.py) in place of vLLM's scheduler.
Deterministic (seeded simulations).
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from scepsy.models.instance.instance import load_instance
from scepsy.models.simulation.simulator import SimulationSettings
from scepsy.planner.allocation.planning import make_plan
from scepsy.models.performance.recovery import STANDARD_BURST, Burst
from scepsy.planner.studies.bursts import plan_burst, recovery

ROOT = Path(__file__).resolve().parent.parent
GRID_HEIGHTS = (1.5, 2.0)
GRID_LENGTHS_S = (60.0, 120.0, 300.0)
GRID_BASES = (0.8, 0.9)


def rows(path: Path, policies: list[str], bursts: list[Burst | None], seed: int, entry: bool = False,
         preemption_threshold: float | None = None) -> list[dict]:
    """One row per burst, policy and workflow; a burst None is the standard one from the plan's
    recovery limit (the smallest share of the claim over the workflows, all scaled together)."""
    instance = load_instance(path)
    plan = make_plan(instance)
    rates = {w.name: w.max_throughput_rps for w in plan.prediction.workflows}
    entry_limits = {m.llm: m.entry_limit for m in plan.prediction.llms if m.entry_limit is not None} if entry else None
    out = []
    for burst in (plan_burst(plan.prediction) if b is None else b for b in bursts):
        for policy in policies:
            for r in recovery(instance, plan.allocation, rates, burst, seed, policy, entry_limits,
                              preemption_threshold=preemption_threshold):
                label = policy + ("+entry" if entry else "") + ("" if preemption_threshold is None else f"+sglang{preemption_threshold:g}")
                out.append({
                    "instance": path.stem, "workflow": r.workflow, "policy": label,
                    "claim_rps": r.rate_rps,
                    "base": burst.base_load, "height": burst.height, "length_s": burst.length_s,
                    "served_rps": r.served_rps, "reference_rps": r.reference_served_rps,
                    "latency_mean_s": r.latency_mean_s, "reference_latency_s": r.reference_latency_mean_s,
                    "recovered": r.recovered, "recovery_s": r.recovery_s,
                })
    return out


def table(found: list[dict]) -> str:
    lines = ["| instance | workflow | policy | claim_rps | load after | burst | served / reference rps | "
             "mean latency / reference s | recovered | recovery_s |",
             "|---|---|---|---:|---:|---|---:|---:|---|---:|"]
    for r in found:
        recovery_s = "never" if r["recovery_s"] is None else f"{r['recovery_s']:.0f}"
        lines.append(
            f"| {r['instance']} | {r['workflow']} | {r['policy']} | {r['claim_rps']:.2f} | {r['base']:.0%} | "
            f"{r['height']:.0%} x {r['length_s']:.0f} s | {r['served_rps']:.2f} / {r['reference_rps']:.2f} "
            f"({r['served_rps'] / r['reference_rps']:.0%}) | {r['latency_mean_s']:.2f} / {r['reference_latency_s']:.2f} | "
            f"{'yes' if r['recovered'] else 'NO'} | {recovery_s} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("instances", nargs="*", type=Path)
    parser.add_argument("--all", action="store_true", help="every shipped instance")
    parser.add_argument("--policies", default=SimulationSettings().scheduling,
                        help="engine scheduling policies, comma-separated (fcfs, priority)")
    parser.add_argument("--base", type=float, default=None, help="load before and after the burst, share of the claim (default: the plan's recovery limit)")
    parser.add_argument("--height", type=float, default=STANDARD_BURST.height, help="load during the burst, share of the claim")
    parser.add_argument("--length-s", type=float, default=STANDARD_BURST.length_s, help="length of the burst, s")
    parser.add_argument("--grid", action="store_true", help="every height, length and load after it of the grid")
    parser.add_argument("--entry", action="store_true", help="hold each LLM's calls at the entry beyond the plan's entry_limit")
    parser.add_argument("--preemption-threshold", type=float, default=None,
                        help="SGLang's --priority-scheduling-preemption-threshold, s (default: vLLM's scheduler, no such preemption)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    paths = sorted((ROOT / "instances").glob("*.yaml")) if args.all else args.instances
    bursts: list[Burst | None]
    if args.grid:
        bursts = [replace(STANDARD_BURST, base_load=b, height=h, length_s=n)
                  for b in GRID_BASES for h in GRID_HEIGHTS for n in GRID_LENGTHS_S]
    elif args.base is None and (args.height, args.length_s) == (STANDARD_BURST.height, STANDARD_BURST.length_s):
        bursts = [None]
    else:
        base = STANDARD_BURST.base_load if args.base is None else args.base
        bursts = [replace(STANDARD_BURST, base_load=base, height=args.height, length_s=args.length_s)]
    started = time.perf_counter()
    found = []
    for path in paths:
        found += rows(path, args.policies.split(","), bursts, args.seed, args.entry, args.preemption_threshold)
        print(table(found[-1:]).splitlines()[-1], flush=True)
    print(table(found))
    print(f"\n{len(found)} rows, {sum(r['recovered'] for r in found)} recovered, {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
