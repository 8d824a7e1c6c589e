"""What-if grids: plan every (arrival rate, cluster size) point and tabulate the results.

`scepsy whatif INSTANCE --rates 1:20:1 --clusters 4,8,16 [--objective ...] [--workers N]`

* Rates are the total workflow arrival rate in requests/s (several workflows keep their mix).
  `a:b:s` means a, a+s, ... up to b inclusive; `a,b,c` lists them.
* Cluster sizes are GPU counts built from whole copies of the instance's node kinds
  (`Instance.with_cluster_size`).
* Points run in parallel processes; each is an independent `make_plan`.
* The table is tidy: one row per point and LLM (infeasible points keep one row per LLM, with the
  reason). Columns carry their units.
* Plots: predicted latency against rate per cluster size, GPUs per LLM against rate (one panel per
  cluster size), and the smallest (or cheapest, when GPU types have prices) feasible cluster for
  each rate.
"""

from __future__ import annotations

import math
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from scepsy.models.errors import InputError, ScepsyError
from scepsy.models.instance.instance import MAX_CLUSTER_GPUS, MAX_RATE, Instance

from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.allocation.planning import make_plan

COLUMNS = [
    "rate_rps", "cluster_gpus", "feasible", "status", "objective", "objective_value", "reason",
    "workflow_latency_s", "workflow_max_throughput_rps", "cluster_cost_per_hour", "gpus_used",
    "llm", "gpu_type", "tp", "fraction", "replicas", "llm_gpus", "llm_latency_s", "utilization", "wall_time_s",
]


MAX_GRID_POINTS = 10_000


def parse_rates(text: str) -> list[float]:
    """`a:b:s` (inclusive) or `a,b,c`; every rate > 0."""
    try:
        if ":" in text:
            start, stop, step = (float(v) for v in text.split(":"))
            if not (step > 0 and math.isfinite(start) and math.isfinite(stop)):
                raise ValueError
            count = int(math.floor((stop - start) / step + 1e-9)) + 1
            if count > MAX_GRID_POINTS:
                raise InputError(None, "--rates", f"{text!r} is {count:,} rates, more than {MAX_GRID_POINTS:,}",
                                 "use a larger step or a shorter range")
            rates = [round(start + k * step, 9) for k in range(count)]
        else:
            rates = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise InputError(None, "--rates", f"cannot read {text!r}", "write start:stop:step (e.g. 1:20:1) or a list 1,2,5") from None
    if not rates or not all(0 < r <= MAX_RATE for r in rates):
        raise InputError(None, "--rates", f"rates must be positive finite numbers up to {MAX_RATE:g}", "use request rates above 0")
    return rates


def parse_clusters(text: str) -> list[int]:
    try:
        sizes = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise InputError(None, "--clusters", f"cannot read {text!r}", "list GPU counts, e.g. 4,8,16") from None
    if not sizes or sizes[0] <= 0 or sizes[-1] > MAX_CLUSTER_GPUS:
        raise InputError(None, "--clusters", f"cluster sizes must be in 1..{MAX_CLUSTER_GPUS:,} GPUs", "list GPU counts, e.g. 4,8,16")
    return sizes


@dataclass(frozen=True)
class Point:
    rate_rps: float
    cluster_gpus: int


def point_instance(instance: Instance, point: Point) -> Instance:
    return instance.with_cluster_size(point.cluster_gpus).with_total_rate(point.rate_rps)


def _plan_point(args) -> list[dict]:
    instance, point, settings = args
    at = point_instance(instance, point)
    base = {"rate_rps": point.rate_rps, "cluster_gpus": point.cluster_gpus, "objective": at.objective}
    try:
        plan = make_plan(at, settings)
    except ScepsyError as error:
        return [dict(base, feasible=False, status="infeasible", reason=str(error), llm=m.name) for m in at.llms]
    doc = plan.to_json()
    prices = {g: t.cost_per_hour for g, t in at.cluster.gpu_types.items()}
    busy = plan.placement.busy_gpus()
    types = {n.name: n.gpu_type for n in at.cluster.nodes}
    priced = [prices[types[n]] for n, _ in busy]
    cost = None if any(p is None for p in priced) else sum(p for p in priced if p is not None)
    latency = sum(w["latency_s"] * w["arrival_rate"] for w in doc["workflows"]) / sum(w["arrival_rate"] for w in doc["workflows"])
    rows = []
    for llm in doc["llms"]:
        rows.append(dict(
            base, feasible=True, status=plan.status, objective_value=plan.objective_value, reason="",
            workflow_latency_s=latency,
            workflow_max_throughput_rps=min(w["max_throughput_rps"] for w in doc["workflows"]),
            cluster_cost_per_hour=cost, gpus_used=len(busy), llm=llm["name"], gpu_type=llm["gpu_type"], tp=llm["tp"],
            fraction=llm["fraction"], replicas=llm["replicas"], llm_gpus=llm["gpus"], llm_latency_s=llm["latency_s"],
            utilization=llm["utilization"], wall_time_s=plan.solver.wall_time_s,
        ))
    return rows


