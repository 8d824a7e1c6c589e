"""The `scepsy` command: parses options and dispatches to the packages; no logic of its own.

Exit codes: 0 success; 2 bad input (one line naming file, field and fix); 3 infeasible (the binding
reason) or no plan within the time limit; 1 an internal error (set SCEPSY_DEBUG=1 for a traceback).
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from scepsy.models.errors import InputError, ScepsyError

app = typer.Typer(
    name="scepsy",
    help="GPU capacity planner for multi-LLM agentic workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Wide enough for the tables when piped; a terminal keeps its own width.
stdout = Console() if sys.stdout.isatty() else Console(width=160)
stderr = Console(stderr=True)

# Shared options, defined once
InstanceArg = Annotated[Path, typer.Argument(help="Instance YAML (cluster, llms, workflows).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Also write the JSON result to this file.")]
BackendOpt = Annotated[str, typer.Option("--backend", help="Allocation search: cpsat, enumerate or bruteforce.")]
TimeLimitOpt = Annotated[float, typer.Option("--time-limit-s", min=0.01, help="Stop searching after this many seconds and return the best plan with its gap.")]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, help="Solver threads (results stay deterministic).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed (same seed, same result).")]
DurationOpt = Annotated[float, typer.Option("--duration-s", min=1.0, help="Simulated seconds of arrivals.")]
WarmupOpt = Annotated[Optional[float], typer.Option("--warmup-s", min=0.0, help="Requests arriving before this are not measured (default: 10% of the duration).")]

profiles_app = typer.Typer(help="Make and inspect per-replica latency profiles.", no_args_is_help=True)
app.add_typer(profiles_app, name="profiles")


def _fail(error: ScepsyError) -> None:
    stderr.print(f"error: {error}", markup=False, highlight=False, soft_wrap=True)
    raise typer.Exit(error.exit_code)


@contextmanager
def _errors():
    """Map scepsy's typed errors to one line and an exit code; never show a traceback."""
    try:
        yield
    except ScepsyError as error:
        _fail(error)
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as error:  # noqa: BLE001 - last line of defence for the no-traceback promise
        if os.environ.get("SCEPSY_DEBUG"):
            raise
        stderr.print(f"internal error: {type(error).__name__}: {error} (set SCEPSY_DEBUG=1 for details)", markup=False)
        raise typer.Exit(1)


@contextmanager
def _working(message: str):
    """A spinner on stderr for work that may take over a second (only on a terminal)."""
    if stderr.is_terminal:
        with stderr.status(message):
            yield
    else:
        yield


@contextmanager
def _progress(description: str, total: float):
    """A progress bar on stderr (only on a terminal); yields advance(amount_or_None, text)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
        console=stderr, transient=True, disable=not stderr.is_terminal,
    ) as bar:
        task = bar.add_task(description, total=total)

        def advance(completed: float | None = None, text: str | None = None) -> None:
            if completed is None:
                bar.advance(task)
            else:
                bar.update(task, completed=completed)
            if text:
                bar.update(task, description=f"{description}: {text}")

        yield advance


def _float_list(value: str, option: str) -> list[float]:
    try:
        values = [float(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise InputError(None, option, f"{value!r} is not a comma-separated list of numbers", "write e.g. 1,2,4") from None
    if not values or any(v <= 0 for v in values):
        raise InputError(None, option, "values must be positive", "write e.g. 1,2,4")
    return values


def _emit_json(data: dict, out: Optional[Path], to_stdout: bool) -> None:
    text = json.dumps(data, indent=2) + "\n"
    if out is not None:
        try:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text)
        except OSError as exc:
            raise InputError(str(out), None, f"cannot write ({exc.strerror})", "choose a writable --out path") from None
    if to_stdout:
        sys.stdout.write(text)


@app.command()
def plan(
    instance: InstanceArg,
    backend: BackendOpt = "cpsat",
    time_limit_s: TimeLimitOpt = 60.0,
    workers: WorkersOpt = 1,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Choose GPU type, fraction, TP degree and replicas for every LLM, placed on the cluster."""
    from scepsy.models.instance import load_instance
    from scepsy.models.report import plan_view
    from scepsy.planner.search import BACKENDS, PlanSettings, make_plan

    with _errors():
        if backend not in BACKENDS:
            raise InputError(None, "--backend", f"unknown backend {backend!r}", f"use one of: {', '.join(BACKENDS)}")
        loaded = load_instance(instance)
        settings = PlanSettings(backend=backend, time_limit_s=time_limit_s, workers=workers)
        with _working(f"planning {instance} with {backend}"):
            result = make_plan(loaded, settings)
        _emit_json(result.to_json(), out, json_output)
        if not json_output:
            stdout.print(plan_view(result))


