"""Acting on a decision: bring the cluster from the plan that runs to the target plan, changing only
what differs, without a gateway restart and without losing a request.

The target's objects are the manifests writer's (k8s/manifests.py `build_objects` of the target
plan, with the settings the plan was deployed with). Against the cluster, in this order:

1. refuse when a HorizontalPodAutoscaler or a KEDA ScaledObject targets one of the engine
   Deployments (two controllers would fight over the same replicas): `AutoscalerConflict`;
2. server-side apply (k8s/apply.py, field manager `scepsy`) of every target object that is missing
   or whose fields differ from the live object's (the live object may carry more: defaults,
   status); nothing else is sent. New engine Deployments join their LLM's gateway when their pod is
   Ready (the gateways discover replicas by Kubernetes service discovery: docs/deploy.md, "Scaling
   and draining"), so nothing else changes for them;
3. once every added or changed replica is Ready, delete the engine Deployments the target no longer
   has: each pod gets a deletionTimestamp, the gateways drop it at
   once, and its preStop hook returns only when its running and queued requests are done, so a
   replica leaves its gateway before its pod goes. A removed replica whose GPUs an added one needs
   is deleted first instead (the added one could not start beside it), one replica of an LLM at a
   time: it goes where its LLM keeps another Ready replica; as its LLM's last serving one it waits
   while a new replica of its LLM will serve without its GPUs (scheduled and starting, or waiting
   for the GPUs of a replica deleted before it), and goes where none will (its successor needs
   its GPUs: the LLM serves nothing until the successor is Ready, which the policy allows only
   where the running plan is overloaded). So an LLM with two or more replicas swaps them rolling;
4. last, the workflow entry's Deployment where the target changes it (its hold, `--max-in-flight`,
   follows the LLMs' replicas: raised only once the replicas that carry it are Ready), then the
   plan ConfigMap `scepsy-plan` with the target plan: the record of the plan that runs completely.

`Actuation.step` does what can be done now and says what it waits for; the loop calls it again
each period until it is `done`. A replica that is not Ready within `ready_timeout_s` stops the
actuation as `stuck`: the replicas it added are deleted again and the replicas they would have
replaced keep running (never fewer replicas on a change that did not complete). A dry run (`diff`) only reads and prints what would change.

On start (and after a restart) the running state is read from the cluster, not remembered:
`read_cluster` turns the engine Deployments' labels (`scepsy.io/llm`, `scepsy.io/replica`) and
their pod templates' annotations (`scepsy.io/node`, `scepsy.io/gpus`, `scepsy.io/fraction`) into
the placement that runs, with each replica's readiness from its pod, and reads the plan ConfigMap.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import yaml

from scepsy.k8s import names
from scepsy.k8s.apply import APPLY_ORDER, ApplyResult, classify, comparable, summarize
from scepsy.k8s.entry import NAME as ENTRY_NAME
from scepsy.k8s.manifests import PLAN_CONFIGMAP
from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import Instance

ENGINE_COMPONENT = "engine"
DELETABLE_KINDS = ("Deployment",)


class AutoscalerConflict(InputError):
    """An HPA or a ScaledObject already scales a Deployment the controller would change."""


class ApplyFailed(RuntimeError):
    """The API server refused an apply or a delete, or did not answer in time."""


class Cluster(Protocol):
    """What the controller reads and writes in Kubernetes (KubeCluster; tests use the real client
    against a loopback API double)."""

    namespace: str

    def deployments(self) -> list[dict]: ...

    def pods(self) -> list[dict]: ...

    def configmap(self, name: str) -> dict | None: ...

    def autoscalers(self) -> list[dict]: ...

    def nodes(self) -> list[dict]: ...

    def get(self, obj: dict) -> dict | None: ...

    def apply(self, obj: dict, dry_run: bool) -> dict: ...

    def delete(self, kind: str, name: str) -> None: ...


# ---------------------------------------------------------------------------------------------
# The running state, read from the cluster


@dataclass(frozen=True)
class RunningReplica:
    deployment: str
    llm: str
    replica: int
    node: str
    gpus: tuple[int, ...]
    fraction: float
    ready: bool
    deleting: bool  # scale-down in progress: the pod drains
    unschedulable: bool = False  # its pod is Pending and the scheduler cannot place it: no capacity, ever, where it is


@dataclass(frozen=True)
class ClusterState:
    replicas: tuple[RunningReplica, ...]
    plan: dict | None  # the plan ConfigMap's plan JSON (the last plan applied completely)
    unreadable: tuple[str, ...] = ()  # engine Deployments whose labels or annotations are not scepsy's

    def ready(self, llm: str) -> int:
        return sum(r.ready and not r.deleting for r in self.replicas if r.llm == llm)

    def starting(self, llm: str) -> int:
        return sum(not r.ready and not r.deleting for r in self.replicas if r.llm == llm)

    @property
    def unschedulable(self) -> tuple[RunningReplica, ...]:
        """The replicas whose pod the scheduler cannot place (not draining)."""
        return tuple(r for r in self.replicas if r.unschedulable and not r.deleting)

    def running(self, instance: Instance) -> tuple[Allocation, Placement, tuple[str, ...]]:
        """The allocation and placement the replicas that run or start realise (not those
        draining), and the Deployments left out: of an LLM the instance does not have, or of a
        second shape of one LLM (a restart in the middle of a change of its shape; the replicas of
        the shape most of its replicas have stay, ties to the shape with more Ready replicas, then
        to the shape of its lowest replica: an interrupted change is rolled back, and the policy
        decides again from what serves)."""
        f = instance.cluster.fractions_per_gpu
        known = {m.name for m in instance.llms}
        nodes = {n.name for n in instance.cluster.nodes}
        choices, replicas, odd = [], [], []
        for llm in instance.llms:
            mine = sorted((r for r in self.replicas if r.llm == llm.name and not r.deleting), key=lambda r: r.replica)
            odd += [r.deployment for r in mine if r.node not in nodes]
            mine = [r for r in mine if r.node in nodes]
            shapes: dict[tuple[str, int, int], list[RunningReplica]] = {}
            for r in mine:
                shape = (instance.cluster.node(r.node).gpu_type, len(r.gpus), round(r.fraction * f))
                shapes.setdefault(shape, []).append(r)
            if not shapes:
                continue
            shape = max(shapes, key=lambda k: (len(shapes[k]), sum(r.ready for r in shapes[k]), -shapes[k][0].replica))
            choices.append(LlmAllocation(llm.name, shape[0], shape[1], shape[2], len(shapes[shape])))
            for r in mine:
                if r in shapes[shape]:
                    replicas.append(ReplicaPlacement(r.llm, r.replica, r.node, tuple(Shard(g, shape[2]) for g in r.gpus)))
                else:
                    odd.append(r.deployment)
        odd += [r.deployment for r in self.replicas if r.llm not in known and not r.deleting]
        return Allocation(f, tuple(choices)), Placement(f, tuple(sorted(replicas, key=lambda r: (r.llm, r.replica)))), tuple(sorted(odd))


def _annotations(deployment: dict) -> dict:
    """The placement annotations the manifests writer puts on the engine's pod template."""
    template = ((deployment.get("spec") or {}).get("template") or {}).get("metadata") or {}
    return {**(deployment["metadata"].get("annotations") or {}), **(template.get("annotations") or {})}


