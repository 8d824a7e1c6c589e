"""The control policy: one pure function from (state, observation) to (state, decision).

`decide(state, observation, context)` is what every period of `scepsy control` runs, live (the
observation read from Prometheus) and in the closed-loop simulation (read from the simulator); it
does no I/O and reads no clock. Each period:

1. Observe. Workflow rates lambda_w: the observation's workflow counters where every workflow has
   one, else the per-LLM rates lambda_m turned into workflow rates by non-negative least squares
   over the instance's n (control/rates.py). Where a rate the policy needs is missing (no series,
   NaN, stale: the observer passes None), the decision is `hold`: the last good plan stays, nothing
   scales down on missing data, and the forecasters are not fed. The backlog: the requests
   waiting in each LLM's engines (`waiting_requests`).
2. Sustained rate. A rise or fall counts once it held for `confirm_periods` periods: each
   workflow's rate goes through a running median of its last 2 * confirm_periods - 1 observations
   (default 3: a one-period burst never reaches the forecast, a step does in its second period).
   One forecaster per workflow (control/forecast.py: constant, ewma, kalman) forecasts the mean
   rate over the window a replica asked for now would serve, [now + startup_s, now + startup_s +
   sustain_s] (for a linear trend: the forecast at its middle, `horizon_s`). The rate to be ready
   for is up_w = sustained_w + margin_w + backlog_w, the burst margin max(headroom * sustained_w, burst_z *
   sigma_w / sqrt(sustain_s / period_s)): sigma_w the observed deviation of the workflow's rate
   from its running median, the bursts the median removed (an exponentially weighted RMS), so the margin is one
   standard error of the window's mean rate, never below the Poisson headroom. The backlog adds
   backlog_w at once (not through the median): the rate that drains the waiting requests within
   `drain_s` (one start-up), the most any of the workflow's LLMs needs (`_backlog`). Feedback: each
   LLM's correction c_m, the running geometric mean of its observed call latency over the
   latency the pipeline predicts for it at the observed rates, in [1, max_correction]
   (`_feedback`), scales that LLM's latency in every prediction and plan of the decision
   (Instance.with_latency_scales): a deployment measured slower than its profiles is planned as
   it is measured, at the rate that arrives.
3. Decide. First, where a workflow's SLO is missed as users see it while its LLMs' backlog stands
   and grows, a plan with more share units (`_larger`), never keep. The planning rate of a scale-down is the highest up_w of the last `stabilization_s`
   (a scale-down is thus taken only when it was right for the whole window).
   - no dark swap: a scale-up whose placement stops every running (or starting) replica of an LLM
     while none of its new replicas fits on the units free now, nor, where the LLM `rolls` (two
     or more serve and one fewer carries the sustained rate), on those plus one of its replicas'
     units (`_dark_llms`), gives way to the running shapes with more replicas (`_lit_larger`: for
     up_w, or the highest rate below it that places) where they carry the sustained rate;
     failing that it is taken only where the running plan overloads an LLM at the sustained rate
     and at the running median, and the overload has lasted a start-up (its backlog stood and
     never fell for that long; the model's overload where no engine reports its queue: ski
     rental, the outage is bought once keeping the plan has cost about as much); else the
     running plan drains the backlog. A scale-down never leaves an LLM dark: it takes the stop-only step instead;
   - scale up: when the running allocation's predicted latency (Aggregate LLM Pipeline) at up_w
     breaks a workflow's SLO (latency_slo_s * scale_up_at, default the SLO itself) or overloads an
     LLM, re-plan at once for up_w (as the HPA, whose scale-up stabilization is 0 s: the window's
     highest rate is for scale-downs), to the planning SLO (latency_slo_s * slo_margin):
     the band between the two is the scale-up hysteresis, so a new plan does not trigger again
     at the next rise of a few percent (a plan that frees share units is a scale-down, whatever
     triggered it). A burst the median and the forecast absorb never gets here. The plan
     (control/replan.py) keeps the running shapes and changes replica counts only, unless
     re-shaping some LLMs to the shapes of the fresh plan (fewest GPUs that meet the planning
     SLOs) pays for its relocations: the share units it saves over a stabilization window exceed
     the units the re-shaped replicas hold twice while they start (make before break). Every
     subset of the LLMs the fresh plan re-shapes is tried, the others keeping their shapes, and
     the one that pays most is taken, re-shaping no LLM whose replicas are still starting
     (`settled`) where its running shape can meet the rate; the plan is placed with the fewest
     moves from the running placement;
   - scale down: never while a backlog stands (`backlog_per_replica` waiting requests per ready
     replica on some LLM); otherwise when a plan with fewer GPUs holds at the planning rate times 1 + `hysteresis`,
     the window covers `stabilization_s` of observations and no scale-up happened within it;
     at most `max_moves_per_period` replica moves per period (a larger scale-down is taken in
     steps that only stop replicas, each step checked to meet the planning SLO);
   - flap guard: an LLM's replica count (its share units where the count stays) does not reverse
     direction within `flap_window_s` of its last change. A scale-down leaves such LLMs as they
     are (and is dropped where nothing else is cheaper); a scale-up that would reverse one is taken
     only when the SLO is at risk: the running plan breaks the SLO itself (latency_slo_s, no
     margin) at the sustained rate, no burst margin added;
   - keep otherwise. Scale-ups are not capped: meeting the SLO comes before churn.
   Every target is a placement the cluster can run (placed, or a subset of the running one).
   Replicas that are starting count as capacity only once ready: the simulation and the live loop
   route to ready replicas only, and the policy, which plans the target, does not order them twice.
"""

from __future__ import annotations

import functools
import itertools
import math
import statistics
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping

