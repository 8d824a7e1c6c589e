"""Search time of the allocation backends along the paper's Fig. 11 axes.

    python bench/solver_scaling.py [--repeats 3] [--quick] [--json out.json]

Axes (the combined workflow: beam search + RAG on RTX A6000 nodes of 4 GPUs with NVLink pairs):
  LLMs  2..6 at 16 GPUs, F = 10      (paper: up to 35 s)
  GPUs  4..128 with 3 LLMs, F = 10   (paper: up to 70 s at 128 GPUs)
  F     2..20 with 3 LLMs, 16 GPUs   (paper: up to 1 s)
Each point is planned end to end (`make_plan`: reference optima of both workflows, the joint
egalitarian solve, placement); the median wall time over --repeats runs is reported, with the
plan's status. `enumerate` is the paper's pruned enumeration; it is skipped where one run would
take minutes (marked "skip"). Targets (2 cores): 5 LLMs/16 GPUs/F=10 proven optimal in <= 1 s,
3 LLMs on 128 GPUs in <= 5 s.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import combined_instance, timed  # noqa: E402

from scepsy.planner.allocation.search import PlanSettings  # noqa: E402
from scepsy.planner.allocation.planning import make_plan  # noqa: E402

PAPER_S = {("llms", 5): 35.0, ("gpus", 128): 70.0, ("fractions", 20): 1.0}
ENUMERATE_LIMITS = {"llms": 4, "gpus": 32, "fractions": 20}  # beyond: minutes per run


def axis_points(quick: bool):
    llms = [2, 3, 4, 5] if quick else [2, 3, 4, 5, 6]
    gpus = [4, 16, 64] if quick else [4, 8, 16, 32, 64, 128]
    fractions = [2, 10] if quick else [2, 5, 10, 15, 20]
    yield from (("llms", n, (n, 16, 10)) for n in llms)
    yield from (("gpus", g, (3, g, 10)) for g in gpus)
    yield from (("fractions", f, (3, 16, f)) for f in fractions)


def run(repeats: int, quick: bool) -> list[dict]:
    rows = []
    for axis, value, (n_llms, gpus, fractions) in axis_points(quick):
        instance = combined_instance(n_llms, gpus, fractions)
        row = {"axis": axis, "value": value, "llms": n_llms, "gpus": gpus, "fractions_per_gpu": fractions}
        for backend in ("cpsat", "enumerate"):
            if backend == "enumerate" and value > ENUMERATE_LIMITS[axis]:
                row[f"{backend}_median_s"] = None
                continue
            median, plans = timed(lambda: make_plan(instance, PlanSettings(backend=backend)), repeats)
            row[f"{backend}_median_s"] = round(median, 4)
            row[f"{backend}_status"] = plans[0].status
            row[f"{backend}_objective"] = round(plans[0].objective_value, 6)
        row["paper_s"] = PAPER_S.get((axis, value))
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(row: dict) -> str:
    def cell(backend):
        t = row.get(f"{backend}_median_s")
        return "skip" if t is None else f"{t:8.3f} s ({row[f'{backend}_status']})"

    ratio = ""
    if row.get("enumerate_median_s") and row["cpsat_median_s"]:
        ratio = f"  enumerate/cpsat time = {row['enumerate_median_s'] / row['cpsat_median_s']:.1f}x"
        ratio += f", objective ratio = {row['enumerate_objective'] / row['cpsat_objective']:.4f}"
    paper = f"  paper {row['paper_s']:g} s" if row["paper_s"] else ""
    return f"{row['axis']:>9} = {row['value']:>3}: cpsat {cell('cpsat')}  enumerate {cell('enumerate')}{ratio}{paper}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="fewer points (for a smoke run)")
    parser.add_argument("--json", type=Path, help="write the rows as JSON")
    args = parser.parse_args()
    rows = run(args.repeats, args.quick)
    targets = {
        "5 LLMs, 16 GPUs, F=10 <= 1 s": next(r for r in rows if r["axis"] == "llms" and r["value"] == 5),
        "3 LLMs, 128 GPUs <= 5 s": next((r for r in rows if r["axis"] == "gpus" and r["value"] == 128), None),
    }
    for label, row in targets.items():
        if row is None:
            continue
        limit = 1.0 if "16 GPUs" in label else 5.0
        ok = row["cpsat_median_s"] <= limit and row["cpsat_status"] == "optimal"
        print(f"target {label}: median {row['cpsat_median_s']:.3f} s, {row['cpsat_status']} -> {'met' if ok else 'MISSED'}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