def run_grid(
    instance: Instance, rates: Iterable[float], clusters: Iterable[int], settings: PlanSettings, workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Plan every point (in `workers` processes) and return the tidy table, sorted."""
    points = [Point(r, c) for c in clusters for r in rates]
    for point in points:  # fail fast on sizes that are not whole nodes
        instance.with_cluster_size(point.cluster_gpus)
    jobs = [(instance, p, settings) for p in points]
    rows: list[dict] = []
    if workers <= 1:
        results = map(_plan_point, jobs)
        for done, result in enumerate(results, 1):
            rows += result
            if progress:
                progress(done, len(jobs))
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for done, result in enumerate(pool.map(_plan_point, jobs), 1):
                rows += result
                if progress:
                    progress(done, len(jobs))
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    return frame.sort_values(["cluster_gpus", "rate_rps", "llm"], kind="stable").reset_index(drop=True)


def write_table(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False, float_format="%.9g", lineterminator="\n")
    else:
        raise InputError(str(path), "--out", "unknown table format", "end the file name in .csv or .parquet")


def cheapest_clusters(frame: pd.DataFrame) -> pd.DataFrame:
    """For each rate, the feasible cluster of least cost per hour (when priced), else fewest GPUs."""
    points = frame[frame["feasible"] == True].drop_duplicates(["rate_rps", "cluster_gpus"])  # noqa: E712
    key = "cluster_cost_per_hour" if points["cluster_cost_per_hour"].notna().all() and len(points) else "cluster_gpus"
    best = points.sort_values([key, "cluster_gpus"]).groupby("rate_rps", as_index=False).first()
    return best[["rate_rps", "cluster_gpus", "cluster_cost_per_hour", "workflow_latency_s"]]


def plot_grid(frame: pd.DataFrame, directory: Path) -> list[Path]:
    """The three what-if plots as PNG files in `directory`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    points = frame.drop_duplicates(["rate_rps", "cluster_gpus"])
    feasible = frame[frame["feasible"] == True]  # noqa: E712
    sizes = sorted(frame["cluster_gpus"].unique())
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for size in sizes:
        part = points[(points["cluster_gpus"] == size) & (points["feasible"] == True)]  # noqa: E712
        ax.plot(part["rate_rps"], part["workflow_latency_s"], marker="o", label=f"{size} GPUs")
    ax.set_xlabel("arrival rate (req/s)")
    ax.set_ylabel("predicted workflow latency (s)")
    ax.set_title("Predicted latency against rate")
    ax.legend()
    written.append(_save(fig, directory / "latency_vs_rate.png"))

    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 3.5), squeeze=False, sharey=True)
    for ax, size in zip(axes[0], sizes):
        part = feasible[feasible["cluster_gpus"] == size]
        for llm, rows in part.groupby("llm"):
            ax.plot(rows["rate_rps"], rows["llm_gpus"], marker=".", label=llm)
        ax.set_title(f"{size} GPUs")
        ax.set_xlabel("arrival rate (req/s)")
    axes[0][0].set_ylabel("GPUs per LLM")
    axes[0][-1].legend(fontsize="small")
    written.append(_save(fig, directory / "gpus_per_llm.png"))

    best = cheapest_clusters(frame)
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.step(best["rate_rps"], best["cluster_gpus"], where="mid", marker="o")
    ax.set_xlabel("target arrival rate (req/s)")
    ax.set_ylabel("cheapest feasible cluster (GPUs)")
    ax.set_title("Cheapest cluster per target rate")
    written.append(_save(fig, directory / "cheapest_cluster.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
