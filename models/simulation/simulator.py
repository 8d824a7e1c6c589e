"""Workflow simulator (SimPy): the instance's workflows running on a deployment, call by call.

Every replica of every LLM runs the engine model (models/performance/replica.py, models/performance/engine.py); a router per
LLM sends each call to the replica with the fewest outstanding requests (keeping calls that extend
an earlier call's prompt on that call's replica, as SGLang's cache-aware router does, unless the
replicas' loads are imbalanced; `routing="least_outstanding"` turns that off); requests arrive
as a Poisson process at each workflow's rate (or at given timestamps) and run their program
(models/simulation/programs.py) with its real control flow. Replicas sharing a GPU do not slow each other
down beyond their fraction (the MPS isolation the planner assumes). The engines serve their waiting
calls as `scepsy manifests` deploys them by default (`scheduling="priority"`: every generating call
carries its workflow request's arrival as its priority, and older workflow requests go first,
models/performance/replica.py); `scheduling="fcfs"` models engines left at their default.
`untagged_share` of the workflow requests carry no workflow id: the entry gives a call of theirs
that continues an earlier call's prompt that request's start (the entry finds a chat call's
conversation by its messages, tracing/capture/proxy.py), and any other its own arrival.

Measurement: requests arriving in [warmup_s, duration_s] are measured. Arrivals stop at
duration_s; the simulation then runs until the measured requests finish or `drain_s` passes
(requests still running then are reported as unfinished).

    throughput_rps   workflow requests completed during [warmup_s, duration_s] / its length
    latency_*_s      arrival-to-completion latency of the measured requests that completed
    n (per LLM)      mean calls of the LLM per measured request
    p (per LLM)      request-level parallelism, from overlapping call intervals as in the paper:
                     sum over requests of the calls' durations / sum over requests of the length of
                     the union of those calls' intervals (so that n/p * mean call latency is the
                     time a request spends in the LLM)
    utilization      busy time (an iteration running) / replica time in the window
    time share       per request, the union of an LLM's call intervals over the sum of the unions
                     of all its LLMs (the paper's Fig. 3 "relative" time)
    critical path    per LLM, the share of its busy time on the requests' critical paths
                     (models/instance/statistic.py; 1 when a request's LLMs never run side by side)

Memory: every statistic is accumulated as the requests finish (running sums and counts for the
means, n and p; latency percentiles from a log-bucket quantile sketch within 0.1% relative error,
models/instance/streamed.py), and a request's calls are dropped once it has been counted. What the
simulator holds is the requests in flight and O(workflows x LLMs + sketch buckets), independent of
the duration; only `record_calls` (every call, for `--calls-out`) keeps what grows with it, and is
bounded to MAX_RECORDED_CALLS. MAX_SIMULATED_CALLS bounds a run's work, for its wall time.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Generator, Iterable, Iterator, Mapping, Sequence, cast

import simpy

from scepsy.models.instance.allocation import Allocation
from scepsy.models.performance.aiconfigurator import make_timer
from scepsy.models.performance.cards import gpu_card, model_card
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, EngineSettings
from scepsy.models.errors import InputError
from scepsy.models.output import json_number
from scepsy.models.instance.instance import Instance, Workflow
from scepsy.models.instance.statistic import InvocationStatistic, critical_time_s, request_use
from scepsy.models.instance.streamed import Moments, QuantileSketch, RunningMoments
from scepsy.models.instance.workflow import default_program
from scepsy.models.simulation.entry import EntryGate
from scepsy.models.simulation.programs import run_program
from scepsy.models.performance.replica import PRIORITY_UNIT_S, ReplicaSim, Request, Router

# What `scepsy manifests` deploys: engines that serve older workflow requests first (vLLM
# `--scheduling-policy priority`, SGLang `--enable-priority-scheduling
# --schedule-low-priority-values-first`) behind an entry that tags every call with its workflow
# request's start (`scepsy proxy --workflow-priority`, tracing/capture/proxy.py); `fcfs` is an
# engine's default
DEFAULT_SCHEDULING = "priority"


# ---------------------------------------------------------------------------------------------
# The engine of a replica (its model and GPU cards: models/performance/cards.py)


def replica_engine(instance: Instance, llm: str, gpu_type: str, tp: int, fraction: float,
                   settings: EngineSettings = DEFAULT_SETTINGS, engine_model: str = "builtin",
                   backend: str = "vllm", database_version: str = "current") -> Engine:
    card, gpu = model_card(instance, llm), gpu_card(instance, gpu_type)
    timer = make_timer(engine_model, card, gpu, tp, backend, database_version)
    return Engine(card, gpu, tp, fraction, settings, timer=timer)


# ---------------------------------------------------------------------------------------------
# Runtime


@dataclass
class _WorkflowRequest:
    workflow: str
    index: int
    arrival_s: float
    tagged: bool = True  # its calls carry its workflow id (else the entry stamps each call's own arrival)
    finish_s: float | None = None
    calls: list[Request] = field(default_factory=list)
    links: list[tuple[int | None, int]] = field(default_factory=list)  # (prefix call index, prefix tokens)
    stored: dict = field(default_factory=dict)  # store key -> call index


class SimCluster:
    """The running deployment: a router per LLM and the engines its replicas run."""

    def __init__(self, env: simpy.Environment, engines: Mapping[str, Engine], routing: str = "cache_aware",
                 scheduling: str = DEFAULT_SCHEDULING, preemption_threshold: float | None = None):
        self.env = env
        self.engines = dict(engines)
        self.scheduling = scheduling
        self.preemption_threshold = preemption_threshold
        self.routers = {llm: Router(llm, routing) for llm in self.engines}
        self.gates: dict[str, EntryGate] = {}  # the entry's hold on an LLM's calls (entry.py), where it has one
        self.counter = 0
        self.calls_made = 0
        self.call_budget = MAX_SIMULATED_CALLS  # MAX_RECORDED_CALLS while every call is kept (record_calls)
        self.clipped = 0  # calls cut to the KV cache, over the whole run

    def add_replica(self, llm: str, engine: Engine | None = None) -> ReplicaSim:
        if engine is not None:
            self.engines[llm] = engine
        replica = ReplicaSim(self.env, self.engines[llm], name=f"{llm}-{self.counter}", policy=self.scheduling,
                             preemption_threshold=self.preemption_threshold)
        self.counter += 1
        self.routers[llm].add(replica)
        return replica

    def all_replicas(self, llm: str) -> list[ReplicaSim]:
        router = self.routers[llm]
        return router.replicas + router.retired


class RequestContext:
    """What a workflow program sees: its RNG, `call` to issue an LLM call, `all_of` to wait."""

    def __init__(self, env: simpy.Environment, cluster: SimCluster, workflow: Workflow, record: _WorkflowRequest,
                 rng: random.Random):
        self.env = env
        self.cluster = cluster
        self.workflow = workflow
        self.record = record
        self.rng = rng
        self.clipped = 0

    def is_encoder(self, llm: str) -> bool:
        return self.cluster.engines[llm].model.encoder

    def call(self, llm: str, prompt_tokens: int, completion_tokens: int, *, prefix_key=None, prefix_tokens: int = 0,
             store_key=None, sequences: int = 1) -> simpy.Event:
        engine = self.cluster.engines[llm]
        self.cluster.calls_made += 1
        if self.cluster.calls_made > self.cluster.call_budget:
            raise CallBudgetExceeded()  # SimPy re-raises it from env.run; simulate() says what to do
        if not engine.model.encoder:
            limit = engine.kv_capacity_tokens
            if prompt_tokens + completion_tokens > limit:  # what max_model_len would cut
                self.clipped += 1
                self.cluster.clipped += 1
                completion_tokens = min(completion_tokens, limit // 2)
                prompt_tokens = max(limit - completion_tokens, 1)
        uid = (self.record.workflow, self.record.index)
        request = Request(
            prompt_tokens,
            completion_tokens,
            sequences=sequences,
            prefix_key=None if prefix_key is None else (uid, prefix_key),
            prefix_tokens=prefix_tokens,
            store_key=None if store_key is None else (uid, store_key),
            # the entry tags every chat/completions call with its workflow request's start (a call
            # without a workflow id: its conversation's, else its own arrival), in whole seconds
            # (tracing/capture/proxy.py PRIORITY_UNIT_S); ties go by the call's arrival
            priority=0.0 if engine.model.encoder else math.floor(self._entry_start_s(prefix_key) / PRIORITY_UNIT_S),
            tag=llm,
        )
        self.record.links.append((self.record.stored.get(prefix_key) if prefix_key is not None else None, prefix_tokens))
        if store_key is not None:
            self.record.stored[store_key] = len(self.record.calls)
        self.record.calls.append(request)
        gate = self.cluster.gates.get(llm)
        return gate.submit(request) if gate is not None else self.cluster.routers[llm].route(request)

    def _entry_start_s(self, prefix_key) -> float:
        """The start the entry stamps on this request's next call: the request's, unless it is
        untagged and the call continues none of its earlier calls."""
        continues = prefix_key is not None and prefix_key in self.record.stored
        return self.record.arrival_s if self.record.tagged or continues else self.env.now

    def all_of(self, events: Sequence[simpy.Event]) -> simpy.Event:
        return self.env.all_of(list(events))


# ---------------------------------------------------------------------------------------------
# Settings and results


@dataclass(frozen=True)
class SimulationSettings:
    duration_s: float = 300.0
    warmup_s: float | None = None  # default: 10% of the duration
    drain_s: float | None = None  # default: the duration
    seed: int = 0
    engine: EngineSettings = DEFAULT_SETTINGS
    routing: str = "cache_aware"  # or "least_outstanding" (models/performance/replica.py Router)
    scheduling: str = DEFAULT_SCHEDULING  # the engines' waiting queue: "priority" (older workflows first) or "fcfs"
    entry_limits: Mapping[str, int] | None = None  # per LLM: its calls in flight past the entry (entry.py); None: no hold
    untagged_share: float = 0.0  # of the workflow requests, those whose calls carry no workflow id (module doc)
    # SGLang engines' --priority-scheduling-preemption-threshold, in the entry's tags (seconds); None:
    # vLLM's scheduler, where a waiting call never preempts a running one (models/performance/replica.py)
    preemption_threshold: float | None = None
    engine_model: str = "builtin"  # or "aiconfigurator" (models/performance/aiconfigurator.py)
    backend: str = "vllm"  # AIConfigurator's framework database: vllm, sglang or trtllm
    database_version: str = "current"

    @property
    def warmup(self) -> float:
        return 0.1 * self.duration_s if self.warmup_s is None else self.warmup_s

    @property
    def drain(self) -> float:
        return self.duration_s if self.drain_s is None else self.drain_s


@dataclass(frozen=True)
class StageStats:
    llm: str
    invocations: float  # n: mean calls per measured request
    parallelism: float  # p: summed call durations / union of call intervals
    mean_call_latency_s: float
    time_share: float  # mean over requests of union_m / sum of unions
    critical_path: float = 1.0  # f: share of the union on the request's critical path (models/instance/statistic.py)


@dataclass(frozen=True)
class RequestSpread:
    """How one LLM's use varies over a workflow's measured, completed requests (streamed moments)."""

    calls: Moments  # calls per request
    llm_time_s: Moments  # the union of the LLM's call intervals per request, s
    time_share: Moments  # llm_time_s over the request's summed LLM time (requests with LLM time only)


@dataclass(frozen=True)
class WorkflowStats:
    name: str
    offered_rate_rps: float
    arrivals: int  # measured (arrived in the window)
    completed: int
    unfinished: int
    throughput_rps: float
    latency_mean_s: float
    latency_p50_s: float
    latency_p90_s: float
    latency_p99_s: float
    stages: tuple[StageStats, ...]
    spread: Mapping[str, RequestSpread] = field(repr=False, default_factory=dict)  # per LLM
    llm_time_s: Moments = field(repr=False, default_factory=lambda: RunningMoments().summary())  # per request, all its LLMs
    latency_sketch: QuantileSketch = field(repr=False, compare=False, default_factory=QuantileSketch)  # any other percentile

    def stage(self, llm: str) -> StageStats:
        return next(s for s in self.stages if s.llm == llm)


@dataclass(frozen=True)
class LlmStats:
    name: str
    gpu_type: str
    tp: int
    fraction: float
    replicas_mean: float
    utilization: float
    calls: int
    mean_batch: float  # sequences per iteration, averaged over busy time
    prefix_hit_rate: float  # share of prompt tokens served from the prefix cache
    preemptions: int


@dataclass(frozen=True)
class SimulationResult:
    duration_s: float
    warmup_s: float
    seed: int
    workflows: tuple[WorkflowStats, ...]
    llms: tuple[LlmStats, ...]
    gpus_mean: float  # GPUs in use, time-averaged over the window
    clipped_calls: int
    scheduling: str = DEFAULT_SCHEDULING  # the engines' waiting queue the run modelled
    entry_limits: tuple[tuple[str, int], ...] = ()  # the entry's hold per LLM (entry.py), if any
    calls: tuple[dict, ...] = field(default=(), repr=False)

    def workflow(self, name: str) -> WorkflowStats:
        return next(w for w in self.workflows if w.name == name)

    def llm(self, name: str) -> LlmStats:
        return next(m for m in self.llms if m.name == name)

    def to_json(self) -> dict:
        def num(x: float | None) -> float | None:
            return json_number(x, 6)

        return {
            "duration_s": num(self.duration_s),
            "warmup_s": num(self.warmup_s),
            "seed": self.seed,
            "scheduling": self.scheduling,
            "entry_limits": dict(self.entry_limits),
            "gpus_mean": num(self.gpus_mean),
            "clipped_calls": self.clipped_calls,
            "workflows": [
                {
                    "name": w.name,
                    "offered_rate_rps": num(w.offered_rate_rps),
                    "arrivals": w.arrivals,
                    "completed": w.completed,
                    "unfinished": w.unfinished,
                    "throughput_rps": num(w.throughput_rps),
                    "latency_mean_s": num(w.latency_mean_s),
                    "latency_p50_s": num(w.latency_p50_s),
                    "latency_p90_s": num(w.latency_p90_s),
                    "latency_p99_s": num(w.latency_p99_s),
                    "stages": [
                        {
                            "llm": s.llm,
                            "invocations": num(s.invocations),
                            "parallelism": num(s.parallelism),
                            "mean_call_latency_s": num(s.mean_call_latency_s),
                            "time_share": num(s.time_share),
                            "critical_path": num(s.critical_path),
                        }
                        for s in w.stages
                    ],
                }
                for w in self.workflows
            ],
            "llms": [
                {
                    "name": m.name,
                    "gpu_type": m.gpu_type,
                    "tp": m.tp,
                    "fraction": num(m.fraction),
                    "replicas_mean": num(m.replicas_mean),
                    "utilization": num(m.utilization),
                    "calls": m.calls,
                    "mean_batch": num(m.mean_batch),
                    "prefix_hit_rate": num(m.prefix_hit_rate),
                    "preemptions": m.preemptions,
                }
                for m in self.llms
            ],
        }


# ---------------------------------------------------------------------------------------------
# The simulation


Controller = Callable[[simpy.Environment, SimCluster], Generator[simpy.Event, object, object]]  # a SimPy process


def poisson_arrivals(rate: float, duration_s: float, rng: random.Random) -> Iterator[float]:
    """Poisson arrival times in [0, duration_s), drawn as the run reaches them (none held ahead)."""
    now = 0.0
    if rate <= 0:
        return
    while True:
        now += rng.expovariate(rate)
        if now >= duration_s:
            return
        yield now


class _WorkflowTally:
    """A workflow's statistics, accumulated request by request as the requests finish: running
    sums and counts, moments and a latency sketch, so that memory does not grow with the run."""

    def __init__(self, workflow: Workflow, window: tuple[float, float]):
        self.workflow = workflow
        self.window = window
        self.llms = [s.llm for s in workflow.stages]
        self.arrivals = 0  # measured: arrived in the window
        self.completed = 0  # measured and finished
        self.finished_in_window = 0  # any request finishing in the window (throughput)
        self.latency = RunningMoments()
        self.latency_sketch = QuantileSketch()
        self.statistic = {m: InvocationStatistic() for m in self.llms}
        self.calls = {m: RunningMoments() for m in self.llms}
        self.busy = {m: RunningMoments() for m in self.llms}
        self.shares = {m: RunningMoments() for m in self.llms}
        self.llm_time = RunningMoments()
        self.critical: dict[str, float] = {m: 0.0 for m in self.llms}

    def measured(self, arrival_s: float) -> bool:
        return self.window[0] <= arrival_s <= self.window[1]

    def arrive(self, arrival_s: float) -> None:
        if self.measured(arrival_s):
            self.arrivals += 1

    def finish(self, record: _WorkflowRequest) -> None:
        finish_s = cast(float, record.finish_s)
        if self.window[0] <= finish_s <= self.window[1]:
            self.finished_in_window += 1
        if not self.measured(record.arrival_s):
            return
        self.completed += 1
        self.latency.add(finish_s - record.arrival_s)
        self.latency_sketch.add(finish_s - record.arrival_s)
        spans: dict[str, list[tuple[float, float]]] = {m: [] for m in self.llms}
        for call in record.calls:
            spans.setdefault(cast(str, call.tag), []).append((call.arrival_s, cast(float, call.finish_s)))  # done: finished
        own = {m: request_use(spans[m]) for m in self.llms}
        total = sum(use.busy_s for use in own.values())
        self.llm_time.add(total)
        for m, seconds in critical_time_s(spans).items():
            self.critical[m] = self.critical.get(m, 0.0) + seconds
        for m in self.llms:
            self.statistic[m].add(own[m])
            self.calls[m].add(own[m].calls)
            self.busy[m].add(own[m].busy_s)
            if total > 0:
                self.shares[m].add(own[m].busy_s / total)

    def summary(self, offered: float) -> WorkflowStats:
        start, end = self.window
        p50, p90, p99 = self.latency_sketch.percentiles([50, 90, 99])
        return WorkflowStats(
            name=self.workflow.name,
            offered_rate_rps=offered,
            arrivals=self.arrivals,
            completed=self.completed,
            unfinished=self.arrivals - self.completed,
            throughput_rps=self.finished_in_window / (end - start),
            latency_mean_s=self.latency.mean,
            latency_p50_s=p50,
            latency_p90_s=p90,
            latency_p99_s=p99,
            stages=tuple(self._stage(m) for m in self.llms),
            spread={m: RequestSpread(self.calls[m].summary(), self.busy[m].summary(), self.shares[m].summary())
                    for m in self.llms},
            llm_time_s=self.llm_time.summary(),
            latency_sketch=self.latency_sketch,
        )

    def _stage(self, m: str) -> StageStats:
        statistic = self.statistic[m]
        return StageStats(
            llm=m,
            invocations=statistic.invocations,
            parallelism=statistic.parallelism(),
            mean_call_latency_s=statistic.call_time_s / statistic.calls if statistic.calls else math.nan,
            time_share=self.shares[m].mean,
            critical_path=min(self.critical[m] / statistic.busy_s, 1.0) if statistic.busy_s > 0 else math.nan,
        )


@dataclass
class _TokenTally:
    """One LLM's calls and prompt tokens (all requests, warm-up and unfinished ones included)."""

    calls: int = 0
    prompt_tokens: int = 0
    hit_tokens: int = 0

    def add(self, call: Request) -> None:
        self.calls += 1
        self.prompt_tokens += call.prompt_tokens
        self.hit_tokens += call.hit_tokens


