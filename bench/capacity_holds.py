"""Capacity claims against the workflow simulator: (claimed, simulated, ratio) per claim.

    python bench/capacity_holds.py instances/beam-4xa6000.yaml instances/rag-4xa6000.yaml
    python bench/capacity_holds.py --all --seeds 0,1,2 --duration-s 200 --out claims.csv
    python bench/capacity_holds.py --all --kinds whatif

For each instance, the claims of planner/studies/claims.py: the `max_throughput` plan at its load,
the instance's own plan at the max_throughput_rps it reports, the `min_gpus` plan (and `min_cost`
where priced) at the instance's rates, and the what-if study's plan at its middle rate at the
capacity the study prints for it (--kinds picks some). Each is simulated at 90% and 100% of the claimed load with
every seed, for --duration-s or longer (the measured window opens 5 predicted latencies after the
empty start and holds 40: the steady state of the load, planner/studies/claims.py); a row holds when at least 97% of the offered requests complete and, at 90%, the mean
latency is within 15% of the prediction. Prints one markdown row per (claim, workflow, load): the
claimed rate, the worst simulated throughput over the seeds, their ratio, the worst completed
share and latency error, and whether every seed holds. Deterministic (seeded simulations).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from scepsy.models.instance.instance import load_instance
from scepsy.planner.studies.claims import KINDS, check, claims

ROOT = Path(__file__).resolve().parent.parent
LOADS = (0.9, 1.0)


def run(path: Path, seeds: list[int], duration_s: float, kinds: tuple[str, ...] = KINDS) -> list[dict]:
    instance = load_instance(path)
    rows = []
    for claim in claims(instance, path.stem, kinds=kinds):
        for load in LOADS:
            for seed in seeds:
                rows += [c.row() for c in check(instance, claim, load, seed, duration_s)]
    return rows


def table(frame: pd.DataFrame) -> str:
    lines = ["| instance | claim | workflow | load | claimed_rps | simulated_rps (worst seed) | ratio | completed (worst) "
             "| latency error (worst) | holds |", "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for (instance, claim, workflow, load), part in frame.groupby(["instance", "claim", "workflow", "load"], sort=False):
        offered = part["claimed_rps"].iloc[0] * load
        worst = part["throughput_rps"].min()
        errors = [float(e) for e in part["latency_error"]]
        error = max(errors, key=abs)
        lines.append(
            f"| {instance} | {claim} | {workflow} | {load:.0%} | {offered:.3f} | {worst:.3f} | {worst / offered:.3f} | "
            f"{part['completed_share'].min():.1%} | {error:+.1%} | {'yes' if part['holds'].all() else 'NO'} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("instances", nargs="*", type=Path)
    parser.add_argument("--all", action="store_true", help="every shipped instance")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--duration-s", type=float, default=200.0)
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"claims to check, of {','.join(KINDS)}")
    parser.add_argument("--out", type=Path, default=None, help="the rows, one per (claim, load, seed, workflow), as CSV")
    options = parser.parse_args()
    paths = sorted((ROOT / "instances").glob("*.yaml")) if options.all else options.instances
    if not paths:
        parser.error("name instances, or --all")
    seeds = [int(s) for s in options.seeds.split(",")]
    kinds = tuple(options.kinds.split(","))
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds: unknown {sorted(set(kinds) - set(KINDS))}; choose from {','.join(KINDS)}")
    rows = []
    for path in paths:
        start = time.perf_counter()
        rows += run(path, seeds, options.duration_s, kinds)
        print(f"# {path.stem}: {time.perf_counter() - start:.1f} s", flush=True)
    frame = pd.DataFrame(rows)
    if options.out:
        frame.to_csv(options.out, index=False, float_format="%.6g", lineterminator="\n")
    print(table(frame))
    print(f"\n{int(frame.groupby(['instance', 'claim', 'workflow', 'load'])['holds'].all().sum())} of "
          f"{frame.groupby(['instance', 'claim', 'workflow', 'load']).ngroups} (claim, workflow, load) rows hold")


if __name__ == "__main__":
    main()
