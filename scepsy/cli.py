"""The `scepsy` command: parses options and dispatches to the packages; no logic of its own.

Exit codes: 0 success; 2 bad input (one line naming file, field and fix); 3 infeasible (the binding
reason) or no plan within the time limit; 1 an internal error (set SCEPSY_DEBUG=1 for a traceback).
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from scepsy.models.errors import InputError, ScepsyError
from scepsy.models.inputs import kind_of
from scepsy.models.output import check_output, check_output_dir, write_text, writing

MAX_OPTION_VALUE = 1e9  # rates, load factors, seconds: beyond it lies no real workload, only overflow

app = typer.Typer(
    name="scepsy",
    help="GPU capacity planner for multi-LLM agentic workflows.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Wide enough for the tables when piped; a terminal keeps its own width. User-given text (names,
# paths) is printed as it is: no markup, emoji codes or highlighting; stderr lines never wrap.
_PLAIN = {"markup": False, "emoji": False, "highlight": False}
stdout = Console(**_PLAIN) if sys.stdout.isatty() else Console(width=160, **_PLAIN)
stderr = Console(stderr=True, soft_wrap=True, **_PLAIN)

# Shared options, defined once
InstanceArg = Annotated[Path, typer.Argument(help="Instance YAML (cluster, llms, workflows).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Also write the JSON result to this file.")]
BackendOpt = Annotated[str, typer.Option("--backend", help="Allocation search: cpsat, milp, enumerate or bruteforce.")]
ObjectiveOpt = Annotated[Optional[str], typer.Option("--objective", help="Override the instance's objective: min_latency, max_throughput, min_gpus or min_cost.")]
WelfareOpt = Annotated[Optional[str], typer.Option("--welfare", help="Override how several workflows combine: egalitarian or social.")]
TimeLimitOpt = Annotated[float, typer.Option("--time-limit-s", min=0.01, help="Stop searching after this many seconds and return the best plan with its gap.")]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, max=256, help="Solver threads, 1 to 256 (results stay deterministic).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed (same seed, same result).")]
DurationOpt = Annotated[float, typer.Option("--duration-s", min=1.0, help="Simulated seconds of arrivals.")]
WarmupOpt = Annotated[Optional[float], typer.Option("--warmup-s", min=0.0, help="Requests arriving before this are not measured (default: 10% of the duration).")]

profiles_app = typer.Typer(
    help="Build profile CSVs (rows: gpu_type, tp, fraction, arrival_rate, throughput, latencies).", no_args_is_help=True
)
app.add_typer(profiles_app, name="profiles")

KubeconfigOpt = Annotated[Optional[Path], typer.Option("--kubeconfig", help="Kubeconfig file (default: $KUBECONFIG or ~/.kube/config).")]
ContextOpt = Annotated[Optional[str], typer.Option("--context", help="Kubeconfig context (default: the current one).")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", help="Namespace of the deployment.")]
PlacementOpt = Annotated[str, typer.Option("--placement", help="Placement: cpsat (exact, least fragmented, the heuristic as hint) or heuristic (the paper's).")]
PlacementTimeLimitOpt = Annotated[float, typer.Option("--placement-time-limit-s", min=0.01, help="Stop the placement search after this many seconds and keep the best placement with its gap.")]
CurrentOpt = Annotated[Optional[Path], typer.Option("--current", help="Re-plan: the running placement (a previous plan JSON or its placement list); replicas that can stay where they are, stay.")]
TracesArg = Annotated[list[Path], typer.Argument(help="Trace files: proxy stores (.db), .jsonl/.parquet exports, OTLP JSON (.json).", show_default=False)]
GpuTypeOpt = Annotated[str, typer.Option("--gpu-type", help="GPU type the profile rows are for (a name of the instance's cluster.gpu_types).")]
TpOpt = Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree of the replica (profiled or emulated).")]
FractionOpt = Annotated[float, typer.Option("--fraction", min=0.0, max=1.0, help="GPU fraction per shard of the replica (profiled or emulated), in (0, 1].")]
CatalogModelOpt = Annotated[str, typer.Option("--model", help="Catalog model (short name or Hugging Face id), see models/catalog.py.")]
CatalogGpuOpt = Annotated[str, typer.Option("--gpu", help="Catalog GPU (A6000, A100-80G, H100, H200, L40S, L4, ...).")]
HostOpt = Annotated[str, typer.Option("--host", help="Address to bind (loopback unless told otherwise).")]
PortOpt = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")]


def _say(line: str) -> None:
    """One plain line on stderr (no console layout at all: nothing to interpret or wrap)."""
    sys.stderr.write(" ".join(line.splitlines()) + "\n")


def _fail(error: ScepsyError) -> None:
    _say(f"error: {error}")
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
        _say(f"internal error: {type(error).__name__}: {error} (set SCEPSY_DEBUG=1 for details)")
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
    if not values or not all(0 < v <= MAX_OPTION_VALUE for v in values):
        raise InputError(None, option, f"values must be positive finite numbers up to {MAX_OPTION_VALUE:g}", "write e.g. 1,2,4")
    return values


def _tp_list(value: str) -> list[int]:
    degrees = _float_list(value, "--tp")
    for degree in degrees:
        if degree != int(degree) or degree > 64:
            raise InputError(None, "--tp", f"{degree:g} is not a tensor-parallel degree", "write whole numbers up to 64, e.g. 1,2,4")
    return [int(d) for d in degrees]


def _finite(value: float | None, option: str) -> None:
    """Refuse nan, inf and numbers too large to compute with for a numeric option."""
    if value is not None and not -MAX_OPTION_VALUE <= value <= MAX_OPTION_VALUE:
        raise InputError(None, option, f"{value!r} is not a finite number up to {MAX_OPTION_VALUE:g}", "give a finite value")

def _load(path: Path, objective: Optional[str] = None, welfare: Optional[str] = None):
    """Load an instance, with the objective and welfare overridden from the command line."""
    from scepsy.models.instance import load_instance
    from scepsy.planner.objective import OBJECTIVES, WELFARES

    if objective is not None and objective not in OBJECTIVES:
        raise InputError(None, "--objective", f"unknown objective {objective!r}", f"use one of: {', '.join(OBJECTIVES)}")
    if welfare is not None and welfare not in WELFARES:
        raise InputError(None, "--welfare", f"unknown welfare {welfare!r}", f"use one of: {', '.join(WELFARES)}")
    loaded = load_instance(path)
    return loaded.with_objective(objective or loaded.objective, welfare)


def _emit_json(data: dict, out: Optional[Path], to_stdout: bool, option: str = "--out") -> None:
    text = json.dumps(data, indent=2) + "\n"
    if out is not None:
        write_text(out, text, option=option)
    if to_stdout:
        sys.stdout.write(text)


def _placement_settings(placement: str, time_limit_s: float, workers: int):
    from scepsy.placement.place import METHODS, PlacementSettings

    if placement not in METHODS:
        raise InputError(None, "--placement", f"unknown placement method {placement!r}", f"use one of: {', '.join(METHODS)}")
    return PlacementSettings(method=placement, time_limit_s=time_limit_s, workers=workers)


@app.command()
def plan(
    instance: InstanceArg,
    backend: BackendOpt = "cpsat",
    time_limit_s: TimeLimitOpt = 60.0,
    placement: PlacementOpt = "cpsat",
    placement_time_limit_s: PlacementTimeLimitOpt = 10.0,
    current: CurrentOpt = None,
    workers: WorkersOpt = 1,
    objective: ObjectiveOpt = None,
    welfare: WelfareOpt = None,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Choose GPU type, fraction, TP degree and replicas for every LLM, placed on the cluster."""
    from scepsy.models.report import plan_view
    from scepsy.placement.current import load_current
    from scepsy.placement.place import plan_and_place
    from scepsy.planner.search import PlanSettings

    started_s = time.perf_counter()  # the time limit covers loading and building the options too
    with _errors():
        _finite(time_limit_s, "--time-limit-s")
        _finite(placement_time_limit_s, "--placement-time-limit-s")
        if out is not None:
            check_output(out, [instance, current])
        placing = _placement_settings(placement, placement_time_limit_s, workers)
        loaded = _load(instance, objective, welfare)
        running = load_current(current, loaded.cluster.fractions_per_gpu, loaded.cluster) if current is not None else None
        settings = PlanSettings(backend=backend, time_limit_s=time_limit_s, workers=workers, started_s=started_s)
        with _working(f"planning {instance} with {backend}, placing with {placement}"):
            result = plan_and_place(loaded, settings, placing, running)
        _emit_json(result.to_json(), out, json_output)
        if not json_output:
            stdout.print(plan_view(result))