@app.command()
def predict(
    instance: InstanceArg,
    allocation: Annotated[Path, typer.Option("--allocation", help="Allocation YAML (or a plan JSON): llms: [{name, gpu_type, tp, fraction, replicas}].")],
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Predict workflow latency and throughput of a given allocation (what-if)."""
    from scepsy.models.allocation import load_allocation
    from scepsy.models.alp import AllocationError, predict as run_predict
    from scepsy.models.instance import load_instance
    from scepsy.models.plan import prediction_to_json
    from scepsy.models.report import prediction_view

    with _errors():
        loaded = load_instance(instance)
        known = {m.name: set(loaded.cluster.gpu_types) for m in loaded.llms}
        chosen = load_allocation(allocation, loaded.cluster.fractions_per_gpu, known)
        try:
            prediction = run_predict(loaded, chosen)
        except AllocationError as exc:
            raise InputError(str(allocation), "llms", str(exc), "pick a profiled configuration that fits in memory") from None
        _emit_json(prediction_to_json(prediction), out, json_output)
        if not json_output:
            stdout.print(prediction_view(prediction))
            if not prediction.feasible:
                overloaded = ", ".join(p.llm for p in prediction.llms if p.overloaded)
                stderr.print(f"warning: overloaded llms (rate above max_utilization x capacity): {overloaded}")


@profiles_app.command("synthesize")
def profiles_synthesize(
    model: Annotated[str, typer.Option("--model", help="Catalog model (short name or Hugging Face id), see models/catalog.py.")],
    gpu: Annotated[str, typer.Option("--gpu", help="Catalog GPU (A6000, A100-80G, H100, H200, L40S, L4, ...); also the profile's gpu_type unless --gpu-type-name.")],
    out: Annotated[Path, typer.Option("--out", help="Profile CSV to write.")],
    tp: Annotated[str, typer.Option("--tp", help="Tensor-parallel degrees, comma-separated.")] = "1",
    fractions: Annotated[str, typer.Option("--fractions", help="GPU fractions per shard, comma-separated.")] = "0.2,0.5,1.0",
    requests: Annotated[str, typer.Option("--requests", help="Request lengths: fixed:P,C | azure:conv | azure:code | trace.csv | calls.jsonl.")] = "azure:conv",
    llm: Annotated[Optional[str], typer.Option("--llm", help="With a calls JSONL: use only this LLM's calls.")] = None,
    gpu_type_name: Annotated[Optional[str], typer.Option("--gpu-type-name", help="gpu_type label in the CSV (default: --gpu as given).")] = None,
    min_kv_gib: Annotated[float, typer.Option("--min-kv-gib", min=0.0, help="Skip fractions whose KV cache is smaller.")] = 0.0,
    requests_per_point: Annotated[int, typer.Option("--requests-per-point", min=50, help="Simulated requests per rate point.")] = 400,
    merge: Annotated[bool, typer.Option("--merge", help="Keep the rows of other (gpu_type, tp) pairs already in --out.")] = False,
    seed: SeedOpt = 0,
    json_output: JsonOpt = False,
) -> None:
    """Synthesize a profile: simulate one replica under Poisson load from light load to saturation."""
    import pandas as pd

    from scepsy.models import catalog
    from scepsy.models.profile import read_profile_frame, write_profile
    from scepsy.models.synthesize import SynthesisSettings, load_request_source, stable_capacity_rps, synthesize

    with _errors():
        card, gpu_card = catalog.model(model), catalog.gpu(gpu)
        tps = [int(x) for x in _float_list(tp, "--tp")]
        fracs = _float_list(fractions, "--fractions")
        if any(f > 1 for f in fracs):
            raise InputError(None, "--fractions", "fractions must lie in (0, 1]", "write e.g. 0.2,0.5,1.0")
        source = load_request_source(requests, llm)
        label = gpu_type_name or gpu
        settings = SynthesisSettings(requests_per_point=requests_per_point, seed=seed)
        with _progress(f"synthesizing {card.name} on {label}", len(tps) * len(fracs)) as advance:
            frame, skipped = synthesize(card, gpu_card, tps, fracs, source, settings, label, min_kv_gib,
                                        progress=lambda text: advance(None, text))
        if frame.empty:
            raise InputError(None, "--fractions", "no (tp, fraction) fits the model", "use larger fractions or TP degrees")
        if merge and out.is_file():
            old = read_profile_frame(out)
            keep = ~old.set_index(["gpu_type", "tp"]).index.isin(frame.set_index(["gpu_type", "tp"]).index)
            frame = pd.concat([old[keep], frame], ignore_index=True)
        write_profile(frame, out)
        summary = {
            "out": str(out),
            "model": card.name,
            "gpu": gpu_card.name,
            "gpu_type": label,
            "requests": source.name,
            "mean_prompt_tokens": round(source.mean_prompt_tokens, 1),
            "mean_completion_tokens": round(source.mean_completion_tokens, 1),
            "rows": int(len(frame)),
            "capacity_rps": {
                f"tp{t}/f{fr:g}": round(stable_capacity_rps(g), 6)
                for (gt, t, fr), g in frame.groupby(["gpu_type", "tp", "fraction"]) if gt == label
            },
            "skipped": [{"tp": s.tp, "fraction": s.fraction, "reason": s.reason} for s in skipped],
        }
        _emit_json(summary, None, json_output)
        if not json_output:
            stdout.print(f"wrote {out}: {len(frame)} rows ({card.name} on {label}, requests {source.name})")
            for key, capacity in summary["capacity_rps"].items():
                stdout.print(f"  {key}: capacity_rps {capacity:.4g}")
            for s in skipped:
                stdout.print(f"  skipped tp{s.tp}/f{s.fraction:g}: {s.reason}")


def _load_arrivals(path: Path, workflows: list[str]) -> dict[str, list[float]]:
    """Arrival timestamps: JSONL {"workflow", "arrival_s"} or a CSV with a TIMESTAMP column
    (Azure trace format; every workflow replays it, from its first timestamp)."""
    import pandas as pd

    if not path.is_file():
        raise InputError(str(path), None, "file not found", "check the --arrivals path")
    if path.suffix == ".csv":
        try:
            stamps = pd.to_datetime(pd.read_csv(path, usecols=["TIMESTAMP"])["TIMESTAMP"])
        except (ValueError, KeyError, pd.errors.ParserError) as exc:
            raise InputError(str(path), "TIMESTAMP", f"cannot read timestamps ({exc})", "give a CSV with a TIMESTAMP column") from None
        seconds = ((stamps - stamps.min()).dt.total_seconds()).tolist()
        return {w: seconds for w in workflows}
    out: dict[str, list[float]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            out.setdefault(str(record["workflow"]), []).append(float(record["arrival_s"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise InputError(str(path), f"line {number}", "expected {\"workflow\": W, \"arrival_s\": T}", "fix the line") from None
    unknown = sorted(set(out) - set(workflows))
    if unknown:
        raise InputError(str(path), "workflow", f"unknown workflow {unknown[0]!r}", f"use one of: {', '.join(workflows)}")
    return out


@app.command()
def simulate(
    instance: InstanceArg,
    plan: Annotated[Optional[Path], typer.Option("--plan", help="Plan JSON or allocation YAML to run (default: plan the instance now).")] = None,
    rate: Annotated[Optional[float], typer.Option("--rate", min=0.0, help="Arrival rate of every workflow, requests/s (default: the instance's).")] = None,
    rates: Annotated[Optional[str], typer.Option("--rates", help="Several rates, comma-separated: one simulation each.")] = None,
    duration_s: DurationOpt = 300.0,
    warmup_s: WarmupOpt = None,
    arrivals: Annotated[Optional[Path], typer.Option("--arrivals", help="Arrival timestamps: JSONL {workflow, arrival_s} or an Azure-format CSV.")] = None,
    calls_out: Annotated[Optional[Path], typer.Option("--calls-out", help="Write every LLM call as JSONL (input of profiles synthesize --requests).")] = None,
    routing: Annotated[str, typer.Option("--routing", help="cache_aware (SGLang-like: least outstanding with prefix affinity) or least_outstanding.")] = "cache_aware",
    seed: SeedOpt = 0,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Simulate the workflows on a deployment: engine model per replica, routers, real control flow."""
    from scepsy.models.allocation import load_allocation
    from scepsy.models.alp import AllocationError, predict as run_predict
    from scepsy.models.instance import load_instance
    from scepsy.models.report import simulation_view
    from scepsy.models.simulator import SimulationSettings, simulate as run_simulation
    from scepsy.planner.search import PlanSettings, make_plan

    with _errors():
        loaded = load_instance(instance)
        if plan is not None:
            known = {m.name: set(loaded.cluster.gpu_types) for m in loaded.llms}
            allocation = load_allocation(plan, loaded.cluster.fractions_per_gpu, known)
        else:
            with _working(f"planning {instance}"):
                allocation = make_plan(loaded, PlanSettings()).allocation
        if rate is not None and rates is not None:
            raise InputError(None, "--rates", "both --rate and --rates given", "use one of them")
        points = _float_list(rates, "--rates") if rates is not None else [rate]
        timestamps = _load_arrivals(arrivals, [w.name for w in loaded.workflows]) if arrivals is not None else None
        if routing not in ("cache_aware", "least_outstanding"):
            raise InputError(None, "--routing", f"unknown routing {routing!r}", "use cache_aware or least_outstanding")
        settings = SimulationSettings(duration_s=duration_s, warmup_s=warmup_s, seed=seed, routing=routing)
        results = []
        with _progress("simulating", len(points)) as advance:
            for index, point in enumerate(points):
                at = loaded if point is None else loaded.with_arrival_rates({w.name: point for w in loaded.workflows})
                result = run_simulation(
                    at, allocation, settings, arrivals=timestamps, record_calls=calls_out is not None,
                    progress=lambda fraction, i=index: advance(i + fraction),
                )
                try:
                    prediction = run_predict(at, allocation)
                except AllocationError:
                    prediction = None
                results.append((point, result, prediction))
        if calls_out is not None:
            try:
                calls_out.parent.mkdir(parents=True, exist_ok=True)
                with calls_out.open("w") as handle:
                    for _, result, _ in results:
                        for call in result.calls:
                            handle.write(json.dumps(call, sort_keys=True) + "\n")
            except OSError as exc:
                raise InputError(str(calls_out), None, f"cannot write ({exc.strerror})", "choose a writable --calls-out path") from None
        payload = {"instance": str(instance), "runs": []}
        for point, result, prediction in results:
            run = {"rate_rps": point, **result.to_json()}
            if prediction is not None:
                for w in run["workflows"]:
                    w["predicted_latency_s"] = _num(prediction.workflow(w["name"]).latency_s)
            payload["runs"].append(run)
        _emit_json(payload if len(results) > 1 else {"instance": str(instance), **payload["runs"][0]}, out, json_output)
        if not json_output:
            for point, result, prediction in results:
                stdout.print(simulation_view(result, prediction, point))


def _num(value):
    import math

    return None if value is None or not math.isfinite(value) else float(f"{value:.6g}")


@app.command()
def sweep(
    instance: InstanceArg,
    rates: Annotated[Optional[str], typer.Option("--rates", help="Arrival rates (requests/s, every workflow), comma-separated.")] = None,
    load_factors: Annotated[Optional[str], typer.Option("--load-factors", help="Multipliers of the instance's rates, comma-separated.")] = None,
    baselines: Annotated[str, typer.Option("--baselines", help="Systems besides scepsy: k8s-hpa, per-llm, static, scepsy-whole-gpus, scepsy-tp1, scepsy-whole-gpus-tp1.")] = "k8s-hpa,per-llm",
    allocation: Annotated[Optional[Path], typer.Option("--allocation", help="Allocation file of the static system.")] = None,
    duration_s: DurationOpt = 300.0,
    warmup_s: WarmupOpt = None,
    out_csv: Annotated[Path, typer.Option("--out-csv", help="Tidy CSV of every (system, load, workflow) point.")] = Path("sweep.csv"),
    out_png: Annotated[Path, typer.Option("--out-png", help="Throughput-latency plot.")] = Path("sweep.png"),
    seed: SeedOpt = 0,
    json_output: JsonOpt = False,
) -> None:
    """Throughput-latency curves of scepsy and baselines on the simulator (CSV and PNG)."""
    from scepsy.models.instance import load_instance
    from scepsy.models.simulator import SimulationSettings
    from scepsy.models.report import comparison_table
    from scepsy.planner.baselines import SYSTEMS
    from scepsy.planner.sweep import SweepSettings, compare, load_points, plot_sweep, sweep as run_sweep, write_sweep

    with _errors():
        loaded = load_instance(instance)
        if (rates is None) == (load_factors is None):
            raise InputError(None, "--rates", "give exactly one of --rates and --load-factors", "e.g. --rates 1,2,4")
        points = load_points(
            loaded,
            rates=_float_list(rates, "--rates") if rates else None,
            load_factors=_float_list(load_factors, "--load-factors") if load_factors else None,
        )
        systems = ["scepsy"] + [s.strip() for s in baselines.split(",") if s.strip() and s.strip() != "scepsy"]
        for system in systems:
            if system not in SYSTEMS:
                raise InputError(None, "--baselines", f"unknown system {system!r}", f"use some of: {', '.join(SYSTEMS[1:])}")
        settings = SweepSettings(SimulationSettings(duration_s=duration_s, warmup_s=warmup_s, seed=seed), static_path=allocation)
        with _progress("sweeping", len(systems) * len(points)) as advance:
            frame = run_sweep(loaded, points, systems, settings, progress=lambda text: advance(None, text))
        write_sweep(frame, out_csv)
        plot_sweep(frame, out_png, title=Path(instance).stem)
        comparisons = compare(frame)
        payload = {
            "csv": str(out_csv),
            "png": str(out_png),
            "comparisons": [
                {
                    "workflow": c.workflow,
                    "baseline": c.baseline,
                    "peak_throughput_ratio": _num(c.peak_throughput_ratio),
                    "latency_ratio_min": _num(c.latency_ratio_min),
                    "latency_ratio_median": _num(c.latency_ratio_median),
                    "latency_ratio_max": _num(c.latency_ratio_max),
                }
                for c in comparisons
            ],
        }
        _emit_json(payload, None, json_output)
        if not json_output:
            stdout.print(f"wrote {out_csv} and {out_png}")
            stdout.print(comparison_table(comparisons))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
