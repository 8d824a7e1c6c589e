"""Read a placed plan JSON (`scepsy plan --out`) and the instance it was made from.

Only the plan fields fixed by the plan format are read: `instance`, `fractions_per_gpu`,
`workflows[].{name, stages[].llm}`, `llms[].{name, model, gpu_type, tp, fraction, replicas}` and
`placement[].{llm, replica, node, shards[].{gpu, fraction}}`; other fields are carried along
untouched (they go into the plan ConfigMap). The file is read, and each fraction and placement
record checked, by the plan document's reader (models/plan/document.py); this module adds the checks
against the instance and the manifest view of each LLM (`PlannedLlm`: its allocation with the
model name and memory need from the instance). The instance file gives the node names, GPU memory and
the optional `gpu_uuids`, and the LLMs' memory needs.

Every inconsistency between plan and instance is an `InputError` (exit code 2) naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from scepsy.models.catalog.catalog import reported_memory_mib
from scepsy.models.errors import InputError
from scepsy.models.inputs import kind_of
from scepsy.models.instance.allocation import ReplicaPlacement
from scepsy.models.instance.instance import Instance, load_instance
from scepsy.models.plan.document import parse_replica, parse_units, read_json

@dataclass(frozen=True)
class PlannedLlm:
    name: str
    model: str
    gpu_type: str
    tp: int
    share: int  # units of 1/F per shard
    replicas: int
    memory_need_gib: float  # weights_gib + min_kv_gib, from the instance
    weights_gib: float  # from the instance (sizes the pod's host memory)


@dataclass(frozen=True)
class PlannedWorkflow:
    name: str
    llms: tuple[str, ...]


@dataclass(frozen=True)
class PlacedPlan:
    """What the manifests realise: the LLM choices, their placement and the cluster's facts."""

    source: str  # the plan file
    raw: dict  # the plan JSON as read (stored in the plan ConfigMap)
    instance: Instance
    fractions_per_gpu: int
    llms: tuple[PlannedLlm, ...]
    workflows: tuple[PlannedWorkflow, ...]
    replicas: tuple[ReplicaPlacement, ...]  # sorted by (llm, replica)

    @cached_property
    def _llms_by_name(self) -> dict[str, PlannedLlm]:
        return {m.name: m for m in self.llms}

    @cached_property
    def _uuids_by_node(self) -> dict[str, tuple[str, ...] | None]:
        return {n.name: n.gpu_uuids for n in self.instance.cluster.nodes}

    def llm(self, name: str) -> PlannedLlm:
        return self._llms_by_name[name]

    def gpu_uuids(self, node: str) -> tuple[str, ...] | None:
        return self._uuids_by_node[node]

    def gpu_memory_gib(self, llm: str) -> float:
        return float(self.instance.cluster.gpu_types[self.llm(llm).gpu_type].memory_gib)

    def gpu_reported_mib(self, llm: str) -> int:
        """The memory NVML reports for the LLM's GPU type (what sharing stacks divide), MiB."""
        return reported_memory_mib(self.llm(llm).gpu_type, self.gpu_memory_gib(llm))

    def workflows_of(self, llm: str) -> tuple[str, ...]:
        return tuple(w.name for w in self.workflows if llm in w.llms)


def resolve_instance_path(plan_path: Path, recorded: object, override: Path | None) -> Path:
    """The instance file: `override`, else the plan's `instance` relative to the current
    directory, else relative to the plan file's directory."""
    if override is not None:
        if kind_of(override) != "file":
            raise InputError(str(override), None, "instance file not found", "pass an existing file as `instance`", argument=True)
        return override
    if not isinstance(recorded, str) or not recorded:
        raise InputError(
            str(plan_path), "instance", "the plan does not name its instance file", "pass the instance YAML as `instance`"
        )
    candidates = [Path(recorded)] if Path(recorded).is_absolute() else [Path(recorded), plan_path.parent / recorded]
    for candidate in candidates:
        if kind_of(candidate) == "file":
            return candidate
    tried = " and ".join(str(c) for c in candidates)
    raise InputError(
        str(plan_path),
        "instance",
        f"instance file {recorded!r} not found (tried {tried})",
        "run from the directory the plan was made in, or pass the instance YAML as `instance`",
    )


def _read_json(path: Path) -> dict:
    raw = read_json(path, "pass a plan JSON written by `scepsy plan --out`")
    if not isinstance(raw, dict):
        raise InputError(str(path), None, "not a JSON object", "pass a plan JSON written by `scepsy plan --out`")
    return raw


def _require_list(source: str, raw: dict, key: str) -> list:
    value = raw.get(key)
    if not isinstance(value, list) or not value:
        fix = "make the plan with `scepsy plan INSTANCE --out PLAN.json` (plans always carry a placement)"
        raise InputError(source, key, "missing or empty list", fix)
    return value


def _int_field(source: str, where: str, record: dict, key: str, minimum: int) -> int:
    value = record.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InputError(source, f"{where}.{key}", f"expected an integer >= {minimum}, got {value!r}", "fix the plan")
    return value


