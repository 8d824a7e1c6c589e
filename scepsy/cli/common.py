"""What every command shares: option types, the error boundary (one line and an exit code, never a
traceback, the arguments an error names shown as this command's options), the spinner and progress
bar, list parsing and JSON output through the one writer."""

from __future__ import annotations

import json
import os
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Callable, Iterator, Optional

import typer
from rich.console import Console

from scepsy.models.errors import InputError, ScepsyError, ScepsyWarning, renamed
from scepsy.models.output import check_output, write_text

# Wide enough for the tables when piped; a terminal keeps its own width. User-given text (names,
# paths) is printed as it is: no markup, emoji codes or highlighting; stderr lines never wrap.
stdout = Console(width=None if sys.stdout.isatty() else 160, markup=False, emoji=False, highlight=False)
stderr = Console(stderr=True, soft_wrap=True, markup=False, emoji=False, highlight=False)
MAX_OPTION_VALUE = 1e9  # rates, load factors, seconds: beyond it lies no real workload, only overflow

# The option of each argument name an error may carry (scepsy.api's keyword arguments, the library's
# settings fields): `field` for every command, or `command field` where one command spells it
# differently. An error's argument names are shown through this table and no other
# (tests/test_cli_api.py checks that every option here exists).
FLAGS: dict[str, str] = {
    "address": "--address",
    "allocation": "--allocation",
    "simulate allocation": "--plan",
    "arrivals": "--arrivals",
    "backend": "--backend",
    "baselines": "--baselines",
    "calls_out": "--calls-out",
    "clusters": "--clusters",
    "context": "--context",
    "database_version": "--database-version",
    "device_plugin_namespace": "--device-plugin-namespace",
    "dry_run": "--dry-run",
    "duration_s": "--duration-s",
    "endpoint": "--endpoint",
    "engine": "--engine",
    "engine_model": "--engine-model",
    "period_s": "--period-s",
    "prometheus_url": "--prometheus-url",
    "selector": "--prometheus-selector",
    "prometheus_selector": "--prometheus-selector",
    "act": "--act",
    "controller_image": "--controller-image",
    "metrics_port": "--metrics-port",
    "metrics_host": "--metrics-host",
    "settings_file": "--settings",
    "setting": "--setting",
    "prometheus_bearer_token_file": "--prometheus-bearer-token-file",
    "prometheus_ca_file": "--prometheus-ca-file",
    "prometheus_verify_tls": "--prometheus-tls-verify",
    "prometheus_headers": "--prometheus-header",
    "leader_identity": "--leader-identity",
    "log": "--log",
    "periods": "--periods",
    "ready_timeout_s": "--ready-timeout-s",
    "plot": "--plot",
    "predictor": "--predictor",
    "simulate": "--simulate",
    "startup_s": "--startup-s",
    "control plan": "--plan",
    "endpoint_picker": "--endpoint-picker",
    "executor": "--executor",
    "files": "FILES",
    "format": "--format",
    "fraction": "--fraction",
    "fractions": "--fractions",
    "gateway_image": "--gateway-image",
    "gateway_name": "--gateway-name",
    "gateway_namespace": "--gateway-namespace",
    "gateway_provider": "--gateway-provider",
    "gpu": "--gpu",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "gpu_sharing": "--gpu-sharing",
    "gpu_type": "--gpu-type",
    "profiles synthesize gpu_type": "--gpu-type-name",
    "growth_per_month": "--growth-per-month",
    "hf_cache_pvc": "--hf-cache-pvc",
    "hf_token_secret": "--hf-token-secret",
    "image": "--image",
    "instance": "INSTANCE",
    "manifests instance": "--instance",
    "kubeconfig": "--kubeconfig",
    "kubernetes_version": "--kubernetes-version",
    "llm": "--llm",
    "llm_names": "--llm-name",
    "load_factors": "--load-factors",
    "max_body_mib": "--max-body-mib",
    "max_model_len": "--max-model-len",
    "mean_output_tokens": "--mean-output-tokens",
    "mix": "--mix",
    "model": "--model",
    "months": "--months",
    "namespace": "--namespace",
    "objective": "--objective",
    "out": "--out",
    "out_csv": "--out-csv",
    "out_png": "--out-png",
    "personality": "--personality",
    "picker_replicas": "--picker-replicas",
    "placement": "--placement",
    "placement_time_limit_s": "--placement-time-limit-s",
    "plots": "--plots",
    "price": "--price",
    "rate": "--rate",
    "rate_rps": "--rate",
    "rates": "--rates",
    "record": "--record",
    "record_calls": "--calls-out",
    "replay": "--replay",
    "requests": "--requests",
    "router": "--router",
    "routing": "--routing",
    "scheduling": "--scheduling",
    "shm_gib": "--shm-gib",
    "speedup": "--speedup",
    "store": "--store",
    "time_limit_s": "--time-limit-s",
    "timeout_s": "--timeout-s",
    "tp": "--tp",
    "traces": "TRACES",
    "profile traces": "--traces",
    "upstreams": "--upstream",
    "max_in_flight": "--max-in-flight",
    "entry_image": "--entry-image",
    "entry": "--entry",
    "untagged_share": "--untagged-share",
    "warmup_s": "--warmup-s",
    "weights": "--weights",
    "welfare": "--welfare",
    "workflow_attribute": "--workflow-attribute",
    "workflow_done_s": "--workflow-done-s",
}