def keep_running_names(target: Placement, running: Placement) -> Placement:
    """The target placement with every replica that runs unchanged (same LLM, node, GPUs and
    shares) under its running index, and every other one under an index no running replica of its
    LLM has: a changed replica becomes a new Deployment beside the old one, which leaves only once
    the new one is Ready, never a Deployment replaced in place (an outage of that replica)."""
    def body(r: ReplicaPlacement) -> tuple:
        return (r.llm, r.node, r.shards)

    runs = {body(r): r.replica for r in running.replicas}
    used: dict[str, set[int]] = {}
    for r in running.replicas:
        used.setdefault(r.llm, set()).add(r.replica)
    kept, fresh = [], []
    for r in sorted(target.replicas, key=lambda r: (r.llm, r.replica)):
        index = runs.pop(body(r), None)
        if index is None:
            fresh.append(r)
        else:
            kept.append(ReplicaPlacement(r.llm, index, r.node, r.shards))
    for r in kept:
        used.setdefault(r.llm, set()).add(r.replica)
    for r in fresh:
        taken = used.setdefault(r.llm, set())
        index = next(k for k in range(len(taken) + 1) if k not in taken)
        taken.add(index)
        kept.append(ReplicaPlacement(r.llm, index, r.node, r.shards))
    return Placement(target.fractions_per_gpu, tuple(sorted(kept, key=lambda r: (r.llm, r.replica))))


