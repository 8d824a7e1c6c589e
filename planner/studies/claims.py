"""Capacity claims checked in the workflow simulator: does every throughput a plan states hold?

A plan claims, for every workflow, the rate it is made for and its `max_throughput_rps` (the load
at which its bottleneck LLM reaches `max_utilization` of its capacity, models/performance/alp.py).
`claims` lists the claims of one instance:

    max_throughput   the `max_throughput` plan at its own load (load_factor x the instance's rates)
    reported         the instance's own plan (its objective, at its rates), loaded to the
                     max_throughput_rps it reports (all workflows scaled together, to the smallest
                     max_throughput_rps / arrival_rate)
    min_gpus         the `min_gpus` plan at the instance's rates (and `min_cost`, where every GPU
                     type in use has a price)
    whatif           the what-if study of the instance's cluster (planner/studies/whatif.py) over
                     WHATIF_POINTS total rates up to the max_throughput plan's: the plan of its
                     middle rate, loaded to the capacity the study prints for it
                     (`workflow_max_throughput_rps`; all workflows scaled together, as reported).
                     Its top rate's plan is the max_throughput plan's allocation

`check` simulates a claim's allocation (models/simulation/simulator.py) at a share of the claimed
load, for one seed, and compares with the prediction at that load. The rule a claim must meet
(`holds`): at least COMPLETED_SHARE of the offered requests complete (throughput over the arrival
rate realised in the measured window), and, up to LATENCY_LOAD of the claimed load, the mean
latency is within LATENCY_TOLERANCE of the prediction. bench/capacity_holds.py prints the table.
`check_recovery` holds a claim's allocation to the recovery limit it prints: from that load, the
standard burst's backlog drains and the latency returns (planner/studies/bursts.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scepsy.models.errors import InfeasibleError, InputError
from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.instance.instance import Instance
from scepsy.models.performance.alp import Prediction, predict
from scepsy.models.simulation.simulator import SimulationSettings, simulate
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.studies.bursts import WorkflowRecovery, plan_burst, recovery
from scepsy.planner.studies.whatif import run_grid

COMPLETED_SHARE = 0.97  # of the offered requests, at every load up to the claimed one
LATENCY_TOLERANCE = 0.15  # relative error of the predicted mean latency ...
LATENCY_LOAD = 0.9  # ... at loads up to this share of the claimed one
# The measured window is the steady state of the claim's load: it opens WARMUP_LATENCIES x the
# predicted mean latency (of the slowest workflow) after an empty start, at least a tenth of the
# duration, and holds WINDOW_LATENCIES x that latency, at least the rest of the duration.
# Completions in the window over arrivals in it differ from 1 by the change of the requests in
# flight between its ends: on rag-4xa6000's min_gpus plan (requests of 8.5 s, 22 s at p99) a
# window opened 20 s after the empty start completed 93.5% of its arrivals though every measured
# request finished; opened after 44 s and 353 s long, 98.0-100.6% over three seeds
WARMUP_LATENCIES = 5.0
WINDOW_LATENCIES = 40.0
# ... and it holds WINDOW_REQUESTS arrivals of the least frequent workflow: the mean latency a plan
# predicts is the long run's at the offered rate, and a window of N requests realises that rate and
# the calls per request within about 1/sqrt(N) each (beam search's calls per request vary by half
# their mean). Near its capacity an LLM's latency moves several times faster than its load (the
# beam verifier at 81%: 7 times), so at 9.9 beam requests/s a 180 s window moved the verifier's
# load by up to 6% between seeds and the workflow's latency by up to 17%
WINDOW_REQUESTS = 4000
# The what-if grid of the whatif claim: this many total rates, evenly up to the max_throughput
# plan's, as a capacity study of the cluster steps them
WHATIF_POINTS = 20
KINDS = ("max_throughput", "reported", "min_gpus", "min_cost", "whatif")


@dataclass(frozen=True)
class Claim:
    """A load a plan states it sustains: its allocation at `rates_rps` per workflow."""

    instance: str
    kind: str  # one of KINDS
    allocation: Allocation
    rates_rps: dict[str, float]


@dataclass(frozen=True)
class Checked:
    """One claim simulated at `load` x its rates with one seed, per workflow."""

    claim: Claim
    load: float
    seed: int
    workflow: str
    claimed_rps: float
    offered_rps: float  # realised in the measured window
    throughput_rps: float
    predicted_s: float
    simulated_s: float

    @property
    def completed_share(self) -> float:
        return self.throughput_rps / self.offered_rps if self.offered_rps > 0 else 1.0

    @property
    def latency_error(self) -> float:
        """(predicted - simulated) / simulated mean latency."""
        return (self.predicted_s - self.simulated_s) / self.simulated_s

    @property
    def sustained(self) -> bool:
        """At least COMPLETED_SHARE of the offered requests completed."""
        return self.completed_share >= COMPLETED_SHARE

    @property
    def holds(self) -> bool:
        return self.sustained and (self.load > LATENCY_LOAD + 1e-9 or abs(self.latency_error) <= LATENCY_TOLERANCE)

    def row(self) -> dict:
        return {
            "instance": self.claim.instance, "claim": self.claim.kind, "workflow": self.workflow, "load": self.load,
            "seed": self.seed, "claimed_rps": self.claimed_rps, "offered_rps": self.offered_rps,
            "throughput_rps": self.throughput_rps, "completed_share": self.completed_share,
            "predicted_s": self.predicted_s, "simulated_s": self.simulated_s, "latency_error": self.latency_error,
            "holds": self.holds,
        }


def _rates(instance: Instance) -> dict[str, float]:
    return {w.name: w.arrival_rate for w in instance.workflows}


def claims(instance: Instance, name: str, settings: PlanSettings = PlanSettings(),
           kinds: tuple[str, ...] = KINDS) -> list[Claim]:
    """The claims of `kinds` the instance's plans make (an objective the instance cannot take,
    min_cost without prices, is left out)."""
    found = []
    # the max_throughput plan's claim, planned once where max_throughput or whatif needs it
    top = _max_throughput(instance, settings) if {"max_throughput", "whatif"} & set(kinds) else None
    for kind in kinds:
        if kind == "max_throughput" and top is not None:
            found.append(Claim(name, kind, *top))
        elif kind == "reported":
            plan = make_plan(instance, settings)
            found.append(Claim(name, kind, plan.allocation, at_reported_capacity(instance, plan.allocation)))
        elif kind == "whatif" and top is not None:
            found.append(Claim(name, kind, *whatif_capacity(instance, settings, sum(top[1].values()))))
        else:
            try:
                plan = make_plan(instance.with_objective(kind), settings)
            except (InputError, InfeasibleError):
                continue  # min_cost without prices
            found.append(Claim(name, kind, plan.allocation, _rates(instance)))
    return found


def at_reported_capacity(instance: Instance, allocation: Allocation) -> dict[str, float]:
    """The instance's rates scaled to the capacity a plan reports for `allocation`: every workflow's
    rate times the smallest `max_throughput_rps / arrival_rate` of its prediction (all workflows
    together, until the first reaches its limit)."""
    prediction = predict(instance, allocation)
    scale = min(w.max_throughput_rps / w.arrival_rate_rps for w in prediction.workflows)
    return {w.name: w.arrival_rate * scale for w in instance.workflows}


def _max_throughput(instance: Instance, settings: PlanSettings) -> tuple[Allocation, dict[str, float]]:
    plan = make_plan(instance.with_objective("max_throughput"), settings)
    return plan.allocation, {w.name: w.max_throughput_rps for w in plan.prediction.workflows}


def whatif_capacity(instance: Instance, settings: PlanSettings = PlanSettings(),
                    top_rps: float | None = None) -> tuple[Allocation, dict[str, float]]:
    """The what-if study of the instance's cluster over WHATIF_POINTS total rates, evenly up to the
    max_throughput plan's (`top_rps`, planned when not given): the allocation of its middle rate
    (the largest the cluster serves up to there), and the rates at the capacity the study prints
    for it (`at_reported_capacity`; one workflow: the table's `workflow_max_throughput_rps`)."""
    if top_rps is None:
        top_rps = sum(_max_throughput(instance, settings)[1].values())
    rates = [top_rps * k / WHATIF_POINTS for k in range(1, WHATIF_POINTS + 1)]
    frame = run_grid(instance, rates, [sum(n.gpus for n in instance.cluster.nodes)], settings)
    served = frame[frame["feasible"] & (frame["rate_rps"] <= rates[WHATIF_POINTS // 2 - 1] * (1 + 1e-9))]
    if served.empty:
        raise InfeasibleError(f"the cluster serves none of the what-if rates up to {top_rps / 2:.6g} req/s")
    middle = served[served["rate_rps"] == served["rate_rps"].max()]
    rows = {row.llm: row for row in middle.itertuples()}
    per_gpu = instance.cluster.fractions_per_gpu
    allocation = Allocation(per_gpu, tuple(
        LlmAllocation(m.name, rows[m.name].gpu_type, int(rows[m.name].tp), round(rows[m.name].fraction * per_gpu),
                      int(rows[m.name].replicas))
        for m in instance.llms))
    point = middle.iloc[0]  # the scenario's columns, alike on each of its LLMs' rows
    at = instance.with_arrival_rates({w.name: float(point[f"rate_{w.name}_rps"]) for w in instance.workflows})
    return allocation, at_reported_capacity(at, allocation)


def measured_window(prediction: Prediction, duration_s: float, seed: int) -> SimulationSettings:
    """The simulation of a claim: `duration_s` at least, its window in steady state (WARMUP_LATENCIES,
    WINDOW_LATENCIES x the slowest workflow's predicted mean latency) holding WINDOW_REQUESTS
    arrivals of the least frequent workflow; an overloaded prediction keeps the plain duration."""
    latency_s = max(w.latency_s for w in prediction.workflows)
    if not math.isfinite(latency_s):
        return SimulationSettings(duration_s=duration_s, seed=seed)
    rates_rps = [w.arrival_rate_rps for w in prediction.workflows if w.arrival_rate_rps > 0]
    warmup_s = max(0.1 * duration_s, WARMUP_LATENCIES * latency_s)
    window_s = max(0.9 * duration_s, WINDOW_LATENCIES * latency_s, WINDOW_REQUESTS / min(rates_rps, default=math.inf))
    return SimulationSettings(duration_s=warmup_s + window_s, warmup_s=warmup_s, seed=seed)


def check(instance: Instance, claim: Claim, load: float, seed: int, duration_s: float = 200.0) -> list[Checked]:
    """Simulate the claim's allocation at `load` x its rates (one seed) against the prediction."""
    loaded = instance.with_arrival_rates({w: rate * load for w, rate in claim.rates_rps.items()})
    prediction = predict(loaded, claim.allocation)
    settings = measured_window(prediction, duration_s, seed)
    result = simulate(loaded, claim.allocation, settings)
    window = result.duration_s - result.warmup_s
    return [
        Checked(claim, load, seed, w.name, claim.rates_rps[w.name], w.arrivals / window, w.throughput_rps,
                prediction.workflow(w.name).latency_s, w.latency_mean_s)
        for w in result.workflows
    ]


def check_recovery(instance: Instance, claim: Claim, seed: int = 0) -> list[WorkflowRecovery]:
    """The recovery limit the claim's allocation prints, held: every workflow at that share of its
    `max_throughput_rps` (the smallest over the workflows, all scaled together) before and after
    the standard burst (planner/studies/bursts.py), against the same arrivals without it."""
    prediction = predict(instance.with_arrival_rates(claim.rates_rps), claim.allocation)
    capacity = {w.name: w.max_throughput_rps for w in prediction.workflows}
    return recovery(instance, claim.allocation, capacity, plan_burst(prediction), seed)