@app.command()
def place(
    instance: InstanceArg,
    allocation: Annotated[Path, typer.Option("--allocation", help="Allocation YAML (or a plan JSON): llms: [{name, gpu_type, tp, fraction, replicas}].")],
    placement: PlacementOpt = "cpsat",
    placement_time_limit_s: PlacementTimeLimitOpt = 10.0,
    current: CurrentOpt = None,
    workers: WorkersOpt = 1,
    json_output: JsonOpt = False,
    out: OutOpt = None,
) -> None:
    """Place a given allocation on the cluster (what-if); exit code 3 with the reason if it cannot be placed."""
    from scepsy.models.allocation import load_allocation
    from scepsy.models.instance import load_instance
    from scepsy.models.report import placement_view
    from scepsy.placement.current import load_current
    from scepsy.placement.place import place as run_place

    with _errors():
        _finite(placement_time_limit_s, "--placement-time-limit-s")
        if out is not None:
            check_output(out, [instance, allocation, current])
        placing = _placement_settings(placement, placement_time_limit_s, workers)
        loaded = load_instance(instance)
        known = {m.name: set(loaded.cluster.gpu_types) for m in loaded.llms}
        chosen = load_allocation(allocation, loaded.cluster.fractions_per_gpu, known)
        running = load_current(current, loaded.cluster.fractions_per_gpu, loaded.cluster) if current is not None else None
        with _working(f"placing {allocation} with {placement}"):
            result = run_place(loaded.cluster, chosen, placing, running)
        f = chosen.fractions_per_gpu
        document = {
            "instance": str(instance),
            "fractions_per_gpu": f,
            "llms": [
                {"name": c.llm, "gpu_type": c.gpu_type, "tp": c.tp, "fraction": round(c.share / f, 9), "replicas": c.replicas}
                for c in chosen.llms
            ],
            "placement_solver": result.info.to_json(),
            "placement": result.placement.to_json(),
            "fragmentation": [entry.to_json() for entry in result.fragmentation],
        }
        _emit_json(document, out, json_output)
        if not json_output:
            stdout.print(placement_view(result.placement, result.info, result.fragmentation))