def _replica_of(deployment: dict, ready: bool, unschedulable: bool = False) -> RunningReplica | None:
    meta = deployment["metadata"]
    labels, notes = meta.get("labels") or {}, _annotations(deployment)
    try:
        gpus = tuple(int(g) for g in str(notes["scepsy.io/gpus"]).split(","))
        return RunningReplica(meta["name"], labels[names.LLM_LABEL], int(labels[names.REPLICA_LABEL]), str(notes["scepsy.io/node"]),
                              gpus, float(notes["scepsy.io/fraction"]), ready,
                              bool(meta.get("deletionTimestamp") or meta.get("deletion_timestamp")), unschedulable and not ready)
    except (KeyError, ValueError):
        return None


def _is_entry(obj: dict) -> bool:
    return obj["kind"] == "Deployment" and obj["metadata"]["name"] == ENTRY_NAME


def is_engine(deployment: dict) -> bool:
    labels = deployment["metadata"].get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == names.MANAGED_BY and labels.get("app.kubernetes.io/component") == ENGINE_COMPONENT


def read_cluster(cluster: Cluster) -> ClusterState:
    """The replicas that run (Deployments' labels and annotations, pods' readiness) and the plan
    ConfigMap: what a (re)started controller starts from."""
    deployments = [d for d in cluster.deployments() if is_engine(d)]
    rows = {r.deployment: r for r in summarize(deployments, cluster.pods())}
    replicas, unreadable = [], []
    for deployment in sorted(deployments, key=lambda d: d["metadata"]["name"]):
        name = deployment["metadata"]["name"]
        row = rows.get(name)
        replica = _replica_of(deployment, row.ready if row else False, row.unschedulable if row else False)
        if replica is None:
            unreadable.append(name)
        else:
            replicas.append(replica)
    configmap = cluster.configmap(PLAN_CONFIGMAP)
    plan = None
    if configmap is not None:
        try:
            plan = json.loads((configmap.get("data") or {}).get("plan.json") or "null")
        except ValueError:
            plan = None
    return ClusterState(tuple(replicas), plan if isinstance(plan, dict) else None, tuple(unreadable))


# ---------------------------------------------------------------------------------------------
# Autoscalers that would fight the controller


def autoscaler_conflicts(autoscalers: Iterable[dict], deployments: set[str]) -> list[str]:
    """`kind/name -> deployment` for every HPA or ScaledObject whose scaleTargetRef is one of
    `deployments` (a ScaledObject's kind defaults to Deployment, KEDA's default)."""
    found = []
    for scaler in autoscalers:
        target = (scaler.get("spec") or {}).get("scaleTargetRef") or (scaler.get("spec") or {}).get("scale_target_ref") or {}
        kind = target.get("kind") or "Deployment"
        if kind == "Deployment" and target.get("name") in deployments:
            found.append(f"{scaler['kind']}/{scaler['metadata']['name']} -> deployment/{target['name']}")
    return sorted(found)


