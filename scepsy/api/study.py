"""Capacity studies (`scepsy whatif`) and throughput-latency sweeps against baselines (`scepsy
sweep`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from scepsy.api.plan import InstanceLike, PathLike, load
from scepsy.models.arguments import check_finite
from scepsy.models.instance.instance import Instance
from scepsy.models.output import check_output, check_output_dir, writing
from scepsy.models.plan.report import comparison_table
from scepsy.models.simulation.simulator import SimulationSettings
from scepsy.planner.allocation.search import PlanSettings

if TYPE_CHECKING:
    import pandas as pd
    from rich.console import RenderableType

    from scepsy.planner.studies.sweep import Comparison


@dataclass(frozen=True)
class Study:
    """A capacity study (`scepsy whatif`): the tidy table, one row per scenario and LLM
    (docs/capacity.md has its schema), and the files written."""

    frame: pd.DataFrame
    forecast: bool  # the axes include a growth forecast
    table: Path | None = None
    plots: tuple[Path, ...] = ()


def study_document(study: Study) -> str:
    """What `scepsy whatif --json` prints: the table's rows as a JSON list (text, as pandas writes
    the table's numbers)."""
    return study.frame.to_json(orient="records", indent=2) + "\n"


def study_view(study: Study) -> RenderableType:
    """The grid (cheapest cluster per rate starred) and, with a forecast, the month each cluster
    runs out."""
    from scepsy.planner.studies.whatif import study_view as view

    return view(study.frame, study.forecast)


def whatif(
    instance: InstanceLike,
    *,
    rates: str | None = None,
    rate: Sequence[str] = (),
    clusters: str | None = None,
    mix: Sequence[str] = (),
    price: Sequence[str] = (),
    growth_per_month: float | None = None,
    months: int | None = None,
    objective: str | None = None,
    backend: str = "cpsat",
    time_limit_s: float = 60.0,
    workers: int = 1,
    executor: str = "local",
    address: str | None = None,
    reuse: bool = True,
    out: PathLike | None = None,
    plots: PathLike | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Study:
    """Plan every scenario of a capacity study (`scepsy whatif`): total `rates` ("2:40:2" or
    "2,4,8", req/s) or per-workflow `rate` items ("beam=2:20:2"), cluster sizes `clusters`
    ("4,8,16" GPUs), GPU-type `mix`es ("H100+A6000"), `price` items ("H100=2,3" per GPU hour), and
    a forecast (`growth_per_month`, `months`). `out` writes the table (.csv or .parquet), `plots`
    the PNG plots into that folder; `progress(done, total)` counts the scenarios planned."""
    from scepsy.planner.studies.executors import check_executor
    from scepsy.planner.studies.scenarios import scenarios
    from scepsy.planner.studies.whatif import plot_grid, run_study, study_axes, write_table

    check_finite(time_limit_s, "time_limit_s")
    check_finite(growth_per_month, "growth_per_month")
    check_executor(executor, address)
    inputs = [None if isinstance(instance, Instance) else instance]
    if out is not None:
        check_output(out, inputs)
    if plots is not None:
        check_output_dir(plots, inputs, "plots")
    loaded = load(instance, objective)
    axes = study_axes(loaded, rates, list(rate), clusters, list(mix), list(price), growth_per_month, months)
    if progress is not None:
        progress(0, len(scenarios(loaded, axes)))
    settings = PlanSettings(backend=backend, time_limit_s=time_limit_s)
    frame = run_study(loaded, axes, settings, workers, progress, reuse=reuse, executor=executor, address=address)
    written: tuple[Path, ...] = ()
    if out is not None:
        with writing(out):
            write_table(frame, Path(out))
    if plots is not None:
        with writing(Path(plots) / "grid.png", "plots"):
            written = tuple(plot_grid(frame, Path(plots)))
    return Study(frame, axes.months is not None, None if out is None else Path(out), written)


@dataclass(frozen=True)
class SweepRun:
    """Throughput-latency curves of scepsy and baselines (`scepsy sweep`): the tidy table of every
    (system, load, workflow) point, the files written, and scepsy against each baseline."""

    frame: pd.DataFrame
    comparisons: tuple[Comparison, ...]
    csv: Path
    png: Path


def sweep_document(run: SweepRun) -> dict:
    """What `scepsy sweep --json` prints."""
    return {"csv": str(run.csv), "png": str(run.png), "comparisons": [c.to_json() for c in run.comparisons]}


def sweep_view(run: SweepRun) -> RenderableType:
    """scepsy against each baseline, as a table."""
    return comparison_table(run.comparisons)


def sweep(
    instance: InstanceLike,
    *,
    rates: Sequence[float] | None = None,
    load_factors: Sequence[float] | None = None,
    baselines: Sequence[str] = ("k8s-hpa", "per-llm"),
    allocation: PathLike | None = None,
    settings: SimulationSettings = SimulationSettings(),
    out_csv: PathLike = "sweep.csv",
    out_png: PathLike = "sweep.png",
    progress: Callable[[int, int, str], None] | None = None,
) -> SweepRun:
    """Simulate scepsy and the `baselines` (planner/studies/baselines.py SYSTEMS; `static` runs the
    `allocation` file) at each of the `rates` (req/s, every workflow) or `load_factors` (multiples of
    the instance's rates), exactly one of them; write the table to `out_csv` and the plot to
    `out_png`; `progress(done, total, text)` after each (system, load) point."""
    from scepsy.planner.studies.baselines import check_system
    from scepsy.planner.studies.sweep import SweepSettings, compare, load_points, plot_sweep, write_sweep
    from scepsy.planner.studies.sweep import sweep as run_sweep

    inputs = [p for p in (instance, allocation) if isinstance(p, (str, Path))]
    for path, field in ((out_csv, "out_csv"), (out_png, "out_png")):
        check_output(path, inputs, field)
    loaded = load(instance)
    points = load_points(loaded, rates=rates, load_factors=load_factors)
    systems = ["scepsy"] + [s for s in baselines if s != "scepsy"]
    for system in systems:
        check_system(system, allocation)
    total, done = len(systems) * len(points), 0

    def step(text: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total, text)

    static = None if allocation is None else Path(allocation)
    frame = run_sweep(loaded, points, systems, SweepSettings(settings, static_path=static), progress=step)
    with writing(out_csv, "out_csv"):
        write_sweep(frame, Path(out_csv))
    with writing(out_png, "out_png"):
        plot_sweep(frame, Path(out_png), title=Path(loaded.source or "instance").stem)
    return SweepRun(frame, tuple(compare(frame)), Path(out_csv), Path(out_png))