class _Ledger:
    """The simulation's bookkeeping: requests in flight, and what finished ones leave behind."""

    def __init__(self, instance: Instance, window: tuple[float, float], record_calls: bool):
        self.workflows = {w.name: _WorkflowTally(w, window) for w in instance.workflows}
        self.tokens: dict[str, _TokenTally] = {}
        self.in_flight: dict[tuple[str, int], _WorkflowRequest] = {}
        self.measured_in_flight = 0
        self.recorded: dict[str, list[_WorkflowRequest]] | None = (
            {w.name: [] for w in instance.workflows} if record_calls else None)

    def arrive(self, record: _WorkflowRequest) -> None:
        self.in_flight[(record.workflow, record.index)] = record
        tally = self.workflows[record.workflow]
        tally.arrive(record.arrival_s)
        self.measured_in_flight += tally.measured(record.arrival_s)
        if self.recorded is not None:
            self.recorded[record.workflow].append(record)

    def finish(self, record: _WorkflowRequest, cluster: SimCluster) -> None:
        del self.in_flight[(record.workflow, record.index)]
        tally = self.workflows[record.workflow]
        tally.finish(record)
        self.measured_in_flight -= tally.measured(record.arrival_s)
        for call in record.calls:
            self.tokens.setdefault(cast(str, call.tag), _TokenTally()).add(call)
        uid = (record.workflow, record.index)
        for key, index in record.stored.items():  # no later call can extend this request's prompts
            cluster.routers[cast(str, record.calls[index].tag)].forget((uid, key))
        if self.recorded is None:
            record.calls, record.links, record.stored = [], [], {}

    def token_totals(self) -> dict[str, _TokenTally]:
        """Finished requests' tallies plus the calls of the requests still in flight."""
        totals = {llm: replace(tally) for llm, tally in self.tokens.items()}
        for record in self.in_flight.values():
            for call in record.calls:
                totals.setdefault(cast(str, call.tag), _TokenTally()).add(call)
        return totals