def refuse_autoscalers(cluster: Cluster, deployments: set[str]) -> None:
    conflicts = autoscaler_conflicts(cluster.autoscalers(), deployments)
    if conflicts:
        raise AutoscalerConflict(
            f"namespace {cluster.namespace}", None,
            f"already scaled by another autoscaler: {', '.join(conflicts)}",
            "delete those HorizontalPodAutoscalers/ScaledObjects (or run the controller with `act` gauges, "
            "for KEDA to actuate its desired replicas)",
        )


# ---------------------------------------------------------------------------------------------
# What changes


def contains(live: object, desired: object) -> bool:
    """Whether the live object holds every field of the desired one with the same value (the API
    server adds defaults and status, which do not count as a change)."""
    if isinstance(desired, dict):
        return isinstance(live, dict) and all(k in live and contains(live[k], v) for k, v in desired.items())
    if isinstance(desired, list):
        return isinstance(live, list) and len(live) == len(desired) and all(contains(a, b) for a, b in zip(live, desired))
    return live == desired


def _key(obj: dict) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def _engine_name(obj: dict) -> str | None:
    return obj["metadata"]["name"] if obj["kind"] == "Deployment" and is_engine(obj) else None


@dataclass(frozen=True)
class Change:
    action: str  # create | update | delete
    kind: str
    name: str
    before: dict | None
    after: dict | None

    @property
    def ref(self) -> str:
        return f"{self.kind.lower()}/{self.name}"

    def diff(self) -> str:
        """A unified diff of the object's YAML (what `--act dry-run` prints)."""
        old = _yaml(_restricted(self.before, self.after)) if self.before is not None else ""
        new = _yaml(self.after) if self.after is not None else ""
        lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                     f"live/{self.ref}", f"target/{self.ref}", n=2)
        return "".join(lines)


def _yaml(obj: dict) -> str:
    return yaml.safe_dump(obj, sort_keys=True, default_flow_style=False, width=1000)


def _restricted(live: dict | None, desired: dict | None) -> dict:
    """The live object restricted to the desired object's fields (for a readable diff)."""
    if live is None:
        return {}
    if desired is None:
        return comparable(live)

    def cut(a: object, b: object) -> object:
        if isinstance(a, dict) and isinstance(b, dict):
            return {k: cut(a[k], b[k]) for k in b if k in a}
        if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            return [cut(x, y) for x, y in zip(a, b)]
        return a

    out = cut(live, desired)
    return out if isinstance(out, dict) else {}


def changes(cluster: Cluster, target: Sequence[dict], live_engines: Sequence[dict], baseline: Sequence[dict] = ()) -> list[Change]:
    """The target objects to create or update (in apply order), then the engine Deployments to
    delete. An object is updated only where the plan changed it (it differs from `baseline`, the
    same settings' objects of the plan that runs) and the live object does not hold it already: a
    setting the operator deployed with and did not pass here is never rewritten."""
    out = []
    order = {kind: i for i, kind in enumerate(APPLY_ORDER)}
    before = {_key(o): o for o in baseline}
    for obj in sorted(target, key=lambda o: order.get(o["kind"], len(APPLY_ORDER))):
        if obj["kind"] == "ConfigMap" and obj["metadata"]["name"] == PLAN_CONFIGMAP:
            continue  # written last, by the actuation
        live = cluster.get(obj)
        if live is None:
            out.append(Change("create", obj["kind"], obj["metadata"]["name"], None, obj))
        elif before.get(_key(obj)) != obj and not contains(live, obj):
            out.append(Change("update", obj["kind"], obj["metadata"]["name"], live, obj))
    wanted = {_key(o) for o in target}
    for deployment in sorted(live_engines, key=lambda d: d["metadata"]["name"]):
        if _key(deployment) not in wanted and not deployment["metadata"].get("deletionTimestamp"):
            out.append(Change("delete", "Deployment", deployment["metadata"]["name"], deployment, None))
    return out


# ---------------------------------------------------------------------------------------------
# Acting