from scepsy.control.forecast import PREDICTORS, Forecaster, ForecastState
from scepsy.control.rates import workflow_rates
from scepsy.control.replan import Replanner, moves, moves_lower_bound, replica_key, without_replicas
from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement
from scepsy.models.instance.instance import Instance
from scepsy.models.performance.alp import AllocationError, predict
from scepsy.placement.current import free_now

ACTIONS = ("keep", "replan", "hold")
VARIABILITY_WEIGHT = 0.2  # the burst variability's exponential weight on the newest period: about 5 periods of memory
CORRECTION_WEIGHT = 0.3  # the latency correction's weight on the newest period: one minute's mean latency is noisy near capacity


class SettingError(ValueError):
    """A knob of ControlSettings out of its range; `field` names the knob."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ControlSettings:
    """The policy's knobs; docs/control.md gives each default's reason."""

    period_s: float = 30.0  # two decisions a minute, each over Prometheus' 60 s rate window: a rise is seen 30 s sooner
    startup_s: float = 180.0  # a replica's time to serve: pod start, image pull, weights, warm-up
    predictor: str = "ewma"  # constant, ewma or kalman (control/forecast.py)
    sustain_s: float = 300.0  # size for the mean rate over this window after a new replica's start-up
    horizon_s: float | None = None  # None: startup_s + sustain_s / 2, the middle of that window
    headroom: float = 0.1  # the least burst margin: a minute's Poisson count at tens of req/s is 10% off
    burst_z: float = 1.0  # burst margin: this many standard errors of the sustained window's mean rate
    confirm_periods: int = 2  # a rise or fall counts once it held this many periods (running median)
    flap_window_s: float = 600.0  # no reversal of an LLM's replica count within this, unless the SLO is at risk
    hysteresis: float = 0.15  # a cheaper plan must hold 15% above the planning rate to be taken
    stabilization_s: float = 300.0  # the Kubernetes HPA's scale-down stabilization window
    max_moves_per_period: int = 8  # replica moves a scale-down may make per period: one node's worth
    slo_margin: float = 0.8  # plan to 80% of each SLO: the pipeline's prediction error
    scale_up_at: float = 1.0  # re-plan up when the forecast's predicted latency passes this fraction of the SLO
    rate_step: float = 0.05  # plans are cached on a 5% geometric rate grid (rounded up)
    backlog_per_replica: float = 1.0  # a backlog stands where an LLM has this many waiting requests per ready replica
    max_correction: float = 2.0  # the feedback scales an LLM's predicted latency by at most this (observed / predicted)

    def __post_init__(self) -> None:
        if self.predictor not in PREDICTORS:
            raise SettingError("predictor", f"unknown predictor {self.predictor!r}; use one of {', '.join(PREDICTORS)}")
        for name in ("period_s", "slo_margin", "scale_up_at", "rate_step", "max_correction"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise SettingError(name, f"{name} must be a finite number > 0, not {value!r}")
        for name in ("startup_s", "headroom", "hysteresis", "stabilization_s", "sustain_s", "burst_z", "flap_window_s",
                     "backlog_per_replica"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise SettingError(name, f"{name} must be a finite number >= 0, not {value!r}")
        if self.scale_up_at < self.slo_margin:
            raise SettingError("scale_up_at", f"scale_up_at ({self.scale_up_at:g}) must be at least slo_margin ({self.slo_margin:g}): "
                               "a plan made to the planning SLO would trigger its own scale-up")
        if self.max_correction < 1:
            raise SettingError("max_correction", f"max_correction must be at least 1, not {self.max_correction!r}")
        if self.max_moves_per_period < 1:
            raise SettingError("max_moves_per_period", "max_moves_per_period must be at least 1")
        if self.confirm_periods < 1:
            raise SettingError("confirm_periods", "confirm_periods must be at least 1")

    @property
    def horizon(self) -> float:
        """How far ahead the forecast looks, s: the middle of the window a replica asked for now
        serves, where a linear trend's forecast is the window's mean."""
        return self.startup_s + self.sustain_s / 2 if self.horizon_s is None else self.horizon_s

    @property
    def drain_s(self) -> float:
        """A backlog is sized to drain within one start-up (at least one period)."""
        return max(self.startup_s, self.period_s)

    @property
    def margin_samples(self) -> float:
        """How many periods the sustained window's mean averages over (at least 1)."""
        return max(self.sustain_s / self.period_s, 1.0)


@dataclass(frozen=True)
class Observation:
    """What one period observed. A rate is None where its sample is missing, NaN or stale."""

    time_s: float
    llm_rates_rps: Mapping[str, float | None] | None  # per LLM; None: nothing could be read
    ready_replicas: Mapping[str, int] = field(default_factory=dict)
    starting_replicas: Mapping[str, int] = field(default_factory=dict)
    workflow_rates_rps: Mapping[str, float | None] | None = None  # where a workflow-level counter exists
    queue_per_replica: Mapping[str, float] | None = None  # waiting requests per ready replica, per LLM
    kv_usage: Mapping[str, float] | None = None  # KV cache usage fraction (0..1), per LLM
    waiting_requests: Mapping[str, float] | None = None  # per LLM: requests waiting in its engines' queues now
    workflow_latency_s: Mapping[str, float | None] | None = None  # per workflow: mean latency of the requests that finished in the period
    llm_latency_s: Mapping[str, float | None] | None = None  # per LLM: mean latency of the calls its engines finished in the period