def _replica_window_time(replica: ReplicaSim, start: float, end: float) -> float:
    alive_to = replica.retired_s if replica.retired_s is not None else end
    return max(min(alive_to, end) - max(replica.started_s, start), 0.0)


class CallBudgetExceeded(Exception):
    """A run made more calls than its budget (a plain exception: SimPy re-creates it)."""


# A bound on the work of one run, for its wall time (memory does not grow with the calls): the
# simulator runs about 20,000 LLM calls a second, so this is an hour or two, and the statistics
# settle within minutes of simulated time.
MAX_SIMULATED_CALLS = 100_000_000
# With record_calls (`--calls-out`) every call is kept until the run ends (about 1.5 KB a call,
# the Request and its output row): this many is about 1.5 GB.
MAX_RECORDED_CALLS = 1_000_000


def expected_calls(instance: Instance, settings: SimulationSettings,
                   arrivals: Mapping[str, Sequence[float]] | None = None) -> float:
    """LLM calls a run should make: requests times the stages' invocations."""
    expected = 0.0
    for workflow in instance.workflows:
        if arrivals is not None and workflow.name in arrivals:
            requests = float(sum(1 for t in arrivals[workflow.name] if t < settings.duration_s))
        else:
            requests = workflow.arrival_rate * settings.duration_s
        expected += requests * sum(s.invocations for s in workflow.stages)
    return expected