def _parse_llms(source: str, raw: dict, instance: Instance, f: int) -> tuple[PlannedLlm, ...]:
    llms = []
    for i, record in enumerate(_require_list(source, raw, "llms")):
        where = f"llms[{i}]"
        if not isinstance(record, dict):
            raise InputError(source, where, "expected an object", "fix the plan")
        name = record.get("name")
        if not isinstance(name, str) or name not in {m.name for m in instance.llms}:
            known = ", ".join(m.name for m in instance.llms)
            raise InputError(source, f"{where}.name", f"llm {name!r} is not in the instance", f"use a plan of this instance (llms: {known})")
        spec = instance.llm(name)
        gpu_type = record.get("gpu_type")
        if not isinstance(gpu_type, str) or gpu_type not in instance.cluster.gpu_types:
            raise InputError(source, f"{where}.gpu_type", f"unknown gpu type {gpu_type!r}", "use a plan of this instance")
        tp = _int_field(source, where, record, "tp", 1)
        replicas = _int_field(source, where, record, "replicas", 1)
        share = parse_units(source, f"{where}.fraction", record.get("fraction"), f)
        model = record["model"] if isinstance(record.get("model"), str) else spec.model
        llms.append(PlannedLlm(spec.name, model, gpu_type, tp, share, replicas, spec.memory_need_gib, spec.weights_gib))
    names = [m.name for m in llms]
    if len(set(names)) != len(names):
        raise InputError(source, "llms", "an llm is listed twice", "list each llm once")
    return tuple(llms)


def _parse_workflows(source: str, raw: dict, llm_names: set[str]) -> tuple[PlannedWorkflow, ...]:
    workflows = []
    for i, record in enumerate(_require_list(source, raw, "workflows")):
        where = f"workflows[{i}]"
        if not isinstance(record, dict) or not isinstance(record.get("name"), str):
            raise InputError(source, where, "expected an object with a name", "fix the plan")
        stages = record.get("stages")
        if not isinstance(stages, list) or not stages:
            raise InputError(source, f"{where}.stages", "missing or empty list", "fix the plan")
        called = []
        for s, stage in enumerate(stages):
            llm = stage.get("llm") if isinstance(stage, dict) and isinstance(stage.get("llm"), str) else None
            if llm not in llm_names:
                raise InputError(source, f"{where}.stages[{s}].llm", f"llm {llm!r} has no allocation in the plan", "fix the plan")
            called.append(llm)
        workflows.append(PlannedWorkflow(record["name"], tuple(called)))
    return tuple(workflows)


def _parse_placement(source: str, raw: dict, instance: Instance, llms: tuple[PlannedLlm, ...], f: int) -> tuple[ReplicaPlacement, ...]:
    """The placement (models/plan/document.py checks each record's structure), checked against
    the plan's LLMs and the instance's cluster."""
    by_name = {m.name: m for m in llms}
    nodes = {n.name: n for n in instance.cluster.nodes}
    replicas = []
    for i, record in enumerate(_require_list(source, raw, "placement")):
        where = f"placement[{i}]"
        replica = parse_replica(source, i, record, f)
        llm = by_name.get(replica.llm)
        if llm is None:
            raise InputError(source, f"{where}.llm", f"llm {replica.llm!r} has no allocation in the plan", "fix the plan")
        node = nodes.get(replica.node)
        if node is None:
            raise InputError(source, f"{where}.node", f"node {replica.node!r} is not in the instance's cluster", "use a plan of this instance")
        if node.gpu_type != llm.gpu_type:
            raise InputError(source, f"{where}.node", f"node {node.name} has {node.gpu_type} GPUs, the plan chose {llm.gpu_type} for {llm.name}", "fix the plan")
        if len(replica.shards) != llm.tp:
            raise InputError(source, f"{where}.shards", f"expected {llm.tp} shards (tp of {llm.name})", "fix the plan")
        for s, shard in enumerate(replica.shards):
            if shard.gpu >= node.gpus:
                raise InputError(source, f"{where}.shards[{s}].gpu", f"GPU {shard.gpu!r} is not in 0..{node.gpus - 1} on node {node.name}", "fix the plan")
            if shard.units != llm.share:
                raise InputError(source, f"{where}.shards[{s}].fraction", f"shard fraction {shard.units / f:g} differs from {llm.name}'s fraction {llm.share / f:g}", "fix the plan")
        if len(set(replica.gpus)) != len(replica.shards):
            raise InputError(source, f"{where}.shards", "two shards of one replica on the same GPU", "fix the plan")
        replicas.append(replica)
    replicas.sort(key=lambda r: (r.llm, r.replica))
    for llm in llms:
        numbers = [r.replica for r in replicas if r.llm == llm.name]
        if numbers != list(range(llm.replicas)):
            raise InputError(source, "placement", f"llm {llm.name} has replicas {numbers}, the plan says {llm.replicas}", "place replicas 0..replicas-1 once each")
    load: dict[tuple[str, int], int] = {}
    for r in replicas:
        for shard in r.shards:
            load[(r.node, shard.gpu)] = load.get((r.node, shard.gpu), 0) + shard.units
    for (node_name, gpu), units in sorted(load.items()):
        if units > f:
            raise InputError(source, "placement", f"node {node_name} GPU {gpu} holds {units / f:g} GPUs of shards", "fix the plan: at most 1.0 per GPU")
    return tuple(replicas)


def load_placed_plan(plan_path: Path | str, instance_path: Path | None = None) -> PlacedPlan:
    plan_path = Path(plan_path)
    raw = _read_json(plan_path)
    source = str(plan_path)
    instance = load_instance(resolve_instance_path(plan_path, raw.get("instance"), instance_path))
    f = raw.get("fractions_per_gpu")
    if f != instance.cluster.fractions_per_gpu:
        raise InputError(
            source,
            "fractions_per_gpu",
            f"{f!r} differs from the instance's {instance.cluster.fractions_per_gpu}",
            "use the instance the plan was made from (`instance`)",
        )
    f = instance.cluster.fractions_per_gpu  # equal to the plan's, and an int
    llms = _parse_llms(source, raw, instance, f)
    workflows = _parse_workflows(source, raw, {m.name for m in llms})
    replicas = _parse_placement(source, raw, instance, llms, f)
    return PlacedPlan(source, raw, instance, f, llms, workflows, replicas)
