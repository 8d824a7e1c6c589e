"""The plan document: the JSON `scepsy plan --out` and `scepsy place --out` write, and the one typed
reader of every command that takes a plan or an allocation.

`PlanDocument` is its schema (pydantic, unknown fields refused: the document is ours), in the order
the keys are written:

    status ... solver       how the allocation was solved (`scepsy plan` only)
    placement_solver        how the placement was found
    load_factor, mean_latency_s, gpus, cost_per_hour   the objective's own numbers, where it has them
    instance                the instance file the plan was made from
    fractions_per_gpu       F: fractions are multiples of 1/F in (0, 1]
    gpus_in_use             physical GPUs hosting a shard
    workflows[]             {name, stages[]: {llm, ...}, ...}: the prediction per workflow
    llms[]                  {name, gpu_type, tp, fraction, replicas, ...}: the allocation (with the
                            prediction of each LLM in a planned document)
    placement[]             {llm, replica, node, shards[]: {gpu, fraction}}: where each shard runs
    fragmentation[]         what the placement leaves free, per gpu type

An allocation YAML is the same document with `llms:` alone, so a plan is an allocation too. The
readers, one per use, all start from `read_document`:

    read_allocation   `--allocation` of predict and place, `simulate --plan`, the static baseline
    read_current      `--current` (re-planning): the placement that runs now, or its list alone
    deployable_plan   `scepsy manifests` (k8s/plan_input.py adds the instance file and workflows)

Every problem is an InputError (exit code 2) naming the file, the field (`llms[0].tp`,
`placement[3].shards[1].gpu`) and the fix; placements are checked by the one placement validator
(models/instance/placement_check.py).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Annotated, Any, Sequence, get_args

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from scepsy.models.errors import InputError, ScepsyWarning
from scepsy.models.inputs import parse_json_text, parse_yaml_text, read_text
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import Instance
from scepsy.models.instance.placement_check import placement_problems
from scepsy.models.output import json_number, significant
from scepsy.models.performance.alp import Prediction
from scepsy.models.plan.fragmentation import GpuTypeFragmentation
from scepsy.models.plan.plan import PlacementInfo, PlacementObjective, Plan

TOLERANCE = 1e-6
MAX_REPLICAS = 1_000_000
Count = Annotated[int, Field(ge=1, le=MAX_REPLICAS)]
Index = Annotated[int, Field(ge=0)]


# ---------------------------------------------------------------------------------------------
# The schema


class _Record(BaseModel):
    """A part of the document: unknown fields refused, types strict (1.5 replicas or `true` as a
    TP degree are errors, not truncated), no NaN or Infinity."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


class SolverRecord(_Record):
    backend: str
    wall_time_s: float | None
    iterations: int
    cuts: int
    notes: list[str] | None = None


class PlacementObjectiveRecord(_Record):
    free_domains: int
    free_gpus: int
    shared_gpus: int
    moved_shards: int | None = None
    kept_replicas: int | None = None
    occupied_units: int | None = None


class PlacementSolverRecord(_Record):
    method: str
    status: str
    wall_time_s: float | None
    objective: PlacementObjectiveRecord
    bound: dict[str, int] | None = None
    gap: float | None = None
    gap_stage: str | None = None
    notes: list[str] | None = None


class StageRecord(_Record):
    llm: str
    invocations: float | None
    parallelism: float | None
    latency_contribution_s: float | None


class WorkflowRecord(_Record):
    name: str
    arrival_rate: float | None
    latency_s: float | None
    max_throughput_rps: float | None
    recovery_limit_rps: float | None = None  # with the workflow entry (scepsy manifests' default)
    recovery_limit_fcfs_rps: float | None = None  # without it: engines first come first served (0: none claimed)
    bottleneck: str
    latency_slo_s: float | None
    meets_slo: bool | None
    stages: list[StageRecord]