def check_size(instance: Instance, settings: SimulationSettings, arrivals: Mapping[str, Sequence[float]] | None = None,
               record_calls: bool = False) -> None:
    """Refuse a run whose expected LLM calls exceed MAX_SIMULATED_CALLS (its wall time), or, when it
    records every call, MAX_RECORDED_CALLS (its memory), and an untagged share outside [0, 1] (InputError)."""
    if not 0.0 <= settings.untagged_share <= 1.0:
        raise InputError(None, "untagged_share", f"{settings.untagged_share!r} is not a share of the workflow requests",
                         "give a number from 0 to 1, e.g. 0.2")
    expected = expected_calls(instance, settings, arrivals)
    if not expected <= MAX_SIMULATED_CALLS:
        raise InputError(
            None, "duration_s", f"{settings.duration_s:g} s at these rates is about {expected:.3g} LLM calls to simulate, "
            f"more than the {MAX_SIMULATED_CALLS:,} a run is bounded to (hours of wall time)",
            "shorten `duration_s` or lower the rates (the statistics settle within minutes of simulated time)",
        )
    if record_calls and not expected <= MAX_RECORDED_CALLS:
        raise InputError(
            None, "record_calls", f"{settings.duration_s:g} s at these rates is about {expected:.3g} LLM calls to record, "
            f"more than the {MAX_RECORDED_CALLS:,} the simulator holds in memory to write them",
            "shorten `duration_s` or lower the rates, or simulate without `record_calls` (its statistics need no such bound)",
        )