@dataclass
class Actuation:
    """Bringing the cluster to one target plan, across periods (module docstring)."""

    cluster: Cluster
    target: list[dict]  # the manifests writer's objects of the target plan
    started_s: float
    ready_timeout_s: float
    baseline: list[dict] = field(default_factory=list)  # the same settings' objects of the plan that ran
    applied: list[ApplyResult] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    created_engines: set[str] = field(default_factory=set)  # engine Deployments this actuation created
    deleted_gpus: dict[str, tuple] = field(default_factory=dict)  # the GPUs of each replica it deleted for a successor
    waiting_for: tuple[str, ...] = ()
    phase: str = "new"  # new | waiting | done | stuck | failed
    problem: str | None = None

    @property
    def finished(self) -> bool:
        return self.phase in ("done", "stuck", "failed")

    def _plan_configmap(self) -> dict:
        return next(o for o in self.target if o["kind"] == "ConfigMap" and o["metadata"]["name"] == PLAN_CONFIGMAP)

    def step(self, now_s: float, allow_removals: bool = True) -> str:
        """Do what can be done now; the phase after it. `allow_removals` False holds every deletion
        (the loop's data is missing: nothing scales down on it). API failures raise ApplyFailed."""
        if self.finished:
            return self.phase
        live_engines = [d for d in self.cluster.deployments() if is_engine(d)]
        live_names = {d["metadata"]["name"] for d in live_engines}
        target_engines = {n for o in self.target if (n := _engine_name(o)) is not None}
        refuse_autoscalers(self.cluster, target_engines | live_names)
        pending = changes(self.cluster, self.target, live_engines, self.baseline)
        removals = [c for c in pending if c.action == "delete"]
        entry_changes = [c.after for c in pending if c.after is not None and _is_entry(c.after)]
        for change in pending:
            if change.action != "delete" and change.after is not None and change.after not in entry_changes:
                self._apply(change.after)
                if change.action == "create" and _engine_name(change.after) is not None:
                    self.created_engines.add(change.name)
        # a removal whose GPUs an added replica not Ready yet needs goes first (the new pod could
        # not start beside it), in the rolling order of _rolling
        state = read_cluster(self.cluster)
        ready = {r.deployment for r in state.replicas if r.ready}
        added_gpus = {g for o in self.target if (n := _engine_name(o)) is not None and n not in ready
                      and (n in self.created_engines or n not in live_names) for g in _gpus(o)}
        blocking = [c for c in removals if c.before is not None and set(_gpus(c.before)) & added_gpus] if allow_removals else []
        for change in self._rolling(blocking, state):
            self._delete(change)
        # the deletions touch no target engine: the state read above still says which are not Ready
        not_ready = tuple(sorted(r.deployment for r in state.replicas if r.deployment in target_engines and not r.ready and not r.deleting))
        missing = tuple(sorted(target_engines - {r.deployment for r in state.replicas}))
        self.waiting_for = not_ready + missing
        if self.waiting_for:
            if now_s - self.started_s >= self.ready_timeout_s:
                # give up: remove the replicas this actuation added that never became ready; the
                # replicas they were to replace were never deleted and keep serving
                for name in sorted(self.created_engines & set(self.waiting_for)):
                    self._delete(Change("delete", "Deployment", name, None, None))
                self.phase = "stuck"
                self.problem = (f"{', '.join(self.waiting_for)} not ready after {now_s - self.started_s:.0f} s "
                                f"(limit {self.ready_timeout_s:g} s): removed the ones it added; the replicas they "
                                "were to replace keep running")
            else:
                self.phase = "waiting"
            return self.phase
        if not allow_removals and any(c not in blocking for c in removals):
            self.phase = "waiting"  # for data: the deletions wait until the rates can be read again
            return self.phase
        for change in removals:
            if change not in blocking:
                self._delete(change)
        for obj in entry_changes:
            self._apply(obj)
        self._apply(self._plan_configmap())
        self.phase = "done"
        return self.phase

    def _rolling(self, blocking: list[Change], state: ClusterState) -> list[Change]:
        """The removals whose GPUs an added replica needs that go now, in the staged order: one
        goes where its LLM keeps another Ready replica serving; as its LLM's last serving one it
        waits while a new replica of its LLM will serve without its GPUs (one starting: scheduled,
        not Ready; or one waiting for GPUs a replica this actuation deleted frees), so an LLM
        with two or more replicas swaps them one at a time and never goes dark; where none will,
        it goes (break before make: its successor needs its GPUs)."""
        by_name = {r.deployment: r for r in state.replicas}
        serving = {r.deployment for r in state.replicas if r.ready and not r.deleting}
        freeing = {g for gpus in self.deleted_gpus.values() for g in gpus}
        targets = {n: _gpus(o) for o in self.target if (n := _engine_name(o)) is not None}
        new = [(r, targets[r.deployment]) for r in state.replicas if r.deployment in targets and not r.ready and not r.deleting]
        out = []
        for change in sorted(blocking, key=lambda c: c.name):
            replica = by_name.get(change.name)
            gpus = _gpus(change.before) if change.before is not None else set()
            if replica is not None and not any(n != change.name and by_name[n].llm == replica.llm for n in serving):
                coming = any(r.llm == replica.llm and not (needs & gpus) and (not r.unschedulable or needs & freeing)
                             for r, needs in new)
                if coming:
                    continue
            out.append(change)
            serving.discard(change.name)
            self.deleted_gpus[change.name] = tuple(sorted(gpus))
        return out

    def _apply(self, obj: dict) -> None:
        before = self.cluster.get(obj)
        try:
            after = self.cluster.apply(obj, False)
        except InputError as exc:
            raise ApplyFailed(exc.problem) from None
        meta = obj["metadata"]
        self.applied.append(ApplyResult(obj["kind"], meta.get("namespace"), meta["name"], classify(before, after)))

    def _delete(self, change: Change) -> None:
        self.cluster.delete(change.kind, change.name)
        self.deleted.append(change.ref)