class LlmRecord(_Record):
    """One LLM's allocation (name, gpu_type, tp, fraction, replicas; `llm` is read as `name`),
    and in a planned document its prediction."""

    name: str = Field(validation_alias=AliasChoices("name", "llm"))
    model: str | None = None
    gpu_type: str
    tp: Count
    fraction: float
    replicas: Count
    gpus: float | None = None
    per_replica_rate: float | None = None
    offered_rate_rps: float | None = None
    latency_s: float | None = None
    capacity_rps: float | None = None
    utilization: float | None = None
    headroom: float | None = None  # the share of the capacity the load leaves free (1 - utilization)
    overloaded: bool | None = None
    entry_limit: int | None = None  # calls in flight the workflow entry lets through (`scepsy proxy --max-in-flight`)
    # only for an unprofiled fraction: its curve is derived from these measured ones
    profile_derived_from_fractions: list[float] | None = None


class ShardRecord(_Record):
    gpu: Index
    fraction: float


class ReplicaRecord(_Record):
    llm: str
    replica: Index
    node: str
    shards: list[ShardRecord] = Field(min_length=1)


PlacementList = TypeAdapter(list[ReplicaRecord])  # a `--current` file may be the placement list alone


class PlanDocument(_Record):
    """A plan (`scepsy plan`), a placed allocation (`scepsy place`), a prediction (`scepsy
    predict --json`), an allocation file (`llms` alone) or a current placement (`placement` alone):
    every field is optional here, and each reader requires what its use needs."""

    status: str | None = None
    objective: str | None = None
    objective_value: float | None = None
    bound: float | None = None
    gap: float | None = None
    solver: SolverRecord | None = None
    placement_solver: PlacementSolverRecord | None = None
    load_factor: float | None = None
    mean_latency_s: float | None = None
    gpus: float | None = None
    cost_per_hour: float | None = None
    instance: str | None = None
    fractions_per_gpu: Count | None = None
    gpus_in_use: int | None = None
    workflows: list[WorkflowRecord] | None = None
    llms: list[LlmRecord] | None = None
    placement: list[ReplicaRecord] | None = None
    fragmentation: list[GpuTypeFragmentation] | None = None  # models/plan/fragmentation.py

    def to_json(self) -> dict:
        """The document as written: the fields that were given, in the schema's order, except that
        a placed allocation (no `status`: `scepsy place`) lists its placement solver after its
        `llms`, as it always has (the key order is part of the format: byte-stable outputs)."""
        out = self.model_dump(mode="json", exclude_unset=True)
        if self.status is None and "placement_solver" in out:
            solver = out.pop("placement_solver")
            keys = list(out)
            at = keys.index("llms") + 1
            out = {**{k: out[k] for k in keys[:at]}, "placement_solver": solver, **{k: out[k] for k in keys[at:]}}
        return out


# ---------------------------------------------------------------------------------------------
# Reading


PLAN_FIX = "pass a plan JSON written by `scepsy plan --out`, or an allocation YAML (llms: [{name, gpu_type, tp, fraction, replicas}])"


def _parse(path: Path | str, fix: str) -> object:
    """The file's JSON (a plan) or YAML (an allocation), read with the size bound. JSON is tried
    first where the text looks like it: PyYAML reads JSON's `1e-05` as a string."""
    source = str(path)
    text = read_text(path, fix)
    if Path(path).suffix.lower() == ".json" or text.lstrip()[:1] in ("{", "["):
        try:
            return parse_json_text(text, source, fix)
        except InputError:
            if Path(path).suffix.lower() == ".json":
                raise
    return parse_yaml_text(text, source)


def _model_at(model: Any, loc: Sequence[str | int]) -> Any:
    """The record class a validation error's location points into (for the fields it allows)."""
    for key in loc:
        if isinstance(key, int):
            continue
        fields = getattr(model, "model_fields", {})
        if key not in fields:
            return model
        model = _record_class(fields[key].annotation)
    return model