@dataclass(frozen=True)
class ControllerState:
    """What the policy carries from one period to the next."""

    allocation: Allocation  # the target that runs (or is being brought up)
    placement: Placement
    last_good: tuple[Allocation, Placement]  # the last plan decided on good data
    forecasts: Mapping[str, ForecastState] = field(default_factory=dict)  # per workflow
    recent: tuple[tuple[float, Mapping[str, float]], ...] = ()  # (time_s, up rates) within the window
    last_scale_s: Mapping[str, float] = field(default_factory=dict)  # per LLM: when its replica count last changed
    last_direction: Mapping[str, tuple[float, int]] = field(default_factory=dict)  # per LLM: (time_s, +1 / -1) of its last change
    history: Mapping[str, tuple[float, ...]] = field(default_factory=dict)  # per workflow: the last observed rates (the median's)
    variability: Mapping[str, float] = field(default_factory=dict)  # per workflow: EW mean square deviation from the median, (req/s)^2
    last_up_s: float | None = None  # the last scale-up
    observed_since_s: float | None = None  # the first good observation since the last hold
    last_time_s: float | None = None  # the last good observation
    corrections: Mapping[str, float] = field(default_factory=dict)  # per LLM: running geometric mean of observed over predicted latency
    waiting: Mapping[str, float] = field(default_factory=dict)  # per LLM: the waiting requests last observed
    overloaded_since_s: float | None = None  # the first period of the running overload (the backlog stands and never fell)

    @classmethod
    def initial(cls, allocation: Allocation, placement: Placement) -> "ControllerState":
        return cls(allocation, placement, (allocation, placement))


@dataclass(frozen=True)
class Decision:
    """One period's decision; `inputs` is JSON-able (the live loop logs it as one JSONL line)."""

    time_s: float
    action: str  # keep, replan or hold
    allocation: Allocation | None  # the target (replan only)
    placement: Placement | None
    reason: str
    moves: int = 0
    moves_lower_bound: int = 0
    inputs: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        out: dict[str, Any] = {
            "time_s": round(self.time_s, 6), "action": self.action, "reason": self.reason, "moves": self.moves,
            "moves_lower_bound": self.moves_lower_bound, "inputs": dict(self.inputs),
        }
        if self.allocation is not None:
            out["replicas"] = {c.llm: c.replicas for c in self.allocation.llms}
        return out


@dataclass(frozen=True)
class PolicyContext:
    """What the policy knows besides the state: the instance, the SLOs, the knobs and the planner
    (whose plan cache is a memo of a deterministic function, not state of the policy)."""

    instance: Instance
    settings: ControlSettings
    slos_s: Mapping[str, float]  # per workflow, seconds
    replanner: Replanner
    forecaster: Forecaster

    def corrected(self, scales: Mapping[str, float]) -> "PolicyContext":
        """The context whose model has each LLM's call latency scaled by `scales` (the feedback's
        corrections), rounded up to the rate grid so that nearby corrections share one plan cache."""
        rounded = self.replanner.rounded_scales(scales)
        if not rounded:
            return self
        return replace(self, instance=self.instance.with_latency_scales(rounded), replanner=self.replanner.corrected(rounded))

    @property
    def planning_slos_s(self) -> dict[str, float]:
        return {w: slo * self.settings.slo_margin for w, slo in self.slos_s.items()}

    @property
    def trigger_slos_s(self) -> dict[str, float]:
        """The latencies whose breach at the forecast triggers a scale-up."""
        return {w: slo * self.settings.scale_up_at for w, slo in self.slos_s.items()}


def make_context(instance: Instance, settings: ControlSettings = ControlSettings(), slos_s: Mapping[str, float] | None = None,
                 allocation: Allocation | None = None, plan_time_limit_s: float = 30.0) -> PolicyContext:
    """The context of a controller: SLOs from `slos_s`, else each workflow's latency_slo_s, else
    twice `allocation`'s predicted latency at the instance's rates (InputError where none of these
    gives a finite SLO)."""
    slos: dict[str, float] = {}
    for workflow in instance.workflows:
        if slos_s is not None and workflow.name in slos_s:
            slos[workflow.name] = float(slos_s[workflow.name])
        elif workflow.latency_slo_s is not None:
            slos[workflow.name] = workflow.latency_slo_s
        elif allocation is not None:
            slos[workflow.name] = 2.0 * predict(instance, allocation).workflow(workflow.name).latency_s
        else:
            raise InputError(instance.source, f"workflows.{workflow.name}.latency_slo_s", "missing, and no plan to derive an SLO from",
                             "set latency_slo_s, or give the plan that runs")
        if not (math.isfinite(slos[workflow.name]) and slos[workflow.name] > 0):
            raise InputError(instance.source, f"workflows.{workflow.name}.latency_slo_s",
                             "missing, and the plan that runs is overloaded at the instance's rates (no latency to double)",
                             "set latency_slo_s, or give a plan that carries the instance's rates")
    planning = instance.with_latency_slos({w: s * settings.slo_margin for w, s in slos.items()})
    replanner = Replanner(planning, rate_step=settings.rate_step, plan_time_limit_s=plan_time_limit_s)
    return PolicyContext(instance, settings, slos, replanner, Forecaster(settings.predictor))


def _hold(state: ControllerState, observation: Observation, reason: str, inputs: dict) -> tuple[ControllerState, Decision]:
    good_allocation, good_placement = state.last_good
    held = replace(state, allocation=good_allocation, placement=good_placement, observed_since_s=None)
    return held, Decision(observation.time_s, "hold", None, None, reason, inputs=inputs)


