"""Simulation (`scepsy simulate`): the workflows' control flow on an allocation, at one rate or
several, with the pipeline's prediction beside each run."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from scepsy.api.plan import AllocationLike, InstanceLike, PathLike, allocation_of, load, predict
from scepsy.models.arguments import check_choice, check_finite
from scepsy.models.errors import InputError
from scepsy.models.output import check_output, json_number
from scepsy.models.performance.alp import Prediction
from scepsy.models.simulation.arrivals import load_arrivals
from scepsy.models.performance.replica import SCHEDULING_POLICIES
from scepsy.models.simulation.simulator import DEFAULT_SCHEDULING, SimulationResult, SimulationSettings, write_calls
from scepsy.models.simulation.simulator import simulate as simulate_allocation


def simulate(
    instance: InstanceLike,
    allocation: AllocationLike | None = None,
    *,
    rate_rps: float | None = None,
    settings: SimulationSettings = SimulationSettings(),
    arrivals: Mapping[str, Sequence[float]] | None = None,
    record_calls: bool = False,
    progress: Callable[[float], None] | None = None,
) -> SimulationResult:
    """Run the workflows' control flow on an allocation; without one, plan it first; `rate_rps`
    sets every workflow's arrival rate (`simulate_rates` runs several rates, as `scepsy simulate`)."""
    check_finite(rate_rps, "rate_rps")
    loaded = load(instance)
    chosen = allocation_of(loaded, allocation)
    if rate_rps is not None:
        loaded = loaded.with_arrival_rates({w.name: rate_rps for w in loaded.workflows})
    return simulate_allocation(loaded, chosen, settings, arrivals=arrivals, record_calls=record_calls, progress=progress)


ROUTINGS = ("cache_aware", "least_outstanding")


def simulation_settings(duration_s: float = 300.0, warmup_s: float | None = None, seed: int = 0,
                        routing: str = "cache_aware", engine_model: str = "builtin", backend: str = "vllm",
                        database_version: str = "current", scheduling: str = DEFAULT_SCHEDULING,
                        untagged_share: float = 0.0) -> SimulationSettings:
    """Settings of a simulation, checked (`duration_s`, `warmup_s`, `routing`, `scheduling`, ...)."""
    check_finite(duration_s, "duration_s")
    check_finite(warmup_s, "warmup_s")
    check_choice(routing, ROUTINGS, "routing", "routing")
    check_choice(scheduling, SCHEDULING_POLICIES, "scheduling", "scheduling policy")
    return SimulationSettings(duration_s=duration_s, warmup_s=warmup_s, seed=seed, routing=routing,
                              engine_model=engine_model, backend=backend, database_version=database_version,
                              scheduling=scheduling, untagged_share=untagged_share)


@dataclass(frozen=True)
class SimulatedRun:
    """One simulation at one rate, with the pipeline's prediction beside it (None where an LLM's
    configuration has no profile curve)."""

    rate_rps: float | None  # None: the instance's own rates
    result: SimulationResult
    prediction: Prediction | None


def _run_document(run: SimulatedRun) -> dict:
    document = {"rate_rps": run.rate_rps, **run.result.to_json()}
    if run.prediction is not None:
        for workflow in document["workflows"]:
            latency = run.prediction.workflow(workflow["name"]).latency_s
            workflow["predicted_latency_s"] = json_number(latency, 6)
    return document


def simulate_rates(
    instance: InstanceLike,
    allocation: AllocationLike | None = None,
    rates: Sequence[float | None] = (None,),
    settings: SimulationSettings = SimulationSettings(),
    arrivals: Mapping[str, Sequence[float]] | PathLike | None = None,
    calls_out: PathLike | None = None,
    progress: Callable[[float], None] | None = None,
    entry: bool = False,
) -> list[SimulatedRun]:
    """`scepsy simulate`: one simulation per rate of every workflow (req/s; None: the instance's),
    each with its prediction, on `allocation` (a file or an Allocation; None: plan the instance
    first). `arrivals`: timestamps per workflow, or a file of them (JSONL or an Azure-format CSV);
    `calls_out` writes every LLM call as JSONL (the request source of `synthesize_profile`);
    `progress` gets the runs done so far (fractional); `entry` holds each LLM's calls at the
    plan's entry limit, as the workflow entry does (k8s/entry.py)."""
    for rate in rates:
        check_finite(rate, "rates")
    if calls_out is not None:
        check_output(calls_out, [p for p in (instance, allocation, arrivals) if isinstance(p, (str, Path))], "calls_out")
    loaded = load(instance)
    chosen = allocation_of(loaded, allocation)
    timestamps = load_arrivals(arrivals, [w.name for w in loaded.workflows]) if isinstance(arrivals, (str, Path)) else arrivals
    if entry:
        limits = {p.llm: p.entry_limit for p in predict(loaded, chosen).llms if p.entry_limit is not None}
        settings = replace(settings, entry_limits=limits)
    runs = []
    for index, rate in enumerate(rates):
        at = loaded if rate is None else loaded.with_arrival_rates({w.name: rate for w in loaded.workflows})

        def step(fraction: float, done: int = index) -> None:
            if progress is not None:
                progress(done + fraction)

        result = simulate(at, chosen, settings=settings, arrivals=timestamps, record_calls=calls_out is not None, progress=step)
        try:
            prediction: Prediction | None = predict(at, chosen)
        except InputError:  # a configuration without a profile curve: no prediction beside it
            prediction = None
        runs.append(SimulatedRun(rate, result, prediction))
    if calls_out is not None:
        write_calls((run.result for run in runs), calls_out)
    return runs


def simulation_document(instance: str, runs: Sequence[SimulatedRun]) -> dict:
    """What `scepsy simulate --json` prints: one run inline, several under `runs`."""
    if len(runs) == 1:
        return {"instance": instance, **_run_document(runs[0])}
    return {"instance": instance, "runs": [_run_document(run) for run in runs]}