def _record_class(annotation: Any) -> Any:
    """The record class inside `list[X] | None`, `X | None`, ... (None for a plain value)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return next((found for arg in get_args(annotation) if (found := _record_class(arg)) is not None), None)


def _field_path(prefix: str, loc: Sequence[str | int]) -> str:
    path = prefix
    for key in loc:
        path += f"[{key}]" if isinstance(key, int) else (f".{key}" if path else str(key))
    return path


def _validation_error(source: str, exc: ValidationError, model: Any, prefix: str = "") -> InputError:
    """The first problem of a validation error as an InputError naming the field and the fix."""
    first = exc.errors()[0]
    loc = tuple(first["loc"])
    kind, given = first["type"], first.get("input")
    more = len(exc.errors()) - 1
    also = f" (and {more} more problem{'s' if more > 1 else ''})" if more else ""
    field = _field_path(prefix, loc) or None
    if kind == "extra_forbidden":
        record = _model_at(model, loc[:-1])
        names = ", ".join(getattr(record, "model_fields", {}))
        return InputError(source, field, f"unknown field{also}", f"remove it or correct its spelling ({names})")
    if kind == "missing":
        return InputError(source, field, f"missing field{also}", "add it")
    shown = repr(given)
    value = "" if isinstance(given, (dict, list)) else f" (got {shown if len(shown) <= 60 else shown[:57] + '...'})"
    problem = first["msg"][:1].lower() + first["msg"][1:] + value + also
    fix = {"int_type": "write a whole number such as 1 or 2", "float_type": "write a number",
           "finite_number": "write a finite number", "string_type": "write a string", "bool_type": "write true or false",
           "list_type": "write a list", "too_short": "add at least one entry", "model_type": "write a mapping",
           }.get(kind, "correct the value")
    return InputError(source, field, problem, fix)


def read_document(path: Path | str, fix: str = PLAN_FIX) -> tuple[dict, PlanDocument]:
    """A plan or allocation file: (the parsed mapping as it is in the file, the typed document)."""
    source = str(path)
    raw = _parse(path, fix)
    if not isinstance(raw, dict):
        raise InputError(source, None, "not a plan or allocation document (a mapping)", fix)
    try:
        return raw, PlanDocument.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(source, exc, PlanDocument) from None


def fraction_units(source: str, where: str, fraction: float, f: int) -> int:
    """A fraction of a GPU as units of 1/F: a multiple of 1/F in (0, 1]."""
    units = round(fraction * f) if 0 < fraction <= 1 + TOLERANCE else 0
    if not 0 < fraction <= 1 + TOLERANCE or abs(units - fraction * f) > TOLERANCE:
        raise InputError(source, where, f"fraction {fraction:g} is not a multiple of 1/{f} in (0, 1]", f"use k/{f} for an integer k")
    return units


def document_allocation(source: str, document: PlanDocument, instance: Instance) -> Allocation:
    """The allocation of the document's `llms`, on `instance`: every LLM of the instance once, on a
    gpu type of its cluster, with a fraction that is a multiple of 1/F."""
    cluster = instance.cluster
    names = [m.name for m in instance.llms]
    if document.llms is None:
        raise InputError(source, "llms", "missing the `llms:` list", "write llms: [{name, gpu_type, tp, fraction, replicas}, ...]")
    choices = []
    for i, record in enumerate(document.llms):
        where = f"llms[{i}]"
        if record.name not in names:
            raise InputError(source, f"{where}.name", f"unknown llm {record.name!r}", f"use one of: {', '.join(sorted(names))}")
        if record.gpu_type not in cluster.gpu_types:
            raise InputError(source, f"{where}.gpu_type", f"unknown gpu type {record.gpu_type!r} for llm {record.name}",
                             f"use one of: {', '.join(sorted(cluster.gpu_types))}")
        share = fraction_units(source, f"{where}.fraction", record.fraction, cluster.fractions_per_gpu)
        choices.append(LlmAllocation(record.name, record.gpu_type, record.tp, share, record.replicas))
    listed = [c.llm for c in choices]
    for name in names:
        if name not in listed:
            raise InputError(source, "llms", f"llm {name} has no allocation", "add an entry for it")
    if len(set(listed)) != len(listed):
        twice = next(name for name in listed if listed.count(name) > 1)
        raise InputError(source, "llms", f"llm {twice} is listed twice", "list each llm once")
    return Allocation(cluster.fractions_per_gpu, tuple(choices))


def document_placement(source: str, records: Sequence[ReplicaRecord], f: int) -> Placement:
    """The placement of `placement` records, fractions as units of 1/F (checked further by the
    placement validator)."""
    replicas = []
    for i, record in enumerate(records):
        shards = tuple(Shard(s.gpu, fraction_units(source, f"placement[{i}].shards[{k}].fraction", s.fraction, f))
                       for k, s in enumerate(record.shards))
        replicas.append(ReplicaPlacement(record.llm, record.replica, record.node, shards))
    return Placement(f, tuple(replicas))


def read_allocation(path: Path | str, instance: Instance) -> Allocation:
    """An allocation file for `instance` (an allocation YAML, or any plan document)."""
    _, document = read_document(path)
    return document_allocation(str(path), document, instance)


CURRENT_FIX = "pass a plan JSON written by `scepsy plan --out`, or its placement list"


def read_current(path: Path | str, instance: Instance) -> Placement:
    """The placement that runs now (`--current`): a plan document's `placement`, or the list alone.

    What cannot run is an input error naming the entry: a node or GPU the cluster does not have (a
    removed node must be removed from the file too), two shards of one replica on one GPU, shards of
    different sizes, a replica listed twice, a GPU holding more than a whole GPU of shards, and,
    where the file has `llms`, a replica whose gpu type, shard count (its TP) or shard fraction
    differ from its LLM's record. Replicas of LLMs the instance no longer has are ignored with one
    warning (ScepsyWarning): the operator removed the LLM, its replicas stop with the new plan, so
    they neither stay nor hold GPUs. Replicas that merely cannot stay under the new plan (another
    shape, a GPU now reserved) are no problem: they move (placement/current.py)."""
    source = str(path)
    raw = _parse(path, CURRENT_FIX)
    f = instance.cluster.fractions_per_gpu
    own: list[LlmRecord] = []
    try:
        if isinstance(raw, list):
            records = PlacementList.validate_python(raw)
        elif isinstance(raw, dict):
            document = PlanDocument.model_validate(raw)
            if document.placement is None:
                raise InputError(source, "placement", "no placement list", "pass a plan JSON (with a placement list) or the list itself")
            records, own = document.placement, document.llms or []
        else:
            raise InputError(source, None, "not a plan document or a placement list", CURRENT_FIX)
    except ValidationError as exc:
        prefix = "placement" if isinstance(raw, list) else ""
        raise _validation_error(source, exc, ReplicaRecord if isinstance(raw, list) else PlanDocument, prefix) from None
    known = {m.name for m in instance.llms}
    gone = sorted({r.llm for r in records} - known)
    if gone:
        warnings.warn(ScepsyWarning(
            source, "placement", f"ignored the current replicas of {', '.join(gone)}: not in the instance (removed from "
            "it), so they stop with the new plan and their GPUs count as free",
            "nothing, if the llm was removed; else re-plan with the instance the placement runs"), stacklevel=2)
    placement = document_placement(source, records, f)
    entries = [i for i, r in enumerate(placement.replicas) if r.llm in known]
    kept = Placement(f, tuple(placement.replicas[i] for i in entries))
    shapes = _own_shapes(source, own, known, instance)
    for problem in placement_problems(instance.cluster, kept, shapes, complete=False):
        entry = entries[problem.entry] if problem.entry is not None else None
        where = f"placement[{entry}]" + (f".{problem.field}" if problem.field else "") if entry is not None else "placement"
        raise InputError(source, where, problem.text, "fix the entry to what runs now, or remove it")
    return kept


def _own_shapes(source: str, records: Sequence[LlmRecord], known: set[str], instance: Instance) -> Allocation:
    """The shapes a current plan gives its own LLMs (those the instance still has), to check its
    placement against."""
    f = instance.cluster.fractions_per_gpu
    shapes = []
    for i, record in enumerate(records):
        if record.name in known:
            share = fraction_units(source, f"llms[{i}].fraction", record.fraction, f)
            shapes.append(LlmAllocation(record.name, record.gpu_type, record.tp, share, record.replicas))
    return Allocation(f, tuple(shapes))


def deployable_plan(source: str, document: PlanDocument, instance: Instance) -> tuple[Allocation, Placement]:
    """A plan's allocation and placement, for deploying it on `instance`: made for its F, with a
    placement that is valid for the allocation on its cluster (the placement validator, complete)."""
    f = instance.cluster.fractions_per_gpu
    if document.fractions_per_gpu != f:
        raise InputError(source, "fractions_per_gpu", f"{document.fractions_per_gpu!r} differs from the instance's {f}",
                         "use the instance the plan was made from (`instance`)")
    allocation = document_allocation(source, document, instance)
    if not document.placement:
        raise InputError(source, "placement", "missing or empty list",
                         "make the plan with `scepsy plan INSTANCE --out PLAN.json` (plans always carry a placement)")
    placement = document_placement(source, document.placement, f)
    for problem in placement_problems(instance.cluster, placement, allocation):
        raise InputError(source, problem.where(), problem.text, "fix the plan, or plan again with `scepsy plan`")
    return allocation, placement


# ---------------------------------------------------------------------------------------------
# Writing


def allocation_records(allocation: Allocation) -> list[LlmRecord]:
    """The `llms` records of an allocation (what document_allocation reads back)."""
    f = allocation.fractions_per_gpu
    return [LlmRecord(name=c.llm, gpu_type=c.gpu_type, tp=c.tp, fraction=round(c.share / f, 9), replicas=c.replicas)
            for c in allocation.llms]


def placement_records(placement: Placement) -> list[ReplicaRecord]:
    """The `placement` records (what document_placement reads back)."""
    f = placement.fractions_per_gpu
    return [
        ReplicaRecord(llm=r.llm, replica=r.replica, node=r.node,
                      shards=[ShardRecord(gpu=s.gpu, fraction=round(s.units / f, 9)) for s in r.shards])
        for r in placement.replicas
    ]


def _prediction_records(prediction: Prediction) -> tuple[list[WorkflowRecord], list[LlmRecord]]:
    workflows = [
        WorkflowRecord(
            name=w.name, arrival_rate=json_number(w.arrival_rate_rps), latency_s=json_number(w.latency_s),
            max_throughput_rps=json_number(w.max_throughput_rps), recovery_limit_rps=json_number(w.recovery_limit_rps),
            recovery_limit_fcfs_rps=json_number(w.recovery_limit_fcfs_rps), bottleneck=w.bottleneck,
            latency_slo_s=json_number(w.latency_slo_s), meets_slo=w.meets_slo,
            stages=[StageRecord(llm=s.llm, invocations=json_number(s.invocations), parallelism=json_number(s.parallelism),
                                latency_contribution_s=json_number(s.latency_contribution_s)) for s in w.stages],
        )
        for w in prediction.workflows
    ]
    llms = []
    for p in prediction.llms:
        derived = {"profile_derived_from_fractions": [significant(f, 9) for f in p.profile_derived_from]} if p.profile_derived_from else {}
        llms.append(LlmRecord(
            name=p.llm, model=p.model, gpu_type=p.gpu_type, tp=p.tp, fraction=significant(p.fraction, 9), replicas=p.replicas,
            gpus=json_number(p.gpus), per_replica_rate=json_number(p.per_replica_rate_rps),
            offered_rate_rps=json_number(p.offered_rate_rps), latency_s=json_number(p.latency_s),
            capacity_rps=json_number(p.capacity_rps), utilization=json_number(p.utilization),
            headroom=json_number(p.headroom), overloaded=p.overloaded, entry_limit=p.entry_limit,
            **derived,
        ))
    return workflows, llms


def prediction_sections(prediction: Prediction) -> dict:
    """The `workflows` and `llms` sections of a planned document (also what `scepsy predict` prints);
    an `llms` record holds the allocation's fields, so that a prediction reads back as an allocation."""
    workflows, llms = _prediction_records(prediction)
    return PlanDocument(workflows=workflows, llms=llms).to_json()


