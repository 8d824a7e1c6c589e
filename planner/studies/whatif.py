"""What-if grids: plan every scenario of a capacity study and tabulate the results.

`scepsy whatif INSTANCE --rates 2:40:2 --clusters 8,16 [--rate W=a:b:s] [--mix ...] [--price ...]
[--growth-per-month g --months N] [--executor local|dask] [--workers N] [--out T.parquet|.csv]
[--plots DIR]` (docs/capacity.md: axes, table schema, plots, and what is reused).

* The axes span the scenarios (planner/studies/scenarios.py). Scenarios with the same cluster (mix, size,
  and prices where the objective reads them) form a family; each family is planned in chunks of
  rate points by planner/studies/amortize.py, which returns what an independent `make_plan` of each
  scenario returns while reusing what the scenarios share. Prices that the objective does not
  read only change the cost columns: those scenarios share their family's plans.
* Chunks run on an executor (planner/studies/executors.py): this process, local processes, or Dask. A
  chunk that fails is reported on each of its scenarios (status `error`), never dropped.
* The table is tidy: one row per scenario and LLM (an infeasible scenario keeps one row per LLM,
  with the reason). Columns carry their units; no column depends on timing, so the same inputs give
  a byte-identical table whichever executor ran it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from scepsy.models.errors import InputError
from scepsy.models.instance.instance import Instance
from scepsy.models.plan.document import plan_json
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.studies.amortize import Answer, plan_family
from scepsy.planner.studies.executors import TaskFailure, run_tasks
from scepsy.planner.studies.scenarios import Axes, Scenario, parse_clusters, parse_values, resized, scenarios, with_prices

__all__ = [
    "Axes", "Point", "parse_rates", "parse_clusters", "point_instance", "run_grid", "run_study", "write_table",
    "cheapest_clusters", "forecast_table", "plot_grid", "study_view",
]

CHUNK_POINTS = 64  # rate points per task: fixed, so that results never depend on the executor

SCENARIO_COLUMNS = [
    "rate_rps", "cluster_gpus", "feasible", "status", "method", "objective", "objective_value", "reason",
    "scenario", "mix", "month", "workflow_latency_s", "workflow_max_throughput_rps", "workflow_recovery_limit_rps", "gpus_used",
    "cluster_cost_per_hour", "cost_per_1k_requests", "replicas_moved_total",
]
LLM_COLUMNS = ["llm", "gpu_type", "tp", "fraction", "replicas", "llm_gpus", "llm_latency_s", "utilization", "replicas_moved"]


def parse_rates(text: str) -> list[float]:
    """`a:b:s` (inclusive) or `a,b,c`; every rate > 0."""
    return parse_values(text, "rates")


@dataclass(frozen=True)
class Point:
    rate_rps: float
    cluster_gpus: int


def point_instance(instance: Instance, point: Point) -> Instance:
    return instance.with_cluster_size(point.cluster_gpus).with_total_rate(point.rate_rps)


def run_grid(
    instance: Instance, rates: Iterable[float], clusters: Iterable[int], settings: PlanSettings, workers: int = 1,
    progress: Callable[[int, int], None] | None = None, reuse: bool = True, executor: str = "local",
) -> pd.DataFrame:
    """The (total rate, cluster size) grid: `run_study` with those two axes."""
    return run_study(instance, Axes(total_rates=list(rates), clusters=list(clusters)), settings, workers, progress, reuse, executor)


@dataclass(frozen=True)
class Chunk:
    """One task: rate points of one family, planned in order."""

    base: Instance
    mix: str
    cluster_gpus: int
    prices: tuple
    rates: tuple  # of Rates
    settings: PlanSettings
    reuse: bool


def plan_chunk(chunk: Chunk) -> list[dict]:
    """The point results of one chunk (runs on a worker): one dict per rate point."""
    family = with_prices(resized(chunk.base, chunk.cluster_gpus, chunk.mix), chunk.prices)
    instances = [family.with_arrival_rates(dict(rates)) for rates in chunk.rates]
    return [_point(answer) for answer in plan_family(instances, chunk.settings, chunk.reuse)]


def _point(answer: Answer) -> dict:
    """What the table needs of one plan: scenario values and one dict per LLM (picklable, small)."""
    if answer.plan is None:
        return {"feasible": False, "status": _failure_status(answer.error), "method": answer.method, "reason": str(answer.error)}
    plan = answer.plan
    doc = plan_json(plan)
    busy = {(r.node, s.gpu) for r in plan.placement.replicas for s in r.shards}
    rates = [w["arrival_rate"] for w in doc["workflows"]]
    return {
        "feasible": True, "status": plan.status, "method": answer.method, "reason": "",
        "objective_value": plan.objective_value,
        "workflow_latency_s": sum(w["latency_s"] * w["arrival_rate"] for w in doc["workflows"]) / sum(rates),
        "workflow_max_throughput_rps": min(w["max_throughput_rps"] for w in doc["workflows"]),
        "workflow_recovery_limit_rps": min(w["recovery_limit_rps"] for w in doc["workflows"]),
        "gpus_used": len(busy),
        "busy_nodes": sorted(n for n, _ in busy),
        "llms": [
            {"llm": m["name"], "gpu_type": m["gpu_type"], "tp": m["tp"], "fraction": m["fraction"], "replicas": m["replicas"],
             "llm_gpus": m["gpus"], "llm_latency_s": m["latency_s"], "utilization": m["utilization"]}
            for m in doc["llms"]
        ],
    }


def _failure_status(error) -> str:
    from scepsy.models.errors import InfeasibleError
    from scepsy.planner.allocation.search import SolveTimeoutError

    if isinstance(error, SolveTimeoutError):
        return "timeout"
    return "infeasible" if isinstance(error, InfeasibleError) else "error"


def run_study(
    instance: Instance, axes: Axes, settings: PlanSettings, workers: int = 1,
    progress: Callable[[int, int], None] | None = None, reuse: bool = True, executor: str = "local",
    address: str | None = None,
) -> pd.DataFrame:
    """Plan every scenario of the axes and return the tidy table (one row per scenario and LLM)."""
    every = scenarios(instance, axes)
    chunks, where = _chunks(instance, every, settings, reuse)
    points: dict[tuple, dict] = {}
    done = 0
    for index, result in run_tasks(plan_chunk, chunks, executor, workers, address):
        chunk = chunks[index]
        if isinstance(result, TaskFailure):
            result = [{"feasible": False, "status": "error", "method": "failed", "reason": result.reason}] * len(chunk.rates)
        for rates, point in zip(chunk.rates, result):
            points[(chunk.mix, chunk.cluster_gpus, chunk.prices, rates)] = point
        done += sum(where[(chunk.mix, chunk.cluster_gpus, chunk.prices, r)] for r in chunk.rates)
        if progress:
            progress(done, len(every))
    return _table(instance, every, points, settings)


def _family_prices(instance: Instance, scenario: Scenario) -> tuple:
    """Prices change a plan only when the objective reads them (min_cost)."""
    return scenario.prices if instance.objective == "min_cost" else ()


def _chunks(instance: Instance, every: list[Scenario], settings: PlanSettings, reuse: bool):
    """Tasks of at most CHUNK_POINTS distinct rate points per family, and how many scenarios each
    (family, rates) answers."""
    families: dict[tuple, list] = {}
    where: dict[tuple, int] = {}
    for scenario in every:
        family = (scenario.mix, scenario.cluster_gpus, _family_prices(instance, scenario))
        key = family + (scenario.rates,)
        if key not in where:
            families.setdefault(family, []).append(scenario.rates)
            where[key] = 0
        where[key] += 1
    chunks = [
        Chunk(instance, mix, size, prices, tuple(rates[k:k + CHUNK_POINTS]), settings, reuse)
        for (mix, size, prices), rates in families.items()
        for k in range(0, len(rates), CHUNK_POINTS)
    ]
    return chunks, where


def _table(instance: Instance, every: list[Scenario], points: dict, settings: PlanSettings) -> pd.DataFrame:
    workflows = [w.name for w in instance.workflows]
    gpu_types = sorted(instance.cluster.gpu_types)
    rows: list[dict] = []
    previous_in_line: dict[tuple, dict] = {}
    sweep = _sweep_workflow(every)
    for number, scenario in enumerate(every):
        at = scenario.instance(instance)
        point = points[(scenario.mix, scenario.cluster_gpus, _family_prices(instance, scenario), scenario.rates)]
        prices = {g: at.cluster.gpu_types[g].cost_per_hour for g in gpu_types}
        base = {
            "rate_rps": round(scenario.total_rate_rps, 9), "cluster_gpus": scenario.cluster_gpus, "objective": at.objective,
            "scenario": number, "mix": scenario.mix or "+".join(at.cluster.used_gpu_types()), "month": scenario.month,
            **{f"rate_{w}_rps": r for w, r in scenario.rates},
            **{f"price_{g}_per_gpu_hour": prices[g] for g in gpu_types},
            **{k: point.get(k) for k in ("feasible", "status", "method", "reason", "objective_value",
                                          "workflow_latency_s", "workflow_max_throughput_rps",
                                          "workflow_recovery_limit_rps", "gpus_used")},
        }
        if point["feasible"]:
            types = {n.name: n.gpu_type for n in at.cluster.nodes}
            used = [prices[types[n]] for n in point["busy_nodes"]]
            priced = [p for p in used if p is not None]
            cost = float(sum(priced)) if len(priced) == len(used) else None
            base["cluster_cost_per_hour"] = cost
            base["cost_per_1k_requests"] = None if cost is None else cost / (3.6 * scenario.total_rate_rps)
        line = (scenario.mix, scenario.cluster_gpus, scenario.prices,
                tuple((w, r) for w, r in scenario.rates if w != sweep))
        moved = _moved(previous_in_line.get(line), point)
        previous_in_line[line] = point
        base["replicas_moved_total"] = None if moved is None else sum(moved.values())
        for llm in point.get("llms") or [{"llm": m.name} for m in at.llms]:
            rows.append({**base, **llm, "replicas_moved": None if moved is None else moved[llm["llm"]]})
    columns = SCENARIO_COLUMNS + [f"rate_{w}_rps" for w in workflows] + [f"price_{g}_per_gpu_hour" for g in gpu_types] + LLM_COLUMNS
    frame = pd.DataFrame(rows).reindex(columns=columns)
    for column in ("feasible",):
        frame[column] = frame[column].astype(bool)
    for column in ("month", "gpus_used", "tp", "replicas", "replicas_moved", "replicas_moved_total"):
        frame[column] = frame[column].astype("Int64")
    for column in ("objective_value", "workflow_latency_s", "workflow_max_throughput_rps", "workflow_recovery_limit_rps",
                   "cluster_cost_per_hour",
                   "cost_per_1k_requests", "fraction", "llm_gpus", "llm_latency_s", "utilization"):
        frame[column] = frame[column].astype("float64")
    return frame.sort_values(["mix", "cluster_gpus", "scenario", "llm"], kind="stable").reset_index(drop=True)


def _sweep_workflow(every: list[Scenario]) -> str | None:
    """The workflow whose rate varies fastest in scenario order (None: all move together)."""
    if len(every) < 2:
        return None
    first, second = every[0].rates, every[1].rates
    changed = [w for (w, a), (_, b) in zip(first, second) if a != b]
    return changed[0] if len(changed) == 1 else None


def _moved(before: dict | None, after: dict) -> dict[str, int] | None:
    """Replicas started plus stopped per LLM from the neighbouring scenario to this one (a changed
    shape replaces every replica); None without a feasible neighbour."""
    if before is None or not before.get("feasible") or not after.get("feasible"):
        return None
    old = {m["llm"]: m for m in before["llms"]}
    moved = {}
    for m in after["llms"]:
        o = old[m["llm"]]
        same = (o["gpu_type"], o["tp"], o["fraction"]) == (m["gpu_type"], m["tp"], m["fraction"])
        moved[m["llm"]] = abs(m["replicas"] - o["replicas"]) if same else m["replicas"] + o["replicas"]
    return moved


def write_table(frame: pd.DataFrame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False, float_format="%.9g", lineterminator="\n")
    else:
        raise InputError(str(path), "out", "unknown table format", "end the file name in .csv or .parquet", argument=True)


def study_axes(
    instance: Instance, rates: str | None, rate_items: list[str], clusters: str | None, mixes: list[str],
    price_items: list[str], growth_per_month: float | None, months: int | None,
) -> Axes:
    """The axes of a study given as text (the command line's), each checked (one line naming the
    argument and the fix)."""
    from scepsy.planner.studies.scenarios import check_axes, parse_named

    axes = Axes(
        total_rates=parse_rates(rates) if rates is not None else None,
        workflow_rates=parse_named(rate_items, "rate", [w.name for w in instance.workflows]) or None,
        clusters=parse_clusters(clusters) if clusters is not None else None,
        mixes=list(mixes) or None,
        prices=parse_named(price_items, "price", sorted(instance.cluster.gpu_types), positive=False) or None,
        growth_per_month=growth_per_month,
        months=months,
    )
    check_axes(instance, axes)
    return axes


def cheapest_clusters(frame: pd.DataFrame) -> pd.DataFrame:
    """For each rate, the feasible cluster of least cost per hour (when priced), else fewest GPUs."""
    points = frame[frame["feasible"] == True].drop_duplicates(["scenario"])  # noqa: E712
    key = "cluster_cost_per_hour" if points["cluster_cost_per_hour"].notna().all() and len(points) else "cluster_gpus"
    best = points.sort_values([key, "cluster_gpus", "scenario"]).groupby("rate_rps", as_index=False).first()
    return best[["rate_rps", "cluster_gpus", "mix", "cluster_cost_per_hour", "workflow_latency_s"]]


def forecast_table(frame: pd.DataFrame) -> pd.DataFrame:
    """Per cluster (mix, size, prices alike): the last month it serves the forecast and the month
    it runs out (the first infeasible month; missing if it lasts the whole horizon)."""
    points = frame.drop_duplicates(["scenario"])
    points = points[points["month"].notna()]
    rows = []
    for (mix, _), part in points.groupby(["mix", "cluster_gpus"], sort=True):
        part = part.drop_duplicates(["month"]).sort_values("month")
        failed = part[part["feasible"] == False]  # noqa: E712
        out = int(failed["month"].iloc[0]) if len(failed) else None
        served = part[part["feasible"] == True]  # noqa: E712
        last = int(served["month"].iloc[-1]) if len(served) and out is None else (out - 1 if out else None)
        rows.append({
            "mix": mix, "cluster_gpus": int(part["cluster_gpus"].iloc[0]), "last_month_served": last if last is None or last >= 0 else None,
            "runs_out_month": out, "rate_at_run_out_rps": float(failed["rate_rps"].iloc[0]) if len(failed) else None,
        })
    return pd.DataFrame(rows, columns=["mix", "cluster_gpus", "last_month_served", "runs_out_month", "rate_at_run_out_rps"])


def study_view(frame: pd.DataFrame, forecast: bool = False):
    """The study as readable tables (rich): one line per scenario, the cheapest cluster of each rate
    starred; with a forecast, the month each cluster runs out."""
    from rich.console import Group
    from rich.table import Table

    grid = Table(title="What-if grid (one line per scenario)")
    for column in ("rate_rps", "cluster_gpus", "feasible", "latency_s", "max_throughput_rps", "recovery_limit_rps", "gpus_used",
                   "cost_per_1k_requests", "cheapest"):
        grid.add_column(column, justify="right")
    best = cheapest_clusters(frame)
    cheapest = set(zip(best["rate_rps"], best["cluster_gpus"]))
    for _, row in frame.drop_duplicates(["scenario"]).iterrows():
        ok = bool(row["feasible"])
        cost = row["cost_per_1k_requests"]
        grid.add_row(
            f"{row['rate_rps']:g}", str(row["cluster_gpus"]), "yes" if ok else "no",
            f"{row['workflow_latency_s']:.3f}" if ok else "-",
            f"{row['workflow_max_throughput_rps']:.3f}" if ok else "-",
            f"{row['workflow_recovery_limit_rps']:.3f}" if ok else "-",
            f"{int(row['gpus_used'])}" if ok else "-",
            f"{cost:.4f}" if ok and cost == cost else "-",
            "*" if (row["rate_rps"], row["cluster_gpus"]) in cheapest else "",
        )
    if not forecast:
        return grid
    months = forecast_table(frame)
    runs_out = Table(title="Forecast: the month each cluster runs out")
    for column in months.columns:
        runs_out.add_column(str(column), justify="right")
    for _, row in months.iterrows():
        runs_out.add_row(*("-" if v is None or v != v else str(v) for v in row.tolist()))
    return Group(grid, runs_out)


def frontier(frame: pd.DataFrame) -> pd.DataFrame:
    """Per rate, the scenarios no other beats on both cost (per hour when priced, else GPUs) and
    predicted latency: the latency-cost frontier."""
    points = frame[frame["feasible"] == True].drop_duplicates(["scenario"]).copy()  # noqa: E712
    priced = points["cluster_cost_per_hour"].notna().all() and len(points)
    points["cost"] = points["cluster_cost_per_hour"] if priced else points["cluster_gpus"].astype(float)
    keep = []
    for _, part in points.groupby("rate_rps", sort=True):
        best = math.inf
        for index, row in part.sort_values(["cost", "workflow_latency_s", "scenario"]).iterrows():
            if row["workflow_latency_s"] < best * (1 - 1e-12):
                keep.append(index)
                best = row["workflow_latency_s"]
    columns = ["rate_rps", "mix", "cluster_gpus"] + (["cluster_cost_per_hour"] if priced else []) + ["workflow_latency_s", "scenario"]
    return points.loc[keep, columns].reset_index(drop=True)


def plot_grid(frame: pd.DataFrame, directory: Path) -> list[Path]:
    """The what-if plots as PNG files in `directory`: latency against rate, GPUs per LLM against
    rate, the cheapest cluster per rate, the latency-cost frontier, and (with a forecast) the
    month-by-month capacity forecast."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    directory.mkdir(parents=True, exist_ok=True)
    points = frame.drop_duplicates(["scenario"])
    feasible = frame[frame["feasible"] == True]  # noqa: E712
    sizes = sorted(frame["cluster_gpus"].unique())
    written = []

    fig, ax = plt.subplots(figsize=(6, 4))
    for size in sizes:
        part = points[(points["cluster_gpus"] == size) & (points["feasible"] == True)]  # noqa: E712
        part = part.groupby("rate_rps", as_index=False)["workflow_latency_s"].min()
        ax.plot(part["rate_rps"], part["workflow_latency_s"], marker="o", label=f"{size} GPUs")
    ax.set_xlabel("total arrival rate (req/s)")
    ax.set_ylabel("predicted workflow latency (s)")
    ax.set_title("Predicted latency against rate")
    ax.legend()
    written.append(_save(fig, directory / "latency_vs_rate.png"))

    fig, axes = plt.subplots(1, len(sizes), figsize=(4 * len(sizes), 3.5), squeeze=False, sharey=True)
    for ax, size in zip(axes[0], sizes):
        part = feasible[feasible["cluster_gpus"] == size]
        for llm, rows in part.groupby("llm"):
            rows = rows.groupby("rate_rps", as_index=False)["llm_gpus"].mean()
            ax.plot(rows["rate_rps"], rows["llm_gpus"], marker=".", label=llm)
        ax.set_title(f"{size} GPUs")
        ax.set_xlabel("total arrival rate (req/s)")
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

    front = frontier(frame)
    cost = "cluster_cost_per_hour" if "cluster_cost_per_hour" in front.columns else "cluster_gpus"
    rates = sorted(front["rate_rps"].unique())
    shown = rates[:: max(1, math.ceil(len(rates) / 6))]
    fig, ax = plt.subplots(figsize=(6, 4))
    for rate in shown:
        part = front[front["rate_rps"] == rate]
        ax.step(part[cost], part["workflow_latency_s"], where="post", marker="o", label=f"{rate:g} req/s")
    ax.set_xlabel("cluster cost (per hour)" if cost == "cluster_cost_per_hour" else "cluster size (GPUs)")
    ax.set_ylabel("predicted workflow latency (s)")
    ax.set_title("Latency-cost frontier per target rate")
    if shown:
        ax.legend(fontsize="small")
    written.append(_save(fig, directory / "frontier.png"))

    if points["month"].notna().any():
        forecast = forecast_table(frame)
        fig, ax = plt.subplots(figsize=(6, 4))
        for size in sizes:
            part = points[(points["cluster_gpus"] == size) & (points["feasible"] == True)]  # noqa: E712
            part = part.groupby("month", as_index=False)["workflow_latency_s"].min()
            line = ax.plot(part["month"], part["workflow_latency_s"], marker=".", label=f"{size} GPUs")[0]
            out = forecast[forecast["cluster_gpus"] == size]["runs_out_month"].dropna()
            if len(out):
                ax.axvline(float(out.min()), color=line.get_color(), linestyle=":")
        ax.set_xlabel("month")
        ax.set_ylabel("predicted workflow latency (s)")
        ax.set_title("Capacity forecast (dotted: the month a cluster runs out)")
        ax.legend(fontsize="small")
        written.append(_save(fig, directory / "forecast.png"))
    return written


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