def _gpus(deployment: dict) -> set[tuple[str, int]]:
    notes = _annotations(deployment)
    node, gpus = notes.get("scepsy.io/node"), notes.get("scepsy.io/gpus")
    if not node or not gpus:
        return set()
    return {(str(node), int(g)) for g in str(gpus).split(",")}


def dry_run(cluster: Cluster, target: Sequence[dict], baseline: Sequence[dict] = ()) -> list[Change]:
    """What `step` would change, read only (autoscaler conflicts still refuse)."""
    live_engines = [d for d in cluster.deployments() if is_engine(d)]
    target_engines = {n for o in target if (n := _engine_name(o)) is not None}
    refuse_autoscalers(cluster, target_engines | {d["metadata"]["name"] for d in live_engines})
    pending = changes(cluster, target, live_engines, baseline)
    plan = next((o for o in target if o["kind"] == "ConfigMap" and o["metadata"]["name"] == PLAN_CONFIGMAP), None)
    if plan is not None:
        live = cluster.get(plan)
        if live is None or not contains(live, plan):
            pending.append(Change("create" if live is None else "update", "ConfigMap", PLAN_CONFIGMAP, live, plan))
    return pending


# ---------------------------------------------------------------------------------------------
# The Kubernetes API


class KubeCluster:
    """The controller's view of one namespace through the official client's dynamic client
    (k8s/apply.py's KubeApplier for server-side apply). Every call has a timeout; a refusal or a
    timeout is ApplyFailed."""

    def __init__(self, api_client, namespace: str, timeout_s: float = 10.0):
        from scepsy.k8s.apply import KubeApplier

        self.api_client = api_client
        self.namespace = namespace
        self.timeout_s = timeout_s
        self.applier = KubeApplier(api_client, timeout_s)

    def _list(self, api_version: str, kind: str, what: str, selector: str | None = None, optional: bool = False) -> list[dict]:
        """The namespace's objects of a kind, as the API serves them (the dynamic client: plain
        dicts, no typed models); `optional`: a kind the cluster does not serve is an empty list."""
        from kubernetes.dynamic.exceptions import DynamicApiError, ResourceNotFoundError

        try:
            resource = self.applier.client.resources.get(api_version=api_version, kind=kind)
            found = resource.get(namespace=self.namespace, label_selector=selector, _request_timeout=self.timeout_s)
        except ResourceNotFoundError:
            if optional:
                return []
            raise ApplyFailed(f"list {what}: the cluster does not serve {kind} in {api_version}") from None
        except DynamicApiError as exc:
            raise ApplyFailed(f"list {what}: the API server answered {exc.status} {exc.reason}") from None
        except Exception as exc:  # noqa: BLE001 - transport failures and timeouts of the client (urllib3)
            raise ApplyFailed(f"list {what}: {type(exc).__name__}: {exc}") from None
        return [dict(item, kind=kind) for item in found.to_dict().get("items") or []]

    def deployments(self) -> list[dict]:
        return self._list("apps/v1", "Deployment", "deployments", f"app.kubernetes.io/managed-by={names.MANAGED_BY}")

    def pods(self) -> list[dict]:
        return self._list("v1", "Pod", "pods", f"app.kubernetes.io/managed-by={names.MANAGED_BY}")

    def configmap(self, name: str) -> dict | None:
        return self.get({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": self.namespace}})

    def autoscalers(self) -> list[dict]:
        """HorizontalPodAutoscalers and, where KEDA is installed, ScaledObjects."""
        return (self._list("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers")
                + self._list("keda.sh/v1alpha1", "ScaledObject", "scaledobjects", optional=True))

    def nodes(self) -> list[dict]:
        """The cluster's Nodes (cluster-scoped: their conditions and allocatable GPUs, control/fleet.py)."""
        from kubernetes.dynamic.exceptions import DynamicApiError

        try:
            resource = self.applier.client.resources.get(api_version="v1", kind="Node")
            found = resource.get(_request_timeout=self.timeout_s)
        except DynamicApiError as exc:
            raise ApplyFailed(f"list nodes: the API server answered {exc.status} {exc.reason}") from None
        except Exception as exc:  # noqa: BLE001 - transport failures and timeouts of the client (urllib3)
            raise ApplyFailed(f"list nodes: {type(exc).__name__}: {exc}") from None
        return [dict(item, kind="Node") for item in found.to_dict().get("items") or []]

    def get(self, obj: dict) -> dict | None:
        try:
            return self.applier.get(obj)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - transport failures and timeouts
            raise ApplyFailed(f"read {obj['kind']}/{obj['metadata']['name']}: {type(exc).__name__}: {exc}") from None

    def apply(self, obj: dict, dry_run: bool) -> dict:
        try:
            return self.applier.apply(obj, dry_run)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - transport failures and timeouts
            raise ApplyFailed(f"apply {obj['kind']}/{obj['metadata']['name']}: {type(exc).__name__}: {exc}") from None

    def delete(self, kind: str, name: str) -> None:
        """A graceful delete (the pod's preStop hook drains it), background propagation."""
        from kubernetes.dynamic.exceptions import DynamicApiError, NotFoundError

        if kind not in DELETABLE_KINDS:
            raise ValueError(f"the controller deletes only {', '.join(DELETABLE_KINDS)}, not {kind}")
        try:
            resource = self.applier.client.resources.get(api_version="apps/v1", kind=kind)
            resource.delete(name=name, namespace=self.namespace, body={"propagationPolicy": "Background"},
                            _request_timeout=self.timeout_s)
        except NotFoundError:
            return  # already gone
        except DynamicApiError as exc:
            raise ApplyFailed(f"delete {kind.lower()} {name}: the API server answered {exc.status} {exc.reason}") from None
        except Exception as exc:  # noqa: BLE001 - transport failures and timeouts
            raise ApplyFailed(f"delete {kind.lower()} {name}: {type(exc).__name__}: {exc}") from None