# Shared options, defined once
InstanceArg = Annotated[Path, typer.Argument(help="Instance YAML (cluster, llms, workflows).", show_default=False)]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON instead of tables.")]
OutOpt = Annotated[Optional[Path], typer.Option("--out", help="Also write the JSON result to this file.")]
BackendOpt = Annotated[str, typer.Option("--backend", help="Allocation search: cpsat, milp, enumerate or bruteforce.")]
ObjectiveOpt = Annotated[Optional[str], typer.Option("--objective", help="Override the instance's objective: min_latency, max_throughput, min_gpus, min_cost or min_units.")]
WelfareOpt = Annotated[Optional[str], typer.Option("--welfare", help="Override how several workflows combine: egalitarian or social.")]
TimeLimitOpt = Annotated[float, typer.Option("--time-limit-s", min=0.01, help="Stop searching after this many seconds and return the best plan with its gap.")]
WorkersOpt = Annotated[int, typer.Option("--workers", min=1, max=256, help="Solver threads, 1 to 256 (results stay deterministic).")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed (same seed, same result).")]
DurationOpt = Annotated[float, typer.Option("--duration-s", min=1.0, help="Simulated seconds of arrivals.")]
WarmupOpt = Annotated[Optional[float], typer.Option("--warmup-s", min=0.0, help="Requests arriving before this are not measured (default: 10% of the duration).")]
AllocationOpt = Annotated[Path, typer.Option("--allocation", help="Allocation YAML (or a plan JSON): llms: [{name, gpu_type, tp, fraction, replicas}].")]
KubeconfigOpt = Annotated[Optional[Path], typer.Option("--kubeconfig", help="Kubeconfig file (default: $KUBECONFIG or ~/.kube/config).")]
ContextOpt = Annotated[Optional[str], typer.Option("--context", help="Kubeconfig context (default: the current one).")]
NamespaceOpt = Annotated[str, typer.Option("--namespace", help="Namespace of the deployment.")]
PlacementOpt = Annotated[str, typer.Option("--placement", help="Placement: cpsat (exact, least fragmented, the heuristic as hint) or heuristic (the paper's).")]
PlacementTimeLimitOpt = Annotated[float, typer.Option("--placement-time-limit-s", min=0.01, help="Stop the placement search after this many seconds and keep the best placement with its gap.")]
CurrentOpt = Annotated[Optional[Path], typer.Option("--current", help="Re-plan: the running placement (a previous plan JSON or its placement list); replicas that can stay where they are, stay.")]
TracesArg = Annotated[list[Path], typer.Argument(help="Trace files: proxy stores (.db), .jsonl/.parquet exports, OpenTelemetry OTLP files (JSON or protobuf, any name, plain, zstd or gzip).", show_default=False)]
GpuTypeOpt = Annotated[str, typer.Option("--gpu-type", help="GPU type the profile rows are for (a name of the instance's cluster.gpu_types).")]
TpOpt = Annotated[int, typer.Option("--tp", min=1, help="Tensor-parallel degree of the replica (profiled or emulated).")]
FractionOpt = Annotated[float, typer.Option("--fraction", min=0.0, max=1.0, help="GPU fraction per shard of the replica (profiled or emulated), in (0, 1].")]
CatalogModelOpt = Annotated[str, typer.Option("--model", help="Catalog model (short name or Hugging Face id, see models/catalog/catalog.py), or a local config.json or model directory.")]
CatalogGpuOpt = Annotated[str, typer.Option("--gpu", help="Catalog GPU (A6000, A100-80G, H100, H200, B200, L40S, L4, ...).")]
WeightsOpt = Annotated[Optional[str], typer.Option("--weights", help="Weight precision: bf16, fp8 or int4 (default: the config's quantization, else bf16).")]
EngineModelOpt = Annotated[str, typer.Option("--engine-model", help="builtin (roofline) or aiconfigurator (NVIDIA's measured kernel database; pip install 'scepsy[aiconfigurator]').")]
EngineBackendOpt = Annotated[str, typer.Option("--backend", help="With --engine-model aiconfigurator: vllm, sglang or trtllm.")]
DatabaseVersionOpt = Annotated[str, typer.Option("--database-version", help="With --engine-model aiconfigurator: the framework version of its database (current, previous, next or a version).")]
SchedulingOpt = Annotated[str, typer.Option("--scheduling", help="The generating engines' waiting queue: priority (older workflow requests first: vLLM --scheduling-policy priority, SGLang --enable-priority-scheduling, calls tagged by scepsy proxy --workflow-priority; what scepsy manifests deploys) or fcfs (the engines' default).")]
HostOpt = Annotated[str, typer.Option("--host", help="Address to bind (loopback unless told otherwise).")]
PortOpt = Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")]
# the controller's reading of Prometheus and its settings (scepsy control, live and --simulate)
PrometheusTokenOpt = Annotated[Optional[Path], typer.Option("--prometheus-bearer-token-file", help="Live: file whose content is sent as `Authorization: Bearer` to Prometheus (re-read on every query: a projected token rotates).")]
PrometheusCaOpt = Annotated[Optional[Path], typer.Option("--prometheus-ca-file", help="Live: CA bundle (PEM) that signed an https Prometheus' certificate (default: the system's).")]
PrometheusVerifyOpt = Annotated[bool, typer.Option("--prometheus-tls-verify/--prometheus-no-tls-verify", help="Live: verify Prometheus' TLS certificate (turn off only for a test server).")]
PrometheusHeaderOpt = Annotated[Optional[list[str]], typer.Option("--prometheus-header", help="Live: extra request header to Prometheus, 'Name: value' (repeatable), e.g. 'X-Scope-OrgID: tenant-1'.")]
SettingsFileOpt = Annotated[Optional[Path], typer.Option("--settings", help="YAML file of the policy's knobs (knob: value per line); `scepsy control --help` lists them with their defaults.")]
SettingOpt = Annotated[Optional[list[str]], typer.Option("--setting", help="A knob of the policy, NAME=VALUE (repeatable; over --settings), e.g. headroom=0.2.")]


# optional dependencies (pyproject.toml extras): the module, and the extra that installs it
EXTRAS = {
    "aiohttp": "tracing", "pyarrow": "tracing", "pynvml": "tracing",
    "kubernetes": "k8s", "kubernetes_validate": "k8s",
    "langgraph": "examples", "openai": "examples",
    "dask": "dask", "distributed": "dask",
    "filterpy": "control", "scipy": "control",
}


def say(line: str) -> None:
    """One plain line on stderr (no console layout at all: nothing to interpret or wrap)."""
    sys.stderr.write(" ".join(line.splitlines()) + "\n")


def command_name() -> str:
    """The running command without the program's name (`plan`, `profiles synthesize`); empty
    outside a command."""
    import importlib

    try:  # typer vendors click in recent releases; in older ones the context is click's own
        globals_module = importlib.import_module("typer._click.globals")
    except ImportError:
        globals_module = importlib.import_module("click.globals")
    context = globals_module.get_current_context(silent=True)
    return " ".join(context.command_path.split()[1:]) if context is not None else ""


def flag(field: str, command: str | None = None) -> str:
    """The option of an argument name in `command` (default: the running one), through FLAGS; a
    name without an option stays as it is."""
    command = command_name() if command is None else command
    return FLAGS.get(f"{command} {field}") or FLAGS.get(field) or field


def warn(line: str) -> None:
    """A warning of the library on stderr, the argument names it mentions shown as this command's
    options (as `fail` shows an error's)."""
    command = command_name()
    say(f"warning: {renamed(line, lambda field: flag(field, command))}")


def fail(error: ScepsyError) -> None:
    command = command_name()
    say(f"error: {error.render(lambda field: flag(field, command))}")
    raise typer.Exit(error.exit_code)


@contextmanager
def errors() -> Iterator[None]:
    """Map scepsy's typed errors to one line and an exit code; never show a traceback. Warnings
    of scepsy's own (ScepsyWarning) are one `warning:` line each on stderr, each text once."""
    with _scepsy_warnings():
        yield from _mapped_errors()


@contextmanager
def _scepsy_warnings() -> Iterator[None]:
    shown: set[str] = set()
    original = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if not issubclass(category, ScepsyWarning):
            original(message, category, filename, lineno, file, line)
        elif str(message) not in shown:
            shown.add(str(message))
            warn(str(message))

    with warnings.catch_warnings():
        warnings.simplefilter("always", ScepsyWarning)
        warnings.showwarning = show
        yield


def _mapped_errors() -> Iterator[None]:
    try:
        yield
    except ScepsyError as error:
        fail(error)
    except (typer.Exit, typer.Abort, KeyboardInterrupt):
        raise
    except Exception as error:  # noqa: BLE001 - last line of defence for the no-traceback promise
        missing = (error.name or "").split(".")[0] if isinstance(error, ModuleNotFoundError) else ""
        if missing in EXTRAS:
            fail(InputError(None, None, f"this command needs {missing}, an optional dependency",
                            f"pip install 'scepsy[{EXTRAS[missing]}]'"))
        if os.environ.get("SCEPSY_DEBUG"):
            raise
        say(f"internal error: {type(error).__name__}: {error} (set SCEPSY_DEBUG=1 for details)")
        raise typer.Exit(1)


@contextmanager
def working(message: str) -> Iterator[None]:
    """A spinner on stderr for work that may take over a second (only on a terminal)."""
    if stderr.is_terminal:
        with stderr.status(message):
            yield
    else:
        yield


Advance = Callable[..., None]


@contextmanager
def progress(description: str, total: float) -> Iterator[Advance]:
    """The progress bar on stderr (only on a terminal); yields advance(completed=None, text=None,
    total=None, of=None): one step, or to `completed`; `text` after the description; `total`
    restarts it, `of` sets it without restarting."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
        console=stderr, transient=True, disable=not stderr.is_terminal,
    ) as bar:
        task = bar.add_task(description, total=total)

        def advance(completed: float | None = None, text: str | None = None, total: float | None = None,
                    of: float | None = None) -> None:
            if total is not None:
                bar.reset(task, total=total)
            if of is not None:
                bar.update(task, total=of)
            if completed is None and total is None:
                bar.advance(task)
            elif completed is not None:
                bar.update(task, completed=completed)
            if text:
                bar.update(task, description=f"{description}: {text}")

        yield advance


def split_list(value: str) -> list[str]:
    """The items of a comma-separated option value."""
    return [item.strip() for item in value.split(",") if item.strip()]


def number_list(value: str, field: str, example: str = "1,2,4") -> list[float]:
    """A comma-separated list of positive numbers (`field`: the argument it gives)."""
    try:
        values = [float(x) for x in split_list(value)]
    except ValueError:
        raise InputError(None, field, f"{value!r} is not a comma-separated list of numbers", f"write e.g. {example}") from None
    if not values or not all(0 < v <= MAX_OPTION_VALUE for v in values):
        raise InputError(None, field, f"values must be positive finite numbers up to {MAX_OPTION_VALUE:g}", f"write e.g. {example}")
    return values


def tp_list(value: str) -> list[int]:
    """Tensor-parallel degrees: whole numbers up to 64."""
    degrees = number_list(value, "tp")
    for degree in degrees:
        if degree != int(degree) or degree > 64:
            raise InputError(None, "tp", f"{degree:g} is not a tensor-parallel degree", "write whole numbers up to 64, e.g. 1,2,4")
    return [int(d) for d in degrees]


def check_out(out: Optional[Path], inputs: list[Optional[Path]]) -> None:
    """Refuse a --out that is one of the command's inputs, before the command works."""
    if out is not None:
        check_output(out, inputs)


def emit_json(data: object, out: Optional[Path], to_stdout: bool) -> None:
    """The JSON a command prints: to stdout (--json) and/or to the file --out."""
    text = json.dumps(data, indent=2) + "\n"
    if out is not None:
        write_text(out, text)
    if to_stdout:
        sys.stdout.write(text)