def _rates(observation: Observation, context: PolicyContext) -> tuple[dict[str, float] | None, str]:
    """Workflow rates from the observation (step 1 of the module docstring), or None and why not."""
    names = [w.name for w in context.instance.workflows]
    given = observation.workflow_rates_rps
    if given is not None and all(_good(given.get(w)) for w in names):
        return {w: float(given[w] or 0.0) for w in names}, "workflow counters"
    if observation.llm_rates_rps is None:
        return None, "no LLM rate could be read"
    needed = sorted({s.llm for w in context.instance.workflows for s in w.stages})
    missing = [m for m in needed if not _good(observation.llm_rates_rps.get(m))]
    if missing:
        return None, f"no good rate for {', '.join(missing)} (missing, NaN or stale)"
    rates = {m: float(observation.llm_rates_rps[m] or 0.0) for m in needed}
    return workflow_rates(context.instance, rates), "per-LLM rates (NNLS)"


def _backlog(observation: Observation, context: PolicyContext) -> tuple[dict[str, float], list[str]]:
    """Per workflow, the rate that drains its LLMs' waiting requests within `drain_s`: the most
    any of its LLMs needs, W_m / (n_wm * drain_s) (an LLM shared by workflows charges its whole
    queue to each: a backlog is sized up, never split away); and the LLMs where a backlog stands
    (at least `backlog_per_replica` waiting requests per ready replica)."""
    s = context.settings
    waiting = {m: float(v) for m, v in (observation.waiting_requests or {}).items() if _good(v)}
    out: dict[str, float] = {}
    for workflow in context.instance.workflows:
        calls: dict[str, float] = {}
        for stage in workflow.stages:
            calls[stage.llm] = calls.get(stage.llm, 0.0) + stage.invocations
        out[workflow.name] = max((waiting.get(m, 0.0) / (n * s.drain_s) for m, n in calls.items() if n > 0), default=0.0)
    standing = sorted(m for m, v in waiting.items()
                      if v > 0 and v >= s.backlog_per_replica * max(observation.ready_replicas.get(m, 0), 1))
    return out, standing


def _feedback(state: ControllerState, observation: Observation, context: PolicyContext, rates: Mapping[str, float],
              standing: list[str]) -> tuple[dict[str, float], list[str]]:
    """Per LLM, the model's correction: the running geometric mean of its observed call latency over
    the latency the pipeline predicts for it at the observed rates (weight CORRECTION_WEIGHT on the
    newest period), bounded to [1, max_correction], as Dynamo's planner corrects its interpolation
    by observed over expected latency. A period updates it only where it measures the model: no
    replica starting (else what serves is not the plan predicted), the LLM without a standing
    backlog (queueing behind a backlog is the backlog's term, not the model's error) and predicted
    within its capacity. And the workflows whose SLO users miss (observed latency above it, or
    nothing finished) while one of their LLMs' backlog stands and grew since the last period."""
    s = context.settings
    observed = observation.llm_latency_s or {}
    settled = not any(observation.starting_replicas.values())
    predicted = _llm_latencies(context, state.allocation, rates) if settled else {}
    corrections: dict[str, float] = {}
    bound = math.log(s.max_correction)
    for llm in context.instance.llms:
        m = llm.name
        before = state.corrections.get(m, 1.0)
        seen, expected = observed.get(m), predicted.get(m)
        if m in standing or not (_good(seen) and seen and expected and math.isfinite(expected)):
            corrections[m] = before
            continue
        log_ratio = min(max(math.log(float(seen) / expected), -bound), bound)
        corrections[m] = math.exp((1 - CORRECTION_WEIGHT) * math.log(before) + CORRECTION_WEIGHT * log_ratio)
    workflow_seen = observation.workflow_latency_s or {}
    waiting = observation.waiting_requests or {}
    pressing: list[str] = []
    for workflow in context.instance.workflows:
        w = workflow.name
        seen_w = workflow_seen.get(w)
        missed = (float(seen_w or 0.0) > context.slos_s[w]) if _good(seen_w) else observation.workflow_latency_s is not None
        llms = {stage.llm for stage in workflow.stages}
        grew = any(m in standing and float(waiting.get(m) or 0.0) > state.waiting.get(m, 0.0) for m in llms)
        if missed and grew:
            pressing.append(w)
    return corrections, sorted(pressing)


def _scales(corrections: Mapping[str, float], settings: ControlSettings) -> dict[str, float]:
    """The corrections the model applies: each running mean within [1, max_correction] (a deployment
    faster than its profiles is not planned tighter than they say)."""
    return {m: min(max(c, 1.0), settings.max_correction) for m, c in corrections.items()}


def _llm_latencies(context: PolicyContext, allocation: Allocation, rates: Mapping[str, float]) -> dict[str, float]:
    """Per LLM, the pipeline's call latency for `allocation` at `rates`; an overloaded LLM (or one
    without a profile to predict from) is left out."""
    try:
        prediction = predict(context.instance.with_arrival_rates(rates), allocation)
    except AllocationError:
        return {}
    return {p.llm: p.latency_s for p in prediction.llms if not p.overloaded and math.isfinite(p.latency_s) and p.latency_s > 0}


def _larger(context: PolicyContext, running: Allocation, rates: Mapping[str, float],
            acceptable: Callable[[Allocation], bool] | None = None) -> Allocation | None:
    """The plan for `rates` (`_choose`, re-shapes as `acceptable` allows), or for rates 25% higher
    each try (at most 12), until it holds more share units than the plan that runs; None where
    none does (the cluster is full)."""
    factor = 1.0
    for _ in range(12):
        target = _choose(context, running, _scaled(rates, factor), acceptable=acceptable)
        if target is not None and target.units > running.units:
            return target
        factor *= 1.25
    return None