def _placement_solver(info: PlacementInfo, include_wall_time: bool) -> PlacementSolverRecord:
    objective: PlacementObjective = info.objective
    moved = {"moved_shards": objective.moved_shards, "kept_replicas": objective.kept_replicas,
             "occupied_units": objective.occupied_units} if objective.moved_shards is not None else {}
    extra: dict[str, Any] = {}
    if info.bounds:
        extra["bound"] = dict(info.bounds)
    if info.gap is not None:
        extra.update(gap=json_number(info.gap), gap_stage=info.gap_stage)
    if info.notes:
        extra["notes"] = list(info.notes)
    return PlacementSolverRecord(
        method=info.method, status=info.status, wall_time_s=json_number(info.wall_time_s) if include_wall_time else None,
        objective=PlacementObjectiveRecord(free_domains=objective.free_domains, free_gpus=objective.free_gpus,
                                           shared_gpus=objective.shared_gpus, **moved),
        **extra,
    )


def _solve_fields(plan: Plan, include_wall_time: bool) -> dict[str, Any]:
    """How the allocation was solved: status, objective and its bound, the solver."""
    notes = {"notes": list(plan.solver.notes)} if plan.solver.notes else {}
    solver = SolverRecord(backend=plan.solver.backend, wall_time_s=json_number(plan.solver.wall_time_s) if include_wall_time else None,
                          iterations=plan.solver.iterations, cuts=plan.solver.cuts, **notes)
    return dict(status=plan.status, objective=plan.objective, objective_value=json_number(plan.objective_value),
                bound=json_number(plan.bound), gap=json_number(plan.gap), solver=solver)


