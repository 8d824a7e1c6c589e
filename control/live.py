"""The live loop of `scepsy control`: every period it observes (Prometheus, Kubernetes), decides
(control/policy.py `decide`, the same function the closed-loop simulation runs) and acts
(control/act.py), and logs one JSON line per period with the decision and its inputs.

Start, and restart: the running state is read from the cluster, never from the controller's memory
(there is none across processes): the engine Deployments' labels and annotations give the
placement that runs and each replica's readiness (act.py `read_cluster`). Replicas of a second
shape of one LLM (a restart in the middle of a change of shape) are reconciled away once the
others are ready. A HorizontalPodAutoscaler or KEDA ScaledObject on one of the engine Deployments
refuses the start (`AutoscalerConflict`, exit code 2).

Each period, in this order:
1. observe: per-LLM rates and, where the workflow entry is scraped, per-workflow arrival rates
   and latencies (control/observe.py) through the Prometheus HTTP API (retried with backoff inside the
   client), readiness through the Kubernetes API; a rate that is missing (unreachable, slow, no
   series, NaN, stale) is None, and the policy then holds: the last good plan stays and nothing
   scales down on missing data. Each missing rate is said on stderr and in the log. The Nodes give
   the lost nodes and GPUs (control/fleet.py); when they change, the policy plans on the cluster
   that is there from then on (the log's `fleet`);
2. act on a change in progress: the actuation continues (new replicas must be Ready before the
   replicas they replace are deleted; while a rate is missing, no replica is deleted); while it
   runs, the policy is not asked for another target;
3. otherwise decide, and on `replan` start an actuation to the target (or, with `act` "dry-run",
   print the diff and change nothing; with "gauges", publish the target for KEDA).
An apply that the API server refuses or does not answer in time is retried in a later period with
exponential backoff (`retry_s`, doubled up to `max_retry_s`); the plan that runs stays meanwhile.
A replica not Ready within `ready_timeout_s` ends its actuation as stuck: the replicas it added are
removed, those it would have replaced keep running, and the policy continues from what runs.

Time comes from an injected clock (`clock()`, seconds) and waiting from an injected `sleep`, so
tests order events without wall-clock bounds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from scepsy.control.act import (
    Actuation,
    ApplyFailed,
    Change,
    Cluster,
    ClusterState,
    dry_run,
    is_engine,
    keep_running_names,
    read_cluster,
    refuse_autoscalers,
)
from scepsy.control.fleet import Fleet, read_fleet, shrink
from scepsy.control.gauges import DesiredGauges
from scepsy.control.observe import missing_llms, missing_workflows, observation
from scepsy.control.policy import ControllerState, Decision, PolicyContext, decide, make_context
from scepsy.control.prometheus import Missing, PrometheusClient, WorkflowSamples, read_llms, read_workflows
from scepsy.control.settings import LiveSettings
from scepsy.k8s.manifests import ManifestSettings, build_objects
from scepsy.k8s.plan_input import placed_plan
from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Instance
from scepsy.models.plan.document import plan_document

def _replicas(allocation: Allocation) -> dict[str, int]:
    return {c.llm: c.replicas for c in allocation.llms}


@dataclass
class LiveLoop:
    context: PolicyContext
    cluster: Cluster
    prometheus: PrometheusClient
    manifests: ManifestSettings
    settings: LiveSettings
    log: IO[str]  # one JSON object per line
    say: Callable[[str], None]  # stderr
    show: Callable[[str], None]  # stdout (the dry run's diff)
    clock: Callable[[], float]
    instance_file: str | None = None  # recorded in the plan ConfigMap
    gauges: DesiredGauges | None = None
    state: ControllerState | None = None
    running: ClusterState | None = None
    actuation: Actuation | None = None
    failures: int = 0  # consecutive failed attempts of the current actuation
    retry_at_s: float | None = None
    periods: int = 0
    actions: dict[str, int] = field(default_factory=dict)  # periods by action
    fleet: Fleet = field(default_factory=Fleet)  # what is lost of the instance's cluster (control/fleet.py)
    whole: Instance | None = None  # the instance with every GPU (the context's shrinks with the fleet)
    _objects_cache: dict[tuple, list[dict]] = field(default_factory=dict)

    # -- plumbing --------------------------------------------------------------------------------

    @property
    def llms(self) -> list[str]:
        return [m.name for m in self.context.instance.llms]

    @property
    def workflows(self) -> list[str]:
        return [w.name for w in self.context.instance.workflows]

    def _write(self, record: dict[str, Any]) -> None:
        if record.get("event") == "period":
            action = str(record.get("action"))
            self.actions[action] = self.actions.get(action, 0) + 1
        self.log.write(json.dumps(record, sort_keys=True, allow_nan=False, default=str) + "\n")
        self.log.flush()

    def objects(self, allocation: Allocation, placement: Placement) -> list[dict]:
        """The manifests writer's objects of a plan (k8s/manifests.py), with the plan document the
        plan ConfigMap records."""
        key = (allocation, placement)
        if key not in self._objects_cache:
            raw = plan_document(self.instance_file, allocation, placement)
            # the whole instance: a plan that still runs replicas on a lost GPU is written as it runs
            plan = placed_plan("scepsy control", raw, self.whole or self.context.instance, allocation, placement)
            self._objects_cache = {key: build_objects(plan, self.manifests)}
        return self._objects_cache[key]

    # -- start -----------------------------------------------------------------------------------

    def start(self) -> dict:
        """Read what runs (the cluster, not memory) and begin from it; refuses to run beside
        another autoscaler of the same Deployments."""
        now = self.clock()
        try:
            engines = {d["metadata"]["name"] for d in self.cluster.deployments() if is_engine(d)}
            refuse_autoscalers(self.cluster, engines)
            running = read_cluster(self.cluster)
        except ApplyFailed as exc:
            raise InputError(f"namespace {self.cluster.namespace}", None, f"cannot read what runs: {exc}",
                             "check that the cluster is up and that `kubeconfig`, `context` and `namespace` point at the deployment") from None
        allocation, placement, odd = running.running(self.context.instance)
        absent = sorted(set(self.llms) - {c.llm for c in allocation.llms})
        if absent:
            raise InputError(f"namespace {self.cluster.namespace}", None,
                             f"no replica of {', '.join(absent)} runs (engine Deployments with scepsy's labels and annotations)",
                             "deploy a plan first (`scepsy manifests` and `scepsy deploy`), with the namespace the controller watches")
        self.running = running
        self.state = ControllerState.initial(allocation, placement)
        recorded = not odd and running.plan is not None and running.plan.get("placement") == plan_document(None, allocation, placement).get("placement")
        record = {"event": "start", "time_s": now, "replicas": _replicas(allocation),
                  "ready": {m: running.ready(m) for m in self.llms}, "starting": {m: running.starting(m) for m in self.llms},
                  "plan_configmap_matches": recorded, "left_out": list(odd), "unreadable": list(running.unreadable)}
        if odd:
            self.say(f"scepsy control: {', '.join(odd)} do not fit the plan that runs (a change was interrupted): "
                     "removing them once the others are ready")
            self.actuation = Actuation(self.cluster, self.objects(allocation, placement), now, self.settings.ready_timeout_s,
                                       baseline=self.objects(allocation, placement))
            record["reconcile"] = True
        if running.unreadable:
            self.say(f"scepsy control: ignoring {', '.join(running.unreadable)}: not labelled and annotated as scepsy's engines")
        self._write(record)
        return record

    # -- one period --------------------------------------------------------------------------------

    def period(self) -> dict:
        """One period (module docstring); returns the JSON record it logged."""
        if self.state is None:
            self.start()
        assert self.state is not None
        now = self.clock()
        self.periods += 1
        record: dict[str, Any] = {"event": "period", "period": self.periods, "time_s": now}
        samples = read_llms(self.prometheus, self.llms)
        missing = missing_llms(samples)
        flows = self._read_workflows(samples.unanswered)
        served = not flows.absent and not missing_workflows(flows)  # the policy then plans on the entry's rates
        for llm, why in missing.items():
            self.say(f"scepsy control: no rate for {llm} ({why}); " + ("planning on the entry's workflow rates" if served else "holding the last good plan"))
        if self.gauges is not None:
            self.gauges.observed({m: m in missing for m in self.llms})
        try:
            self.running = read_cluster(self.cluster)
        except ApplyFailed as exc:
            self.say(f"scepsy control: cannot read the cluster ({exc}); nothing changes this period")
            record.update(action="hold", reason=f"cannot read the cluster: {exc}", missing=missing)
            self._write(record)
            return record
        record["missing"] = missing
        record["workflow_missing"] = missing_workflows(flows)
        record["fleet"] = self._read_fleet()
        if self.actuation is not None and not self.actuation.finished:
            record.update(action="acting", reason="a change is in progress" + ("; its deletions wait for the missing rates" if missing else ""))
            record["act"] = self._act(now, allow_removals=not missing)
            self._write(record)
            return record
        stuck = self._off_unschedulable()
        if stuck is not None:  # the policy plans from capacity that can come: the stuck replicas placed where they can run
            self.state = replace(self.state, placement=stuck[1])
        seen = observation(now, self.llms, samples, self.running, flows)
        state, decision = decide(self.state, seen, self.context)
        if stuck is not None and decision.action != "replan":
            reason = f"move {', '.join(stuck[0])} off GPUs the scheduler cannot give them (Pending: Unschedulable)"
            decision = Decision(now, "replan", state.allocation, stuck[1], reason, inputs=decision.inputs)
            state = replace(state, placement=stuck[1], last_good=(state.allocation, stuck[1]))
        record.update(decision.to_json())
        record["time_s"] = now
        if self.gauges is not None:
            self.gauges.decided(decision.action)
        self.state = state
        if decision.action == "replan":
            try:
                record["act"] = self._begin(decision, now)
            except ApplyFailed as exc:  # the dry run's reads; an apply's failures are handled in _act
                self.say(f"scepsy control: could not read the cluster for the change ({exc}); the plan that runs stays")
                record["act"] = {"mode": self.settings.act, "phase": "failed", "problem": str(exc)}
                self._revert()
        self._write(record)
        return record

    def _read_workflows(self, down: Missing | None) -> WorkflowSamples:
        """The entry's demand per workflow; each missing rate said on stderr, unless none has a
        series (no entry scraped: the per-LLM completions serve, as the docs say)."""
        flows = read_workflows(self.prometheus, self.workflows, down)
        if down is None and not flows.absent:
            for workflow, why in missing_workflows(flows).items():
                self.say(f"scepsy control: no entry rate for workflow {workflow} ({why}); using the per-LLM completions")
        return flows

    def _read_fleet(self) -> dict:
        """Read the Nodes; where what is lost changed, plan on the cluster that is there from now
        on (the policy's context with the lost GPUs reserved). A failed read keeps the last view."""
        assert self.running is not None
        if self.whole is None:
            self.whole = self.context.instance
        try:
            nodes = self.cluster.nodes()
        except ApplyFailed as exc:
            self.say(f"scepsy control: cannot read the nodes ({exc}); planning on the GPUs last seen")
            return {**self.fleet.document(), "unread": str(exc)}
        busy = {(r.node, g) for r in self.running.replicas for g in r.gpus}
        fleet = read_fleet(self.whole, nodes, busy, self._blocked_units())
        if fleet != self.fleet:
            self.say(f"scepsy control: lost: {fleet.text()}" if not fleet.unmatched else f"scepsy control: {fleet.text()}")
            context = self.context
            self.context = make_context(shrink(self.whole, fleet), context.settings, slos_s=context.slos_s,
                                        plan_time_limit_s=context.replanner.plan_time_limit_s)
            self.fleet = fleet
        return fleet.document()

    def _blocked_units(self) -> dict[tuple[str, int], int]:
        """(node, GPU) -> the share units of the replicas whose pods the scheduler cannot place."""
        assert self.running is not None
        f = (self.whole or self.context.instance).cluster.fractions_per_gpu
        blocked: dict[tuple[str, int], int] = {}
        for replica in self.running.unschedulable:
            for gpu in replica.gpus:
                blocked[(replica.node, gpu)] = blocked.get((replica.node, gpu), 0) + round(replica.fraction * f)
        return blocked

    def _off_unschedulable(self) -> tuple[list[str], Placement] | None:
        """Where replicas of the running plan cannot be scheduled: their names and the running
        allocation placed again with the others kept, the blocked units left out (the fleet's
        context reserves them); None where none is stuck, or where the cluster has no room."""
        assert self.running is not None and self.state is not None
        stuck = {(r.llm, r.replica): r.deployment for r in self.running.unschedulable}
        placement = self.state.placement
        if not any((r.llm, r.replica) in stuck for r in placement.replicas):
            return None
        rest = Placement(placement.fractions_per_gpu, tuple(r for r in placement.replicas if (r.llm, r.replica) not in stuck))
        moved = self.context.replanner.place(self.state.allocation, rest)
        return (sorted(stuck.values()), moved) if moved is not None else None

    def _begin(self, decision: Decision, now: float) -> dict:
        assert self.state is not None and self.running is not None
        assert decision.allocation is not None and decision.placement is not None
        allocation, placement, _ = self.running.running(self.context.instance)
        renamed = keep_running_names(decision.placement, placement)
        self.state = replace(self.state, placement=renamed, last_good=(decision.allocation, renamed))
        target = self.objects(decision.allocation, renamed)
        baseline = self.objects(allocation, placement)
        if self.settings.act == "dry-run":
            found = dry_run(self.cluster, target, baseline)
            self._show(found)
            self._revert()  # nothing changed in the cluster: the policy goes on from what runs
            return {"mode": "dry-run", "changes": [f"{c.action} {c.ref}" for c in found]}
        if self.settings.act == "gauges":
            if self.gauges is not None:
                running = [(r.llm, r.deployment, r.node) for r in self.running.replicas]
                self.gauges.publish(renamed, running)
            return {"mode": "gauges", "published": _replicas(decision.allocation)}
        self.actuation = Actuation(self.cluster, target, now, self.settings.ready_timeout_s, baseline=baseline)
        self.failures, self.retry_at_s = 0, None
        return self._act(now)

    def _revert(self) -> None:
        """The policy goes on from what runs (nothing of the decision was done)."""
        assert self.state is not None and self.running is not None
        allocation, placement, _ = self.running.running(self.context.instance)
        self.state = replace(self.state, allocation=allocation, placement=placement, last_good=(allocation, placement))

    def _show(self, found: list[Change]) -> None:
        if not found:
            self.show("dry run: nothing would change")
        for change in found:
            self.show(f"dry run: {change.action} {change.ref}")
            text = change.diff()
            if text:
                self.show(text.rstrip("\n"))

    def _act(self, now: float, allow_removals: bool = True) -> dict:
        actuation = self.actuation
        assert actuation is not None and self.state is not None
        if self.retry_at_s is not None and now < self.retry_at_s:
            return {"mode": "apply", "phase": "backoff", "retry_at_s": self.retry_at_s, "failures": self.failures}
        try:
            phase = actuation.step(now, allow_removals)
        except ApplyFailed as exc:
            self.failures += 1
            wait = min(self.settings.max_retry_s, self.settings.retry_s * 2 ** (self.failures - 1))
            self.retry_at_s = now + wait
            self.say(f"scepsy control: could not apply ({exc}); the plan that runs stays, retrying in {wait:g} s")
            return {"mode": "apply", "phase": "failed", "problem": str(exc), "failures": self.failures, "retry_at_s": self.retry_at_s}
        self.failures, self.retry_at_s = 0, None
        out: dict[str, Any] = {"mode": "apply", "phase": phase, "applied": [f"{r.action} {r.ref}" for r in actuation.applied],
                               "deleted": list(actuation.deleted), "waiting_for": list(actuation.waiting_for)}
        if phase == "stuck":
            self.say(f"scepsy control: {actuation.problem}")
            out["problem"] = actuation.problem
            running = read_cluster(self.cluster)
            allocation, placement, _ = running.running(self.context.instance)
            self.state = replace(self.state, allocation=allocation, placement=placement, last_good=(allocation, placement))
        return out

    def run(self, sleep: Callable[[float], None], periods: int | None = None,
            before_period: Callable[[], None] | None = None) -> None:
        """Periods until `periods` have run (None: until interrupted), one every period_s;
        `before_period` may stop the loop by raising (a lost Lease)."""
        if before_period is not None:
            before_period()
        self.start()
        period_s = self.context.settings.period_s
        while periods is None or self.periods < periods:
            began = self.clock()
            if before_period is not None:
                before_period()
            self.period()
            if self.gauges is not None:
                self.gauges.period_done()
            if periods is not None and self.periods >= periods:
                break
            sleep(max(0.0, began + period_s - self.clock()))