def _good(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value >= 0


def _latencies(context: PolicyContext, allocation: Allocation, rates: Mapping[str, float]) -> dict[str, float] | None:
    """Predicted latency per workflow at `rates`, inf where an LLM is overloaded; None where the
    allocation has no profile to predict from."""
    try:
        prediction = predict(context.instance.with_arrival_rates(rates), allocation)
    except AllocationError:
        return None
    overloaded = any(p.overloaded for p in prediction.llms)
    return {w.name: math.inf if overloaded else w.latency_s for w in prediction.workflows}


def _carries(context: PolicyContext, allocation: Allocation, rates: Mapping[str, float]) -> bool:
    """The allocation serves `rates` with no LLM overloaded (whatever its latency)."""
    latencies = _latencies(context, allocation, rates)
    return latencies is not None and all(math.isfinite(v) for v in latencies.values())


def _meets(latencies: Mapping[str, float] | None, slos: Mapping[str, float]) -> bool:
    return latencies is not None and all(latencies[w] <= slo * (1 + 1e-9) for w, slo in slos.items())


def meets_planning_slos(context: PolicyContext, allocation: Allocation, rates: Mapping[str, float]) -> bool:
    """The allocation is predicted to meet every workflow's planning SLO at `rates`, no LLM overloaded."""
    return _meets(_latencies(context, allocation, rates), context.planning_slos_s)


def _scaled(rates: Mapping[str, float], factor: float) -> dict[str, float]:
    return {w: r * factor for w, r in rates.items()}


def _directions(old: Allocation, new: Allocation) -> dict[str, int]:
    """Per LLM that changes: +1 where its replica count grows (its share units, where the count
    stays), -1 where it shrinks; LLMs whose count and units stay are left out."""
    before = {c.llm: c for c in old.llms}
    out: dict[str, int] = {}
    for c in new.llms:
        b = before.get(c.llm)
        replicas, units = (c.replicas, c.units) if b is None else (c.replicas - b.replicas, c.units - b.units)
        step = replicas or units
        if step:
            out[c.llm] = 1 if step > 0 else -1
    return out


def _with_choices(target: Allocation, running: Allocation, llms: Mapping[str, object]) -> Allocation:
    """`target` with the running choice (shape and replicas) of each LLM in `llms`."""
    keep = {c.llm: c for c in running.llms if c.llm in llms}
    return Allocation(target.fractions_per_gpu, tuple(keep.get(c.llm, c) for c in target.llms))


def _changed_llms(old: Allocation, new: Allocation) -> list[str]:
    before = {c.llm: (c.shape, c.replicas) for c in old.llms}
    return sorted(c.llm for c in new.llms if before.get(c.llm) != (c.shape, c.replicas))


def decide(state: ControllerState, observation: Observation, context: PolicyContext) -> tuple[ControllerState, Decision]:
    """One period of the policy (module docstring): the next state and the decision."""
    s = context.settings
    now = observation.time_s
    inputs: dict[str, Any] = {
        "llm_rates_rps": None if observation.llm_rates_rps is None else {
            m: (v if v is not None and math.isfinite(v) else None) for m, v in sorted(observation.llm_rates_rps.items())},
        "ready_replicas": dict(sorted(observation.ready_replicas.items())),
        "starting_replicas": dict(sorted(observation.starting_replicas.items())),
    }
    ready = observation.ready_replicas
    rates, source = _rates(observation, context)
    if rates is None:
        return _hold(state, observation, f"{source}: keeping the last good plan", inputs)
    inputs["workflow_rates_rps"] = {w: round(r, 6) for w, r in rates.items()}
    inputs["rates_from"] = source

    # 2. the sustained rate: running median, forecast of the serving window's mean, burst margin
    dt = s.period_s if state.last_time_s is None else max(now - state.last_time_s, 1e-9)
    keep_n = 2 * s.confirm_periods - 1
    history = {w: (tuple(state.history.get(w, ())) + (r,))[-keep_n:] for w, r in rates.items()}
    confirmed = {w: float(statistics.median(h)) for w, h in history.items()}
    variability: dict[str, float] = {}
    for w, r in rates.items():
        deviation = r - confirmed[w]  # a burst the median removed; zero once a step is confirmed
        variability[w] = (1 - VARIABILITY_WEIGHT) * state.variability.get(w, 0.0) + VARIABILITY_WEIGHT * deviation ** 2
    forecasts = {w: context.forecaster.update(state.forecasts.get(w), confirmed[w], dt) for w in rates}
    sustained = {w: context.forecaster.predict(f, s.horizon) for w, f in forecasts.items()}
    margin = {w: max(s.headroom * sustained[w], s.burst_z * math.sqrt(variability[w] / s.margin_samples)) for w in rates}
    backlog, standing = _backlog(observation, context)
    corrections, pressing = _feedback(state, observation, context, rates, standing)
    draining = _draining(state, observation)
    scales = _scales(corrections, s)
    context = context.corrected(scales)  # the model as the deployment is measured, for the rest of the decision
    up = {w: sustained[w] + margin[w] + backlog[w] for w in rates}
    # what holds now: the sustained rate, never above the running median (not a trend's extrapolation)
    now_rates = {w: min(sustained[w], confirmed[w]) for w in sustained}
    # the overload's clock: a backlog that stands and did not fall, or where no engine reports its queue, the model's overload
    queues_read = observation.waiting_requests is not None
    overloaded = not draining and (bool(standing) if queues_read else not _carries(context, state.allocation, now_rates))
    overloaded_since = (now if state.overloaded_since_s is None else state.overloaded_since_s) if overloaded else None
    inputs["overloaded_for_s"] = None if overloaded_since is None else round(now - overloaded_since, 6)
    recent = tuple((t, r) for t, r in state.recent if t > now - s.stabilization_s) + ((now, up),)
    window = {w: max(r[w] for _, r in recent) for w in up}
    since = now if state.observed_since_s is None else state.observed_since_s
    inputs["confirmed_rate_rps"] = {w: round(v, 6) for w, v in confirmed.items()}
    inputs["forecast_rps"] = {w: round(v, 6) for w, v in sustained.items()}
    inputs["burst_margin_rps"] = {w: round(v, 6) for w, v in margin.items()}
    inputs["backlog_rps"] = {w: round(v, 6) for w, v in backlog.items()}
    inputs["llm_latency_s"] = {m: round(v, 6) for m, v in sorted((observation.llm_latency_s or {}).items()) if v is not None and _good(v)}
    inputs["latency_correction"] = {m: round(v, 6) for m, v in sorted(scales.items())}
    inputs["planning_rate_rps"] = {w: round(v, 6) for w, v in window.items()}
    state = replace(state, forecasts=forecasts, recent=recent, observed_since_s=since, last_time_s=now, history=history,
                    variability=variability, corrections=corrections, overloaded_since_s=overloaded_since,
                    waiting={m: float(v) for m, v in (observation.waiting_requests or {}).items() if _good(v)})

    slos = context.planning_slos_s
    current = _latencies(context, state.allocation, up)
    inputs["predicted_latency_s"] = None if current is None else {w: (round(v, 6) if math.isfinite(v) else None) for w, v in current.items()}
    inputs["gpus"] = round(state.allocation.gpus(), 6)

    def keep(reason: str) -> tuple[ControllerState, Decision]:
        return replace(state, last_good=(state.allocation, state.placement)), Decision(now, "keep", None, None, reason, inputs=inputs)

    def adopt(allocation: Allocation, placement: Placement, reason: str, up_scale: bool) -> tuple[ControllerState, Decision]:
        changed = _changed_llms(state.allocation, allocation)
        scaled = dict(state.last_scale_s) | {m: now for m in changed}
        turned = dict(state.last_direction) | {m: (now, d) for m, d in _directions(state.allocation, allocation).items()}
        moved = moves(state.placement, placement)
        bound = moves_lower_bound(state.allocation, allocation)
        inputs["target_gpus"] = round(allocation.gpus(), 6)
        after = replace(state, allocation=allocation, placement=placement, last_good=(allocation, placement),
                        last_scale_s=scaled, last_direction=turned, last_up_s=now if up_scale else state.last_up_s)
        return after, Decision(now, "replan", allocation, placement, reason, moved, bound, inputs)

    def dark_swap_pays() -> bool:
        """A swap that leaves an LLM dark for a start-up is taken only where the running plan
        overloads an LLM at both the sustained and the confirmed rate (the running median: what
        holds now, not a trend's extrapolation), and the overload has lasted a start-up: its
        backlog stood and never fell for that long (where no engine reports its queue: the model
        overloaded at that rate), so it would not drain by itself (after a burst it does). Waiting
        a start-up is the ski-rental rule: by then keeping the plan has cost about the outage the
        swap costs, and a burst shorter than a start-up passes without one."""
        lasted = overloaded_since is not None and now - overloaded_since >= s.startup_s - 1e-9
        return not _carries(context, state.allocation, now_rates) and lasted

    @functools.cache
    def rolls(llm: str) -> bool:
        """The LLM can swap its replicas one at a time: two or more serve, and the plan that runs
        with one of them fewer carries the sustained rate (the rolling swap's capacity)."""
        if ready.get(llm, 0) < 2 or sum(c.replicas for c in state.allocation.llms if c.llm == llm) < 2:
            return False
        fewer, _ = without_replicas(state.allocation, state.placement, {llm: 1})
        return _carries(context, fewer, sustained)

    def lit_instead(rates: Mapping[str, float]) -> tuple[Allocation, Placement] | None:
        """Instead of a scale-up that leaves an LLM dark: the running shapes with more replicas
        (no LLM stops serving) where they carry the sustained rate, no LLM overloaded; None where
        none does (then the dark swap is taken if the running plan overloads)."""
        grown = _lit_larger(context, state, rates, rolls)
        return grown if grown is not None and _carries(context, grown[0], sustained) else None

    def scale_up(target: Allocation, placed: Placement, why: str) -> tuple[ControllerState, Decision]:
        """Adopt a larger plan, unless it leaves an LLM dark: then the running shapes with more
        replicas where they carry the sustained rate, else the dark swap where it pays, else keep."""
        dark = _dark_llms(context, state.placement, placed, rolls)
        if not dark:
            return adopt(target, placed, f"scale up: {why}", True)
        inputs["dark_llms"] = dark
        leaves = f"the larger plan leaves {', '.join(dark)} without a serving replica for a start-up"
        grown = lit_instead(up)
        if grown is not None:
            return adopt(*grown, f"scale up: {why}; the running shapes with more replicas, as {leaves}", True)
        if dark_swap_pays():
            return adopt(target, placed, f"scale up: {why}; {leaves}, and the plan that runs is overloaded with a "
                         "backlog that does not fall", True)
        return keep(f"{why}, but {leaves} while the plan that runs carries the sustained rate or drains its backlog")

    starting = {m for m, n in observation.starting_replicas.items() if n > 0}

    def settled(candidate: Allocation) -> bool:
        """A re-plan re-shapes no LLM whose replicas are still starting: that would throw their
        start-up away, and the predecessors serving until they are ready may hold the GPUs the
        new shape is placed on (the plan is placed on the target, not on what still serves)."""
        return not any(c.llm in starting and c.shape != state.allocation.of(c.llm).shape for c in candidate.llms)

    def guarded(direction: int) -> dict[str, float]:
        """LLMs whose last change went the other way within the flap window: name -> seconds since."""
        return {m: now - t for m, (t, d) in state.last_direction.items()
                if d == -direction and now - t <= s.flap_window_s + 1e-9}

    trigger = context.trigger_slos_s

    # 3. decide: where users see the SLO missed while the queue grows, a larger plan, never keep
    if pressing:
        larger = _larger(context, state.allocation, up, acceptable=settled)
        placed_larger = None if larger is None else context.replanner.place(larger, state.placement)
        if larger is None or placed_larger is None:
            return keep(f"the SLO of {', '.join(pressing)} is missed and the queue grows, but no larger plan fits the cluster")
        inputs["slo_missed_queue_growing"] = pressing
        return scale_up(larger, placed_larger, f"the SLO of {', '.join(pressing)} is missed and the queue grows")

    # scale up at once, for the forecast, when the running plan breaks an SLO there
    breaks = not _meets(current, trigger)
    target = _choose(context, state.allocation, up, acceptable=settled) if breaks else None
    # a plan that frees share units is a scale-down, whatever triggered it: its rules below apply
    if breaks and (target is None or target.units >= state.allocation.units):
        if target is None:
            return keep("the forecast breaks the SLO and no plan meets it: keeping the plan that runs")
        if target == state.allocation:
            return keep("the forecast breaks the SLO; the plan that runs is already the best at the forecast")
        reversing = sorted(set(guarded(+1)) & {m for m, d in _directions(state.allocation, target).items() if d > 0})
        at_risk = not _meets(_latencies(context, state.allocation, sustained), context.slos_s)
        inputs["flap_guard"] = {"reversing": reversing, "slo_at_risk": at_risk}
        if reversing and not at_risk:
            return keep(f"the forecast breaks the SLO, but {', '.join(reversing)} scaled down within "
                        f"{s.flap_window_s:g} s and the SLO is not at risk at the sustained rate (flap guard)")
        placement = context.replanner.place(target, state.placement)
        if placement is None:
            return keep("the forecast breaks the SLO and the better plan cannot be placed: keeping the plan that runs")
        broken = sorted(w for w in trigger if current is None or current[w] > trigger[w] * (1 + 1e-9))
        return scale_up(target, placement, f"the forecast breaks the SLO of {', '.join(broken)}")

    # scale down: never while a backlog stands; only a cheaper plan that holds beyond the hysteresis over a full window
    if standing:
        return keep(f"a backlog stands on {', '.join(standing)}: no scale-down")
    def lit(candidate: Allocation) -> bool:
        """A scale-down target that leaves no LLM dark (or shares the running shapes: stops only)."""
        placed_candidate = context.replanner.place(candidate, state.placement)
        return placed_candidate is None or not _dark_llms(context, state.placement, placed_candidate, rolls)

    target = _choose(context, state.allocation, _scaled(window, 1 + s.hysteresis), alternative=state.allocation,
                     acceptable=lambda candidate: settled(candidate) and lit(candidate))
    if target is None or target.units >= state.allocation.units:
        return keep("the plan that runs meets the forecast; no cheaper plan holds beyond the hysteresis")
    if now - since < s.stabilization_s - 1e-9:
        return keep(f"a cheaper plan holds, but for {now - since:g} s of {s.stabilization_s:g} s (stabilization)")
    if state.last_up_s is not None and now - state.last_up_s < s.stabilization_s - 1e-9:
        return keep(f"a cheaper plan holds, but the last scale-up was {now - state.last_up_s:g} s ago (stabilization)")
    hold = guarded(-1)
    if hold:
        target = _with_choices(target, state.allocation, hold)
        inputs["flap_guard"] = {"kept": sorted(hold)}
        if target.units >= state.allocation.units:
            names = ", ".join(f"{m} ({hold[m]:g} s ago)" for m in sorted(hold))
            return keep(f"a cheaper plan holds, but it scales down {names}, scaled up within {s.flap_window_s:g} s (flap guard)")
    placed = context.replanner.place(target, state.placement)
    dark = [] if placed is None else _dark_llms(context, state.placement, placed, rolls)
    if placed is not None and moves(state.placement, placed) <= s.max_moves_per_period and not dark:
        return adopt(target, placed, "scale down: a cheaper plan holds over the stabilization window", False)
    if dark:
        inputs["dark_llms"] = dark
    # too many moves, no placement or an LLM left dark: stop replicas only, at most the cap, where the target keeps the shape
    why = f"leaves {', '.join(dark)} without a serving replica for a start-up" if dark else "needs more moves than the cap"
    step = _stop_only_step(state, target, s.max_moves_per_period)
    if step is None:
        return keep(f"a cheaper plan holds, but it {why} and no stop-only step exists")
    allocation, placement = step
    if not _meets(_latencies(context, allocation, window), slos):
        return keep(f"a cheaper plan holds, but it {why} and the stop-only step would break the planning SLO")
    return adopt(allocation, placement, f"scale down in steps: the cheaper plan {why}; replicas stopped only", False)


def _draining(state: ControllerState, observation: Observation) -> bool:
    """The requests waiting in the engines, summed over the LLMs, fell since the last period."""
    now = sum(float(v) for v in (observation.waiting_requests or {}).values() if _good(v))
    return now < sum(state.waiting.values()) - 1e-9


def _lit_larger(context: PolicyContext, state: ControllerState, rates: Mapping[str, float],
                rolls: Callable[[str], bool]) -> tuple[Allocation, Placement] | None:
    """The running shapes with the fewest replicas for `rates`, or for the highest rate below it
    on the rate grid whose plan the cluster places without leaving an LLM dark, where that holds
    more share units than the plan that runs: a scale-up that only starts replicas."""
    step = 1 + context.settings.rate_step
    factor = 1.0
    while factor > 1e-3:
        candidate = context.replanner.same_shapes(state.allocation, _scaled(rates, factor))
        if candidate is not None:
            if candidate.units <= state.allocation.units:
                return None  # lower rates need no more replicas than run now
            placed = context.replanner.place(candidate, state.placement)
            if placed is not None and not _dark_llms(context, state.placement, placed, rolls):
                return candidate, placed
        factor /= step
    return None


def _dark_llms(context: PolicyContext, running: Placement, target: Placement, rolls: Callable[[str], bool]) -> list[str]:
    """The LLMs the move from `running` to `target` leaves with no replica serving for a start-up:
    every running replica of theirs stops and none of their new replicas fits on the units free
    now, nor, for an LLM that `rolls` (swaps one replica at a time), on those plus one of its
    replicas' units, so the successor waits for its last predecessor's GPUs (the staged swap on a
    full cluster). A replica still starting counts as running: stopping it starts its start-up
    over."""
    cluster = context.instance.cluster
    held_free = free_now(cluster, running)  # GPUs the running replicas hold units on; the others are free

    def free(node: str, gpu: int) -> int:
        return held_free.get((node, gpu), cluster.free_units(node, gpu))

    def fits(key: tuple, freed: Counter) -> bool:
        return all(free(key[1], gpu) + freed[(key[1], gpu)] >= units for gpu, units in key[2])

    before = Counter(replica_key(r) for r in running.replicas)
    after = Counter(replica_key(r) for r in target.replicas)
    dark = []
    for llm in sorted({r.llm for r in running.replicas}):
        kept = sum(min(n, after[k]) for k, n in before.items() if k[0] == llm)
        new = [k for k in (after - before).elements() if k[0] == llm]
        if kept or not new or any(fits(k, Counter()) for k in new):
            continue
        mine = [k for k in before.elements() if k[0] == llm]
        # a rolling swap: one replica stops while the others serve, and a successor starts on its units
        freed_by_one = [Counter({(k[1], gpu): units for gpu, units in k[2]}) for k in mine] if len(mine) >= 2 and rolls(llm) else []
        if not any(fits(k, freed) for k in new for freed in freed_by_one):
            dark.append(llm)
    return dark


def _choose(context: PolicyContext, running: Allocation, rates: Mapping[str, float],
            alternative: Allocation | None = None,
            acceptable: Callable[[Allocation], bool] | None = None) -> Allocation | None:
    """The plan for `rates`: the running shapes with other replica counts (starts and stops only),
    unless re-shaping some LLMs to the fresh plan's shapes pays for its relocations: the share
    units it saves over one stabilization window exceed the units of the re-shaped replicas held
    twice during a start-up (make before break). Every subset of the LLMs the fresh plan re-shapes
    is tried (the others keep their running shapes, all with the fewest replicas that meet the
    planning SLOs: control/replan.py), and the one that pays most is taken, so one LLM can shrink
    without relocating the others. Savings are counted against the cheaper of the kept plan and
    `alternative` (for a scale-down: the plan that runs, which is what keeping means). With
    `acceptable`, the re-shapes it refuses are passed over for the next that pays (a scale-down
    re-shapes only the LLMs whose successors can start beside their predecessors)."""
    s = context.settings
    kept = context.replanner.same_shapes(running, rates)
    fresh = context.replanner.allocation(rates)
    if kept is None or fresh is None:
        return fresh if kept is None else kept
    baseline = kept.units if alternative is None else min(kept.units, alternative.units)
    shapes = {c.llm: c.shape for c in running.llms}
    reshapeable = [c for c in fresh.llms if shapes.get(c.llm) != c.shape]
    paying: list[tuple[float, int, Allocation]] = []
    for size in range(1, len(reshapeable) + 1):
        for subset in itertools.combinations(reshapeable, size):
            candidate = fresh if size == len(reshapeable) else context.replanner.same_shapes(_with_shapes(running, subset), rates)
            if candidate is None:
                continue
            reshaped = sum(c.units for c in candidate.llms if shapes.get(c.llm) != c.shape)
            gain = (baseline - candidate.units) * s.stabilization_s - reshaped * s.startup_s
            if gain > 0:
                paying.append((gain, len(paying), candidate))
    for _, _, candidate in sorted(paying, key=lambda item: (-item[0], item[1])):  # the most paying first, ties in trial order
        if acceptable is None or acceptable(candidate):
            return candidate
    return kept


def _with_shapes(running: Allocation, choices: tuple[LlmAllocation, ...]) -> Allocation:
    """`running` with each LLM of `choices` taking that choice (its shape; same_shapes recounts replicas)."""
    chosen = {c.llm: c for c in choices}
    return Allocation(running.fractions_per_gpu, tuple(chosen.get(c.llm, c) for c in running.llms))


def _stop_only_step(state: ControllerState, target: Allocation, cap: int) -> tuple[Allocation, Placement] | None:
    """Stop up to `cap` replicas of LLMs whose target keeps their shape with fewer replicas (the
    LLMs with the most share units to free first)."""
    removable: list[tuple[int, str, int]] = []
    for choice in state.allocation.llms:
        goal = next((c for c in target.llms if c.llm == choice.llm), None)
        if goal is not None and goal.shape == choice.shape and goal.replicas < choice.replicas:
            removable.append((-choice.tp * choice.share, choice.llm, choice.replicas - goal.replicas))
    if not removable:
        return None
    remove: dict[str, int] = {}
    left = cap
    for _, llm, count in sorted(removable):
        take = min(count, left)
        if take:
            remove[llm] = take
            left -= take
    return without_replicas(state.allocation, state.placement, remove)
