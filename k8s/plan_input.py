"""Read a placed plan JSON (`scepsy plan --out`) and the instance it was made from.

The plan is read and checked by the plan document's reader (models/plan/document.py `deployable_plan`:
its schema, its allocation on the instance, its placement by the placement validator); the file as
read goes into the plan ConfigMap. This module finds the instance file, requires the workflows (their
names label the objects) and gives the manifest view of each LLM (`PlannedLlm`: its allocation with
the model name and memory need from the instance). The instance file gives the node names, GPU
memory and the optional `gpu_uuids`, and the LLMs' memory needs.

Every inconsistency between plan and instance is an `InputError` (exit code 2) naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from scepsy.models.catalog.catalog import reported_memory_mib
from scepsy.models.errors import InputError
from scepsy.models.inputs import kind_of
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement
from scepsy.models.instance.instance import Instance, load_instance
from scepsy.models.performance.alp import Prediction, predict
from scepsy.models.plan.document import PlanDocument, deployable_plan, read_document

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

    @cached_property
    def prediction(self) -> Prediction:
        """The pipeline's prediction of this plan at its instance's rates (entry limits, recovery limits)."""
        return predict(self.instance, Allocation(self.fractions_per_gpu, tuple(
            LlmAllocation(m.name, m.gpu_type, m.tp, m.share, m.replicas) for m in self.llms)))

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


def _workflows(source: str, document: PlanDocument, llm_names: set[str]) -> tuple[PlannedWorkflow, ...]:
    """The workflows the plan serves, with the LLMs each calls (labels of their objects)."""
    if not document.workflows:
        raise InputError(source, "workflows", "missing or empty list",
                         "make the plan with `scepsy plan INSTANCE --out PLAN.json` (a placed allocation has no workflows)")
    workflows = []
    for i, record in enumerate(document.workflows):
        for s, stage in enumerate(record.stages):
            if stage.llm not in llm_names:
                raise InputError(source, f"workflows[{i}].stages[{s}].llm", f"llm {stage.llm!r} has no allocation in the plan", "fix the plan")
        workflows.append(PlannedWorkflow(record.name, tuple(stage.llm for stage in record.stages)))
    return tuple(workflows)


def load_placed_plan(plan_path: Path | str, instance_path: Path | None = None) -> PlacedPlan:
    """A plan JSON as the manifests realise it (read by the plan document's reader, its placement
    checked by the placement validator), with the instance it was made from."""
    plan_path = Path(plan_path)
    source = str(plan_path)
    raw, document = read_document(plan_path, "pass a plan JSON written by `scepsy plan --out`")
    instance = load_instance(resolve_instance_path(plan_path, document.instance, instance_path))
    allocation, placement = deployable_plan(source, document, instance)
    models = {record.name: record.model for record in document.llms or []}
    workflows = _workflows(source, document, {c.llm for c in allocation.llms})
    return placed_plan(source, raw, instance, allocation, placement, workflows, models)


def placed_plan(source: str, raw: dict, instance: Instance, allocation: Allocation, placement: Placement,
                workflows: tuple[PlannedWorkflow, ...] | None = None, models: dict[str, str | None] | None = None) -> PlacedPlan:
    """The manifest view of an allocation and its placement on `instance` (a plan the controller
    made in memory, or one read from a file); `workflows` default to the instance's, `models` to
    the instance's model names; `raw` is the plan document the plan ConfigMap stores."""
    llms = []
    for choice in allocation.llms:
        spec = instance.llm(choice.llm)
        model = (models or {}).get(choice.llm) or spec.model
        llms.append(PlannedLlm(spec.name, model, choice.gpu_type, choice.tp, choice.share,
                               choice.replicas, spec.memory_need_gib, spec.weights_gib))
    if workflows is None:
        workflows = tuple(PlannedWorkflow(w.name, tuple(stage.llm for stage in w.stages)) for w in instance.workflows)
    replicas = tuple(sorted(placement.replicas, key=lambda r: (r.llm, r.replica)))
    return PlacedPlan(source, raw, instance, instance.cluster.fractions_per_gpu, tuple(llms), workflows, replicas)