@app.command()
def topology(
    node_name: Annotated[Optional[str], typer.Option("--node-name", help="Node name in the cluster file (default: this host's name, as Kubernetes uses it).")] = None,
    gpu_type: Annotated[Optional[str], typer.Option("--gpu-type", help="GPU type name (default: derived from the NVML product name, e.g. H100, A6000).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the node entry (YAML) to this file.")] = None,
    record: Annotated[Optional[Path], typer.Option("--record", help="Also save NVML's raw answers (JSON) to this file, for a bug report or --replay.")] = None,
    replay: Annotated[Optional[Path], typer.Option("--replay", help="Read NVML answers saved with --record instead of this machine's NVML.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Read this GPU node's topology from NVML and write its cluster-file entry (GPUs, NVLink domains, UUIDs)."""
    from scepsy.placement.topology import RecordedNvml, discover, real_nvml, record as record_answers

    with _errors():
        for path, option in ((out, "--out"), (record, "--record")):
            if path is not None:
                check_output(path, [replay], option)
        nvml = RecordedNvml.from_file(replay) if replay is not None else real_nvml()
        found = discover(nvml, node_name, gpu_type)
        if record is not None:
            _emit_json(record_answers(nvml), record, False, "--record")
        text = found.to_yaml()
        if out is not None:
            write_text(out, text)
        if json_output:
            _emit_json(found.to_json(), None, True)
        else:
            sys.stdout.write(text)
        for warning in found.warnings:
            stderr.print(f"warning: {warning}", markup=False, highlight=False, soft_wrap=True)


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
        if out is not None:
            check_output(out, [instance, allocation])
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
        check_output(out, [requests] if kind_of(requests) != "missing" else [])
        card, gpu_card = catalog.model(model), catalog.gpu(gpu)
        tps = _tp_list(tp)
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
        if merge and kind_of(out) != "missing":
            old = read_profile_frame(out)
            keep = ~old.set_index(["gpu_type", "tp"]).index.isin(frame.set_index(["gpu_type", "tp"]).index)
            frame = pd.concat([old[keep], frame], ignore_index=True)
        with writing(out):
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
    from scepsy.models.arrivals import load_arrivals
    from scepsy.models.instance import load_instance
    from scepsy.models.report import simulation_view
    from scepsy.models.simulator import SimulationSettings, simulate as run_simulation
    from scepsy.planner.search import PlanSettings, make_plan

    with _errors():
        for value, option in ((rate, "--rate"), (duration_s, "--duration-s"), (warmup_s, "--warmup-s")):
            _finite(value, option)
        for path, option in ((out, "--out"), (calls_out, "--calls-out")):
            if path is not None:
                check_output(path, [instance, plan, arrivals], option)
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
        timestamps = load_arrivals(arrivals, [w.name for w in loaded.workflows]) if arrivals is not None else None
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
            with writing(calls_out, "--calls-out"), calls_out.open("w") as handle:
                for _, result, _ in results:
                    for call in result.calls:
                        handle.write(json.dumps(call, sort_keys=True) + "\n")
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
        _finite(duration_s, "--duration-s")
        _finite(warmup_s, "--warmup-s")
        for path, option in ((out_csv, "--out-csv"), (out_png, "--out-png")):
            check_output(path, [instance, allocation], option)
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
        with writing(out_csv, "--out-csv"):
            write_sweep(frame, out_csv)
        with writing(out_png, "--out-png"):
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

@app.command()
def manifests(
    plan_file: Annotated[Path, typer.Argument(help="Placed plan JSON (scepsy plan --out).", show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="Directory for the manifests (one object per file + kustomization.yaml).")],
    engine: Annotated[str, typer.Option("--engine", help="Serving engine: vllm or sglang.")] = "vllm",
    gpu_sharing: Annotated[str, typer.Option("--gpu-sharing", help="GPU sharing: hami, dra-mps, device-plugin-mps or none.")] = "hami",
    namespace: NamespaceOpt = "scepsy",
    image: Annotated[Optional[str], typer.Option("--image", help="Engine image (default: vllm/vllm-openai:latest or lmsysorg/sglang:latest).")] = None,
    router_image: Annotated[str, typer.Option("--router-image", help="Image with the sglang-router package (SGLang model gateway).")] = "lmsysorg/sglang:latest",
    router_workers: Annotated[str, typer.Option("--router-workers", help="How routers find engines: discovery (label selectors, needs RBAC) or urls (the LLM Services).")] = "discovery",
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization", help="Fraction of its GPU memory slice an engine may fill (weights + KV cache).")] = 0.9,
    instance: Annotated[Optional[Path], typer.Option("--instance", help="Instance YAML (default: the plan's `instance`).")] = None,
    kubernetes_version: Annotated[str, typer.Option("--kubernetes-version", help="Target cluster version (selects the resource.k8s.io API for dra-mps).")] = "1.34",
    hf_token_secret: Annotated[str, typer.Option("--hf-token-secret", help="Secret (key `token`) with a Hugging Face token; optional at run time.")] = "hf-token",
    hf_cache_pvc: Annotated[Optional[str], typer.Option("--hf-cache-pvc", help="PersistentVolumeClaim for the HF cache (default: an emptyDir per pod).")] = None,
    device_plugin_namespace: Annotated[str, typer.Option("--device-plugin-namespace", help="Namespace of the NVIDIA device plugin (device-plugin-mps config).")] = "nvidia-device-plugin",
    json_output: JsonOpt = False,
) -> None:
    """Write Kubernetes manifests that realise a placed plan (engines, GPU shares, routers)."""
    from scepsy.k8s.manifests import ManifestSettings, emit, write
    from scepsy.k8s.plan_input import load_placed_plan

    with _errors():
        settings = ManifestSettings(
            engine=engine,
            gpu_sharing=gpu_sharing,
            namespace=namespace,
            image=image,
            router_image=router_image,
            router_mode=router_workers,
            gpu_memory_utilization=gpu_memory_utilization,
            hf_token_secret=hf_token_secret,
            hf_cache_pvc=hf_cache_pvc,
            kubernetes_version=kubernetes_version,
            device_plugin_namespace=device_plugin_namespace,
        )
        check_output_dir(out, [plan_file, instance])
        placed = load_placed_plan(plan_file, instance)
        with writing(out / "kustomization.yaml"):
            paths = write(emit(placed, settings), out)
        if json_output:
            _emit_json({"out": str(out), "files": [p.name for p in paths]}, None, True)
        else:
            stdout.print(f"wrote {len(paths)} files to {out} ({len(placed.replicas)} engine replicas, {engine}, {gpu_sharing}); apply with: scepsy deploy {out}", highlight=False)


@app.command()
def deploy(
    directory: Annotated[Path, typer.Argument(help="Manifests directory (scepsy manifests --out).", show_default=False)],
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    dry_run: Annotated[str, typer.Option("--dry-run", help="server: validate on the API server without persisting; none: apply.")] = "none",
    json_output: JsonOpt = False,
) -> None:
    """Apply a manifests directory with server-side apply (field manager `scepsy`), in dependency order."""
    from scepsy.k8s.apply import DRY_RUN_MODES, KubeApplier, connect, deploy as run_deploy, load_manifests

    with _errors():
        if dry_run not in DRY_RUN_MODES:
            raise InputError(None, "--dry-run", f"unknown mode {dry_run!r}", f"use one of: {', '.join(DRY_RUN_MODES)}")
        objects = load_manifests(directory)
        api_client = connect(kubeconfig, context)
        results = run_deploy(objects, KubeApplier(api_client), dry_run=dry_run == "server")
        suffix = " (server dry run)" if dry_run == "server" else ""
        if json_output:
            rows = [{"kind": r.kind, "namespace": r.namespace, "name": r.name, "action": r.action} for r in results]
            _emit_json({"dry_run": dry_run, "objects": rows}, None, True)
        else:
            for r in results:
                stdout.print(f"{r.ref} {r.action}{suffix}", highlight=False, markup=False)


@app.command()
def status(
    namespace: NamespaceOpt = "scepsy",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Show each replica's pod phase and readiness."""
    from rich.table import Table

    from scepsy.k8s.apply import connect, pod_statuses

    with _errors():
        rows = pod_statuses(connect(kubeconfig, context), namespace)
        if json_output:
            _emit_json({"namespace": namespace, "replicas": [r.__dict__ for r in rows]}, None, True)
            return
        table = Table(title=f"scepsy deployments in {namespace}")
        for column in ("deployment", "llm", "replica", "workflow", "node", "phase", "ready", "restarts"):
            table.add_column(column)
        for r in rows:
            table.add_row(r.deployment, r.llm or "-", r.replica or "-", r.workflow or "-", r.node or "-", r.phase, "yes" if r.ready else "no", str(r.restarts))
        stdout.print(table)


@app.command()
def whatif(
    instance: InstanceArg,
    rates: Annotated[str, typer.Option("--rates", help="Total arrival rates, req/s: start:stop:step (inclusive) or a list a,b,c.")],
    clusters: Annotated[str, typer.Option("--clusters", help="Cluster sizes in GPUs (whole nodes of the instance's node kinds), e.g. 4,8,16.")],
    objective: ObjectiveOpt = None,
    backend: BackendOpt = "cpsat",
    time_limit_s: TimeLimitOpt = 60.0,
    workers: Annotated[int, typer.Option("--workers", min=1, max=256, help="Grid points planned in parallel processes, 1 to 256.")] = 1,
    out: Annotated[Optional[Path], typer.Option("--out", help="Tidy table, .csv or .parquet (one row per point and LLM).")] = None,
    plots: Annotated[Optional[Path], typer.Option("--plots", help="Directory for the PNG plots.")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Plan a grid of arrival rates and cluster sizes: what load needs which cluster."""
    from rich.progress import Progress

    from scepsy.planner.search import PlanSettings
    from scepsy.planner.whatif import cheapest_clusters, parse_clusters, parse_rates, plot_grid, run_grid, write_table

    with _errors():
        _finite(time_limit_s, "--time-limit-s")
        if out is not None:
            check_output(out, [instance])
        if plots is not None:
            check_output_dir(plots, [instance], "--plots")
        loaded = _load(instance, objective)
        rate_list, sizes = parse_rates(rates), parse_clusters(clusters)
        settings = PlanSettings(backend=backend, time_limit_s=time_limit_s)
        with Progress(console=stderr, transient=True, disable=not stderr.is_terminal) as bar:
            task = bar.add_task("planning the grid", total=len(rate_list) * len(sizes))
            frame = run_grid(loaded, rate_list, sizes, settings, workers, lambda done, total: bar.update(task, completed=done))
        if out is not None:
            with writing(out):
                write_table(frame, out)
        if plots is not None:
            with writing(plots / "plot.png", "--plots"):
                for path in plot_grid(frame, plots):
                    stderr.print(f"wrote {path}")
        if json_output:
            sys.stdout.write(frame.to_json(orient="records", indent=2) + "\n")
        else:
            stdout.print(_grid_table(frame, cheapest_clusters(frame)))


def _grid_table(frame, best):
    from rich.table import Table

    table = Table(title="What-if grid (one line per point)")
    for column in ("rate_rps", "cluster_gpus", "feasible", "latency_s", "max_throughput_rps", "gpus_used", "cheapest"):
        table.add_column(column, justify="right")
    cheapest = set(zip(best["rate_rps"], best["cluster_gpus"]))
    for _, row in frame.drop_duplicates(["rate_rps", "cluster_gpus"]).iterrows():
        ok = bool(row["feasible"])
        table.add_row(
            f"{row['rate_rps']:g}", str(row["cluster_gpus"]), "yes" if ok else "no",
            f"{row['workflow_latency_s']:.3f}" if ok else "-",
            f"{row['workflow_max_throughput_rps']:.3f}" if ok else "-",
            f"{int(row['gpus_used'])}" if ok else "-",
            "*" if (row["rate_rps"], row["cluster_gpus"]) in cheapest else "",
        )
    return table


# ---------------------------------------------------------------------------------------------
# Measurement: tracing proxy, traces, workflow statistics, replay profiling (docs/tracing.md)


traces_app = typer.Typer(help="Inspect and export recorded traces.", no_args_is_help=True)
app.add_typer(traces_app, name="traces")
# `profiles import` joins the `profiles` group defined at the top (with `profiles synthesize`): a
# second group of the same name would hide the first one's commands.


def _parse_upstreams(values: list[str]) -> dict[str, str]:
    upstreams: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise InputError(None, "--upstream", f"{value!r} is not NAME=URL", "write e.g. --upstream gen=http://127.0.0.1:8001")
        if name in upstreams:
            raise InputError(None, "--upstream", f"llm {name!r} given twice", "name each upstream once")
        upstreams[name] = url
    if not upstreams:
        raise InputError(None, "--upstream", "no upstream given", "add --upstream NAME=URL for each LLM")
    return upstreams


def _parse_llm_names(values: list[str]) -> dict[str, str]:
    names = {}
    for value in values:
        model, sep, llm = value.partition("=")
        if not sep or not model or not llm:
            raise InputError(None, "--llm-name", f"{value!r} is not MODEL=LLM", "write e.g. --llm-name meta-llama/Llama-3.2-1B=gen")
        names[model] = llm
    return names


@app.command()
def proxy(
    upstream: Annotated[list[str], typer.Option("--upstream", help="LLM name and engine base URL, NAME=URL (repeat per LLM).")],
    port: PortOpt = 9000,
    host: HostOpt = "127.0.0.1",
    store: Annotated[Path, typer.Option("--store", help="SQLite trace store (WAL mode).")] = Path("traces.db"),
    no_bodies: Annotated[bool, typer.Option("--no-bodies", help="Do not record request/response bodies (traces then cannot be replayed).")] = False,
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1, help="Answer 504 when an upstream sends nothing for this long.")] = 600.0,
    max_body_mib: Annotated[float, typer.Option("--max-body-mib", min=0.0, help="Store request/response bodies up to this size, MiB (larger ones: only their sizes).")] = 16.0,
) -> None:
    """Run the tracing proxy in front of OpenAI-compatible engines (until Ctrl-C)."""
    from scepsy.tracing.proxy import ProxyConfig, serve
    from scepsy.tracing.store import TraceStore

    with _errors():
        _finite(timeout_s, "--timeout-s")
        _finite(max_body_mib, "--max-body-mib")
        upstreams = _parse_upstreams(upstream)
        try:
            trace_store = TraceStore(store)
        except Exception as exc:  # noqa: BLE001 - sqlite errors become one line
            raise InputError(str(store), None, f"cannot open the trace store ({exc})", "choose a writable --store path") from None
        routes = ", ".join(f"{name}={url} (/{name}/v1/...)" for name, url in sorted(upstreams.items()))
        stderr.print(f"scepsy proxy on http://{host}:{port}: {routes}; recording to {store}", markup=False, highlight=False)
        try:
            config = ProxyConfig(upstreams, store=trace_store, record_bodies=not no_bodies, timeout_s=timeout_s,
                                 max_body_bytes=int(max_body_mib * 2**20))
            serve(config, host=host, port=port)
        finally:
            trace_store.close()
            stderr.print(f"recorded {trace_store.written} calls to {store}" + (f" ({trace_store.write_errors} failed to write)" if trace_store.write_errors else ""), markup=False)


@app.command()
def emulate(
    model: CatalogModelOpt,
    gpu: CatalogGpuOpt,
    tp: TpOpt = 1,
    fraction: FractionOpt = 1.0,
    port: PortOpt = 8000,
    host: HostOpt = "127.0.0.1",
    served_model_name: Annotated[list[str], typer.Option("--served-model-name", help="Name clients put in the `model` field (repeat for several; default: the model's Hugging Face id).")] = [],
    max_model_len: Annotated[Optional[int], typer.Option("--max-model-len", min=2, help="Longest prompt + completion, tokens (default: the model's context, capped by the KV cache).")] = None,
    speedup: Annotated[float, typer.Option("--speedup", help="Run the modelled clock this many times faster than the wall clock (every modelled time is divided by it).")] = 1.0,
    mean_output_tokens: Annotated[float, typer.Option("--mean-output-tokens", min=0.0, help="Draw each sequence's end from a geometric length of this mean (0: sequences run to max_tokens).")] = 0.0,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching", help="Reuse the KV cache of earlier prompts and outputs (vLLM's default).")] = True,
) -> None:
    """Serve an OpenAI-compatible engine emulator whose timing follows the engine model (until Ctrl-C)."""
    from scepsy.tracing.emulator import emulator_config, serve

    with _errors():
        config = emulator_config(model, gpu, tp, fraction, served_model_name, max_model_len, speedup,
                                 mean_output_tokens, prefix_caching)
        stderr.print(f"scepsy emulate on http://{host}:{port}: {config.describe()}", markup=False, highlight=False, soft_wrap=True)
        serve(config, host=host, port=port)


@traces_app.command("export")
def traces_export(
    traces: TracesArg,
    out: Annotated[Path, typer.Option("--out", help="Output file.")],
    fmt: Annotated[str, typer.Option("--format", help="jsonl or parquet.")] = "jsonl",
    no_bodies: Annotated[bool, typer.Option("--no-bodies", help="Leave request/response bodies out.")] = False,
) -> None:
    """Export traces as JSONL (one call per line) or Parquet."""
    from scepsy.tracing.traces import export_traces, load_traces

    with _errors():
        if fmt not in ("jsonl", "parquet"):
            raise InputError(None, "--format", f"unknown format {fmt!r}", "use jsonl or parquet")
        check_output(out, traces)
        calls = load_traces(traces)
        with writing(out):
            count = export_traces(calls, out, fmt, bodies=not no_bodies)
        stderr.print(f"wrote {count} calls to {out}", markup=False)


@app.command()
def aggregate(
    traces: TracesArg,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the statistics as YAML (each workflow's `stages` drops into an instance).")] = None,
    workflow: Annotated[str, typer.Option("--workflow", help="Workflow name for calls sent without an X-Workflow-Name header.")] = "workflow",
    llm_name: Annotated[list[str], typer.Option("--llm-name", help="OTLP spans: map a gen_ai.request.model to an LLM name, MODEL=LLM.")] = [],
    json_output: JsonOpt = False,
) -> None:
    """Per workflow and LLM: invocations n, parallelism p, their spread and time shares."""
    import yaml

    from scepsy.tracing.stats import aggregate as run_aggregate, stats_to_dict, stats_view
    from scepsy.tracing.traces import load_traces

    with _errors():
        if out is not None:
            check_output(out, traces)
        stats = run_aggregate(load_traces(traces, _parse_llm_names(llm_name)), default_workflow=workflow)
        if not stats.workflows:
            raise InputError(", ".join(map(str, traces)), None, "no completed call carries a workflow request id",
                             "send X-Workflow-Id (or a W3C traceparent) with every LLM call of a workflow request")
        data = stats_to_dict(stats)
        if out is not None:
            write_text(out, f"# scepsy aggregate {' '.join(map(str, traces))}\n" + yaml.safe_dump(data, sort_keys=False))
        if json_output:
            sys.stdout.write(json.dumps(data, indent=2) + "\n")
        else:
            stdout.print(stats_view(stats))


def _parse_rates(value: str) -> tuple[float, ...] | None:
    if value.strip() == "auto":
        return None
    try:
        rates = tuple(float(v) for v in value.split(",") if v.strip())
    except ValueError:
        rates = ()
    if not rates or any(not 0 < r <= MAX_OPTION_VALUE for r in rates):
        raise InputError(None, "--rates", f"{value!r} is not auto or a list of positive rates", "write auto or e.g. 0.5,1,2,4")
    return rates


def _write_profile_rows(rows, out: Path) -> None:
    from scepsy.models.profile import read_profile_frame, write_profile
    from scepsy.tracing.replay import merge_profile_rows

    check_output(out)
    existing = read_profile_frame(out) if kind_of(out) != "missing" else None
    with writing(out):
        write_profile(merge_profile_rows(existing, rows), out)


@app.command()
def profile(
    traces: Annotated[list[Path], typer.Option("--traces", help="Trace files with request bodies (repeat for several).")],
    llm: Annotated[str, typer.Option("--llm", help="The LLM whose calls are replayed.")],
    endpoint: Annotated[str, typer.Option("--endpoint", help="Base URL of the engine to profile, e.g. http://127.0.0.1:8001.")],
    gpu_type: GpuTypeOpt,
    out: Annotated[Path, typer.Option("--out", help="Profile CSV; rows of other (gpu_type, tp, fraction) already in it are kept.")],
    tp: TpOpt = 1,
    fraction: FractionOpt = 1.0,
    rates: Annotated[str, typer.Option("--rates", help="auto (light load, doubling to saturation, then bisecting) or a list of calls/s, e.g. 0.5,1,2.")] = "auto",
    duration_s: Annotated[float, typer.Option("--duration-s", min=0.1, help="Nominal length of each rate point.")] = 60.0,
    min_requests: Annotated[int, typer.Option("--min-requests", min=1, help="At least this many workflow requests per rate point.")] = 5,
    model: Annotated[Optional[str], typer.Option("--model", help="Replace the `model` field of replayed requests (the engine's served name).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the arrival process and request order.")] = 0,
    arrivals: Annotated[str, typer.Option("--arrivals", help="Workflow request arrivals: poisson, or uniform (1 / rate apart).")] = "poisson",
    timeout_s: Annotated[float, typer.Option("--timeout-s", min=0.1, help="Per-call timeout.")] = 600.0,
    json_output: JsonOpt = False,
) -> None:
    """Replay an LLM's traced calls at a sweep of arrival rates and write its profile rows."""
    import asyncio

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from scepsy.tracing.replay import Sweep, SweepSettings, auto_start_rate, probe_service_time, profile_rows, replay_requests
    from scepsy.tracing.traces import load_traces

    with _errors():
        if not 0 < fraction <= 1:
            raise InputError(None, "--fraction", f"{fraction} is not in (0, 1]", "give the GPU share per shard, e.g. 0.5")
        if arrivals not in ("poisson", "uniform"):
            raise InputError(None, "--arrivals", f"unknown arrival process {arrivals!r}", "use poisson or uniform")
        _finite(duration_s, "--duration-s")
        _finite(timeout_s, "--timeout-s")
        check_output(out, traces)
        settings = SweepSettings(rates_rps=_parse_rates(rates), duration_s=duration_s, min_requests=min_requests,
                                 seed=seed, timeout_s=timeout_s, model=model, arrivals=arrivals)
        calls = load_traces(traces)
        requests = replay_requests(calls, llm, model)
        start_rate = 1.0
        if settings.rates_rps is None:
            start_rate = auto_start_rate(asyncio.run(probe_service_time(requests, endpoint, timeout_s=timeout_s)))
        sweep = Sweep(requests, endpoint, settings, start_rate)
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=stderr, disable=not stderr.is_terminal) as progress:
            task = {"id": None}

            def on_point(rate: float, expected: int) -> None:
                task["id"] = progress.add_task(f"{llm} at {rate:.3g} calls/s", total=expected)

            def on_call() -> None:
                progress.advance(task["id"])

            points = asyncio.run(sweep.run(on_point, on_call))
        rows = profile_rows(points, gpu_type, tp, fraction)
        _write_profile_rows(rows, out)
        data = [{"target_rate_rps": p.target_rate_rps, "arrival_rate_rps": p.arrival_rate_rps, "throughput_rps": p.throughput_rps,
                 "calls": p.calls, "failed": p.failed, "latency_mean_s": p.latency_s["mean"], "latency_p99_s": p.latency_s["p99"],
                 "saturated": p.saturated} for p in points]
        if json_output:
            sys.stdout.write(json.dumps({"llm": llm, "out": str(out), "points": data}, indent=2) + "\n")
        else:
            from rich.table import Table

            table = Table(title=f"Replay profile of {llm} ({gpu_type}, tp={tp}, fraction={fraction:g}) -> {out}")
            for column in ("arrival_rate_rps", "throughput_rps", "calls", "failed", "latency_mean_s", "latency_p99_s", "saturated"):
                table.add_column(column, justify="right")
            for p in sorted(data, key=lambda p: p["arrival_rate_rps"]):
                table.add_row(f"{p['arrival_rate_rps']:.3f}", f"{p['throughput_rps']:.3f}", str(p["calls"]), str(p["failed"]),
                              f"{p['latency_mean_s']:.3f}", f"{p['latency_p99_s']:.3f}", "yes" if p["saturated"] else "no")
            stdout.print(table)


@profiles_app.command("import")
def profiles_import(
    files: Annotated[list[Path], typer.Argument(help="vllm bench serve result JSON files and/or sglang.bench_serving JSONL files.", show_default=False)],
    gpu_type: GpuTypeOpt,
    out: Annotated[Path, typer.Option("--out", help="Profile CSV; rows of other (gpu_type, tp, fraction) already in it are kept.")],
    tp: TpOpt = 1,
    fraction: FractionOpt = 1.0,
) -> None:
    """Import benchmark results (one row per run) into the profile CSV format."""
    from scepsy.tracing.benchimport import import_bench_results

    with _errors():
        if not 0 < fraction <= 1:
            raise InputError(None, "--fraction", f"{fraction} is not in (0, 1]", "give the GPU share per shard, e.g. 0.5")
        check_output(out, files)
        result = import_bench_results(files, gpu_type, tp, fraction)
        _write_profile_rows(result.rows, out)
        for line in result.notes + [f"skipped {s}" for s in result.skipped]:
            stderr.print(f"note: {line}", markup=False, highlight=False)
        stderr.print(f"wrote {len(result.rows)} rows for {gpu_type} tp={tp} fraction={fraction:g} to {out}", markup=False)


def main(argv: Optional[list[str]] = None) -> None:
    """Run the command line; a usage error (bad option value, missing argument) is one plain line
    with exit code 2 like any other bad input, not a framed box."""
    try:
        code = app(args=argv, prog_name="scepsy", standalone_mode=False)
    except _usage_errors() as exc:
        context = getattr(exc, "ctx", None)
        where = f" (see {context.command_path} --help)" if context is not None else ""
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        _say(f"error: {message}{where}")
        sys.exit(getattr(exc, "exit_code", 2))
    except typer.Abort:
        _say("aborted")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


def _usage_errors() -> tuple[type[Exception], ...]:
    """The exception classes of usage errors: click's, or typer's own where it vendors click."""
    import click

    return (click.ClickException,) + ((typer.TyperException,) if hasattr(typer, "TyperException") else ())


if __name__ == "__main__":
    main()