def plan_document(
    instance: str | None,
    allocation: Allocation,
    placement: Placement | None = None,
    placement_info: PlacementInfo | None = None,
    fragmentation: Sequence[GpuTypeFragmentation] | None = None,
    solved: Plan | None = None,
    include_wall_time: bool = True,
) -> dict:
    """The plan document (module docstring): the one writer, of `scepsy plan` and of `scepsy place`.

    `solved` is the plan when the allocation was planned here (`scepsy plan`): the document then
    begins with how it was solved (status, objective, bound, solver, placement solver, the
    objective's extra numbers) and carries the prediction, whose `llms` records hold the
    allocation's fields. Without it (`scepsy place`) the `llms` are the allocation's records and
    the placement solver follows them. `fragmentation` None leaves its section out."""
    fields: dict[str, Any] = {}
    if solved is not None:
        fields.update(_solve_fields(solved, include_wall_time))
        fields.update({key: json_number(value) for key, value in solved.extras})
        fields["gpus_in_use"] = solved.gpus_in_use
        fields["workflows"], fields["llms"] = _prediction_records(solved.prediction)
    else:
        fields["llms"] = allocation_records(allocation)
    if placement_info is not None:
        fields["placement_solver"] = _placement_solver(placement_info, include_wall_time)
    if placement is not None:
        fields["placement"] = placement_records(placement)
    if fragmentation is not None:
        fields["fragmentation"] = list(fragmentation)
    return PlanDocument(instance=instance, fractions_per_gpu=allocation.fractions_per_gpu, **fields).to_json()


def plan_json(plan: Plan, include_wall_time: bool = True) -> dict:
    """The document of a plan (`scepsy plan --json`); without wall times it is byte-stable."""
    return plan_document(plan.instance, plan.allocation, plan.placement, plan.placement_info, plan.fragmentation or None,
                         solved=plan, include_wall_time=include_wall_time)