def write_calls(results: Iterable[SimulationResult], path: Path | str) -> None:
    """Every recorded call of the runs (`record_calls`), one JSON object a line in run order: the
    request source of `profiles synthesize` (models/profiles/request_sources.py reads it back)."""
    import json

    from scepsy.models.output import writing

    with writing(path, "calls_out") as target, target.open("w") as handle:
        for result in results:
            for call in result.calls:
                handle.write(json.dumps(call, sort_keys=True) + "\n")


def simulate(
    instance: Instance,
    allocation: Allocation,
    settings: SimulationSettings = SimulationSettings(),
    arrivals: Mapping[str, Sequence[float]] | None = None,
    controller: Controller | None = None,
    progress: Callable[[float], None] | None = None,
    record_calls: bool = False,
    on_finish: Callable[[str, float, float, bool], None] | None = None,
) -> SimulationResult:
    """Simulate the instance's workflows (at their arrival rates, or at the given arrival
    timestamps per workflow) on `allocation`; `controller` may change replicas while it runs.
    `record_calls` keeps every call for SimulationResult.calls (bounded to MAX_RECORDED_CALLS);
    without it, memory does not grow with the duration (the module docstring). `on_finish(workflow,
    arrival_s, finish_s, tagged)` is called as each workflow request finishes (the closed-loop simulation's
    latency over time)."""
    check_size(instance, settings, arrivals, record_calls)
    env = simpy.Environment()
    engines = {}
    for choice in allocation.llms:
        fraction = choice.share / allocation.fractions_per_gpu
        engines[choice.llm] = replica_engine(instance, choice.llm, choice.gpu_type, choice.tp, fraction, settings.engine,
                                             settings.engine_model, settings.backend, settings.database_version)
    cluster = SimCluster(env, engines, settings.routing, settings.scheduling, settings.preemption_threshold)
    cluster.call_budget = MAX_RECORDED_CALLS if record_calls else MAX_SIMULATED_CALLS
    for choice in allocation.llms:
        for _ in range(choice.replicas):
            cluster.add_replica(choice.llm)
    for llm, limit in (settings.entry_limits or {}).items():
        cluster.gates[llm] = EntryGate(env, cluster.routers[llm], limit)
    if controller is not None:
        env.process(controller(env, cluster))

    ledger = _Ledger(instance, (settings.warmup, settings.duration_s), record_calls)

    def run_request(workflow: Workflow, record: _WorkflowRequest):
        rng = random.Random(f"{settings.seed}/{workflow.name}/{record.index}")
        ctx = RequestContext(env, cluster, workflow, record, rng)
        yield from run_program(ctx, workflow.program or default_program())
        record.finish_s = env.now
        ledger.finish(record, cluster)
        if on_finish is not None:
            on_finish(record.workflow, record.arrival_s, env.now, record.tagged)

    def source(workflow: Workflow, times: Iterator[float]):
        untagged = random.Random(f"{settings.seed}/untagged/{workflow.name}")
        for index, at in enumerate(times):
            if at > env.now:
                yield env.timeout(at - env.now)
            tagged = settings.untagged_share <= 0 or untagged.random() >= settings.untagged_share
            record = _WorkflowRequest(workflow.name, index, env.now, tagged)
            ledger.arrive(record)
            env.process(run_request(workflow, record))

    for workflow in instance.workflows:
        if arrivals is not None and workflow.name in arrivals:
            times = iter([t for t in sorted(arrivals[workflow.name]) if t < settings.duration_s])
        else:
            rng = random.Random(f"{settings.seed}/arrivals/{workflow.name}")
            times = poisson_arrivals(workflow.arrival_rate, settings.duration_s, rng)
        env.process(source(workflow, times))

    warm = settings.warmup
    busy_at_warm: dict[int, float] = {}

    def snapshot():
        yield env.timeout(warm)
        for llm in cluster.routers:
            for replica in cluster.all_replicas(llm):
                busy_at_warm[id(replica)] = replica.busy_s

    env.process(snapshot())
    try:
        return _run(instance, allocation, settings, arrivals, progress, env, cluster, ledger, busy_at_warm)
    except CallBudgetExceeded:
        argument, bound = ("record_calls", "what it holds in memory to record them") if record_calls else (
            "duration_s", "what a run is bounded to")
        raise InputError(
            None, argument, f"the simulation made more than {cluster.call_budget:,} LLM calls, {bound} "
            "(the workflows' programs call more often than their stages say)",
            "shorten `duration_s`, lower the rates or check the program's beams, passages and iterations"
            + (", or simulate without `record_calls`" if record_calls else ""),
        ) from None


