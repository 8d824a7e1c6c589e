"""What-if grids that amortize, measured side by side with single plans of the same instance.

    python bench/whatif_amortized.py [--repeats 3] [--workers 2] [--quick] [--json out.json]

Every run is the real command line (`scepsy plan`, `scepsy whatif`), so each pays its own start-up
like a user does. Single plans and grids alternate, so that a change in the machine's load touches
both sides; the ratios use the medians:

  plan       `scepsy plan instances/combined-8xh100.yaml`                          (--repeats runs)
  grid-80    `scepsy whatif ... --rates 2:40:2 --clusters 8,16,32,64 --workers W`  (80 scenarios)
  today-80   the same grid with --no-reuse (an independent make_plan per scenario)
  grid-1000  `--rates 0.4:40:0.4 --clusters 8,16,...,80` (1,000 scenarios)
  near-1000  `--rates 1:250:1 --clusters 8,16,32,64` (1,000 scenarios from light load to past the
             clusters' capacity, where the optimum changes every few rates)

Wall and CPU time (user + system of the command and its workers) are both reported: on a shared
machine the wall ratio moves with the load, the CPU ratio much less.
Targets (docs/capacity.md): grid-80 <= 4 plans; grid-1000 and near-1000 in about a minute on 2 cores.
Every scenario's plan equals an independent plan of it: tests/test_amortize.py checks that.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
INSTANCE = str(REPO / "instances" / "combined-8xh100.yaml")
GRID_80 = ["--rates", "2:40:2", "--clusters", "8,16,32,64"]
GRID_1000 = ["--rates", "0.4:40:0.4", "--clusters", ",".join(str(8 * k) for k in range(1, 11))]
NEAR_1000 = ["--rates", "1:250:1", "--clusters", "8,16,32,64"]


CPU: dict[str, list[float]] = {"plan": [], "grid80": [], "today80": [], "grid1000": [], "near1000": []}


def scepsy(*args: str, label: str = "plan") -> float:
    """Wall time of one command line run, in seconds (it must succeed); its CPU time (user +
    system, the command and its worker processes) is kept in CPU[label]."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "scepsy", *args], check=True, capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU[label].append((after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))
    return wall


def grid(args: list[str], workers: int, out: Path, label: str, reuse: bool = True) -> float:
    flags = ["--workers", str(workers), "--out", str(out)] + ([] if reuse else ["--no-reuse"])
    return scepsy("whatif", INSTANCE, *args, *flags, label=label)


def methods(path: Path) -> dict[str, int]:
    table = pd.read_csv(path).drop_duplicates("scenario")
    return {str(k): int(v) for k, v in table["method"].value_counts().sort_index().items()}


def run(repeats: int, workers: int, quick: bool) -> dict:
    plans, grids = [], []
    with tempfile.TemporaryDirectory() as tmp:
        out80 = Path(tmp) / "grid80.csv"
        for _ in range(repeats):
            plans.append(scepsy("plan", INSTANCE))
            grids.append(grid(GRID_80, workers, out80, "grid80"))
        plans.append(scepsy("plan", INSTANCE))
        result = {
            "plan_median_s": statistics.median(plans),
            "grid80_median_s": statistics.median(grids),
            "grid80_methods": methods(out80),
            "workers": workers,
        }
        result["grid80_in_plans"] = result["grid80_median_s"] / result["plan_median_s"]
        result["plan_cpu_median_s"] = statistics.median(CPU["plan"])
        result["grid80_cpu_median_s"] = statistics.median(CPU["grid80"])
        result["grid80_cpu_in_plans"] = result["grid80_cpu_median_s"] / result["plan_cpu_median_s"]
        if not quick:
            out = Path(tmp) / "today80.csv"
            result["today80_s"] = grid(GRID_80, workers, out, "today80", reuse=False)
            result["today80_in_plans"] = result["today80_s"] / result["plan_median_s"]
            result["today80_cpu_s"] = CPU["today80"][0]
            result["plan_after_today_s"] = scepsy("plan", INSTANCE)
            out = Path(tmp) / "grid1000.csv"
            result["grid1000_s"] = grid(GRID_1000, workers, out, "grid1000")
            result["grid1000_cpu_s"] = CPU["grid1000"][0]
            result["grid1000_scenarios"] = int(pd.read_csv(out)["scenario"].nunique())
            result["grid1000_methods"] = methods(out)
            result["grid1000_in_plans"] = result["grid1000_s"] / result["plan_median_s"]
            out = Path(tmp) / "near1000.csv"
            result["near1000_s"] = grid(NEAR_1000, workers, out, "near1000")
            result["near1000_cpu_s"] = CPU["near1000"][0]
            result["near1000_methods"] = methods(out)
            result["near1000_in_plans"] = result["near1000_s"] / result["plan_median_s"]
    result["load_average_1min"] = os.getloadavg()[0]  # the machine is shared: ratios are side by side
    result["targets"] = {
        "grid80_at_most_4_plans": result["grid80_in_plans"] <= 4.0,
        "grid1000_about_a_minute": None if quick else result["grid1000_s"] <= 90.0,
        "near1000_about_a_minute": None if quick else result["near1000_s"] <= 90.0,
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="only the 80-scenario grid against single plans")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args.repeats, args.workers, args.quick)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