def _run(instance, allocation, settings, arrivals, progress, env, cluster, ledger: _Ledger,
         busy_at_warm) -> SimulationResult:
    """Run the prepared simulation to its end and summarise it."""
    warm, end = settings.warmup, settings.duration_s
    steps = 100
    for k in range(1, steps + 1):
        env.run(until=end * k / steps)
        if progress:
            progress(min(env.now / end, 1.0))
    busy_at_end = {id(r): r.busy_s for llm in cluster.routers for r in cluster.all_replicas(llm)}
    time_at_end = {
        id(r): _replica_window_time(r, warm, end) for llm in cluster.routers for r in cluster.all_replicas(llm)
    }
    limit = end + settings.drain
    while ledger.measured_in_flight and env.now < limit:
        env.run(until=min(env.now + max(settings.duration_s / 20, 1.0), limit))

    workflows = tuple(
        ledger.workflows[w.name].summary(w.arrival_rate if arrivals is None or w.name not in arrivals
                                         else sum(1 for t in arrivals[w.name] if t < end) / end)
        for w in instance.workflows
    )
    tokens = ledger.token_totals()
    llm_stats = []
    gpus = 0.0
    for choice in allocation.llms:
        replicas = cluster.all_replicas(choice.llm)
        engine = cluster.engines[choice.llm]
        alive = sum(time_at_end.get(id(r), 0.0) for r in replicas)
        busy = sum(busy_at_end.get(id(r), r.busy_s) - busy_at_warm.get(id(r), 0.0) for r in replicas)
        calls = tokens.get(choice.llm, _TokenTally())
        busy_total = sum(r.busy_s for r in replicas)
        batch = sum(r.batch_token_s for r in replicas) / busy_total if busy_total > 0 else 0.0
        replicas_mean = alive / (end - warm)
        gpus += replicas_mean * engine.tp * engine.fraction
        llm_stats.append(
            LlmStats(
                name=choice.llm,
                gpu_type=engine.gpu.name,
                tp=engine.tp,
                fraction=engine.fraction,
                replicas_mean=replicas_mean,
                utilization=min(busy / alive, 1.0) if alive > 0 else 0.0,  # +-1 iteration at the edges
                calls=calls.calls,
                mean_batch=batch,
                prefix_hit_rate=calls.hit_tokens / calls.prompt_tokens if calls.prompt_tokens else 0.0,
                preemptions=sum(r.preemptions for r in replicas),
            )
        )
    return SimulationResult(
        duration_s=end,
        warmup_s=warm,
        seed=settings.seed,
        workflows=workflows,
        llms=tuple(llm_stats),
        gpus_mean=gpus,
        clipped_calls=cluster.clipped,
        scheduling=settings.scheduling,
        entry_limits=tuple(sorted((settings.entry_limits or {}).items())),
        calls=_recorded_calls(instance, ledger.recorded),
    )


def _recorded_calls(instance: Instance, recorded: Mapping[str, list[_WorkflowRequest]] | None) -> tuple[dict, ...]:
    """Every call of a recording run, by workflow, request and call."""
    if recorded is None:
        return ()
    return tuple(
        {
            "workflow": r.workflow,
            "request": r.index,
            "llm": c.tag,
            "start_s": round(c.arrival_s, 6),
            "end_s": None if c.finish_s is None else round(c.finish_s, 6),
            "prompt_tokens": c.prompt_tokens,
            "completion_tokens": c.completion_tokens,
            "cached_tokens": c.hit_tokens,
            "sequences": c.sequences,
            "call": index,
            "prefix_call": link[0],
            "prefix_tokens": link[1],
        }
        for w in instance.workflows
        for r in recorded[w.name]
        for index, (c, link) in enumerate(zip(r.calls, r.links))
    )
