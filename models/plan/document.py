"""The plan document: the JSON `scepsy plan --out` and `scepsy place --out` write, read back by
`--current` (re-planning), `--allocation` (predict, place, simulate) and `scepsy manifests`
(k8s/plan_input.py). This module is its one writer (plan_document), its one reader and its one
validation:

    instance            the instance file the plan was made from
    fractions_per_gpu   F: fractions are multiples of 1/F in (0, 1]
    llms[]              {name, gpu_type, tp, fraction, replicas, ...}: the allocation
    placement[]         {llm, replica, node, shards[]: {gpu, fraction}}: where each shard runs
    workflows[]         {name, stages[]: {llm, ...}, ...}: the prediction per workflow

An allocation may also be a YAML file with the same `llms:` list. Every problem is an InputError
(exit code 2) naming the file, the field and the fix.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from scepsy.models.inputs import load_json
from scepsy.models.instance.instance import Cluster, Instance, parse_yaml
from scepsy.models.plan.fragmentation import GpuTypeFragmentation
from scepsy.models.performance.alp import Prediction
from scepsy.models.plan.plan import PlacementInfo, PlacementObjective, Plan

TOLERANCE = 1e-6


def read_json(path: Path | str, fix: str) -> object:
    """The parsed JSON of a plan file (bounded, strict: models/inputs.py); `fix` says what to pass
    instead when it cannot be read."""
    return load_json(path, fix)


def parse_units(source: str, where: str, fraction: object, f: int) -> int:
    """A fraction of a GPU as units of 1/F: a number, a multiple of 1/F, in (0, 1]."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool):
        raise InputError(source, where, f"fraction {fraction!r} is not a number", "write a number in (0, 1]")
    units = round(fraction * f) if 0 < fraction <= 1 + TOLERANCE else 0  # round(inf) would raise
    if not 0 < fraction <= 1 + TOLERANCE or abs(units - fraction * f) > TOLERANCE:
        raise InputError(source, where, f"fraction {fraction:g} is not a multiple of 1/{f} in (0, 1]", f"use k/{f} for an integer k")
    return units


# What an allocation record may hold: its own fields, plus those of a plan JSON's `llms` entries
# (prediction_sections), so that a plan is an allocation too.
ALLOCATION_FIELDS = ("name", "gpu_type", "tp", "fraction", "replicas")
RECORD_FIELDS = frozenset(ALLOCATION_FIELDS + ("llm", "model", "gpus", "per_replica_rate", "offered_rate_rps", "latency_s",
                                               "capacity_rps", "utilization", "overloaded"))
MAX_REPLICAS = 1_000_000


def parse_allocation(records: list, fractions_per_gpu: int, source: str, known: dict[str, set[str]]) -> Allocation:
    """An allocation from `llms:` records ({name|llm, gpu_type, tp, fraction, replicas}); `known`
    maps each LLM name of the instance to its usable gpu types. Strict: whole numbers stay whole
    (replicas: 1.5 is refused, not truncated), unknown fields are refused."""
    choices = []
    for i, record in enumerate(records):
        where = f"llms[{i}]"
        if not isinstance(record, dict):
            raise InputError(source, where, "expected a mapping", "write {name, gpu_type, tp, fraction, replicas}")
        name = record.get("name", record.get("llm"))
        if not isinstance(name, str) or name not in known:
            raise InputError(source, f"{where}.name", f"unknown llm {name!r}", f"use one of: {', '.join(sorted(known))}")
        unknown = sorted(str(k) for k in record if k not in RECORD_FIELDS)
        if unknown:
            raise InputError(source, f"{where} ({name}).{unknown[0]}", "unknown field",
                             "remove it or correct its spelling: name, gpu_type, tp, fraction, replicas")
        missing = [k for k in ("gpu_type", "tp", "fraction", "replicas") if k not in record]
        if missing:
            raise InputError(source, f"{where} ({name}).{missing[0]}", "missing field", "add it")
        if not isinstance(record["gpu_type"], str) or record["gpu_type"] not in known[name]:
            raise InputError(
                source, f"{where} ({name}).gpu_type", f"unknown gpu type {record['gpu_type']!r}", f"use one of: {', '.join(sorted(known[name]))}"
            )
        tp, replicas = record["tp"], record["replicas"]
        for key, value in (("tp", tp), ("replicas", replicas)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_REPLICAS:
                raise InputError(source, f"{where} ({name}).{key}", f"{value!r} is not a whole number in 1..{MAX_REPLICAS}",
                                 "write a whole number such as 1 or 2")
        fraction = record["fraction"]
        if isinstance(fraction, float) and not math.isfinite(fraction):
            raise InputError(source, f"{where} ({name}).fraction", f"{fraction!r} is not a number", "write e.g. 0.5")
        share = parse_units(source, f"{where} ({name}).fraction", fraction, fractions_per_gpu)
        choices.append(LlmAllocation(name, record["gpu_type"], tp, share, replicas))
    names = [c.llm for c in choices]
    for name in known:
        if name not in names:
            raise InputError(source, "llms", f"llm {name} has no allocation", "add an entry for it")
    if len(set(names)) != len(names):
        raise InputError(source, "llms", "an llm is listed twice", "list each llm once")
    return Allocation(fractions_per_gpu, tuple(choices))


def load_allocation(path: Path | str, fractions_per_gpu: int, known: dict[str, set[str]]) -> Allocation:
    """Read an allocation YAML (or a plan JSON): a top-level `llms:` list of records."""
    raw = parse_yaml(Path(path))
    if not isinstance(raw, dict) or not isinstance(raw.get("llms"), list):
        raise InputError(str(path), "llms", "missing the `llms:` list", "write llms: [{name, gpu_type, tp, fraction, replicas}, ...]")
    return parse_allocation(raw["llms"], fractions_per_gpu, str(path), known)


def instance_allocation(path: Path | str, instance: Instance) -> Allocation:
    """An allocation file for `instance`: every LLM of the instance, on its cluster's gpu types."""
    known = {m.name: set(instance.cluster.gpu_types) for m in instance.llms}
    return load_allocation(path, instance.cluster.fractions_per_gpu, known)


def parse_replica(source: str, index: int, record: object, f: int) -> ReplicaPlacement:
    """One `placement[]` record, checked for its structure (the instance checks it further)."""
    where = f"placement[{index}]"
    if not isinstance(record, dict):
        raise InputError(source, where, "expected an object", "write {llm, replica, node, shards}")
    for key, kind in (("llm", str), ("node", str), ("replica", int), ("shards", list)):
        value = record.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise InputError(source, f"{where}.{key}", f"missing or not a {kind.__name__}", "fix the placement")
    if record["replica"] < 0 or not record["shards"]:
        raise InputError(source, where, "negative replica index or no shards", "fix the placement")
    shards = []
    for s, shard in enumerate(record["shards"]):
        gpu = shard.get("gpu") if isinstance(shard, dict) else None
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            raise InputError(source, f"{where}.shards[{s}].gpu", f"GPU index {gpu!r} is not an integer >= 0", "fix the placement")
        fraction = shard.get("fraction") if isinstance(shard, dict) else None
        shards.append(Shard(gpu, parse_units(source, f"{where}.shards[{s}].fraction", fraction, f)))
    return ReplicaPlacement(record["llm"], record["replica"], record["node"], tuple(shards))


def parse_placement(records: list, f: int, source: str) -> Placement:
    return Placement(f, tuple(parse_replica(source, i, r, f) for i, r in enumerate(records)))


def load_placement(path: Path | str, fractions_per_gpu: int, cluster: Cluster | None = None) -> Placement:
    """A previous plan JSON (or its placement list alone) as a Placement in units of 1/F; with
    `cluster`, a replica on a node or GPU the cluster does not have is an input error (it would
    otherwise be dropped silently: a removed node must be removed from the file too)."""
    source = str(path)
    raw = read_json(path, "pass a plan JSON written by `scepsy plan --out`, or its placement list")
    records = raw.get("placement") if isinstance(raw, dict) else raw
    if not isinstance(records, list):
        raise InputError(source, "placement", "no placement list", "pass a plan JSON (with a placement list) or the list itself")
    placement = parse_placement(records, fractions_per_gpu, source)
    if cluster is not None:
        _check_on_cluster(source, placement, cluster)
    return placement


def _check_on_cluster(source: str, placement: Placement, cluster: Cluster) -> None:
    gpus = {n.name: n.gpus for n in cluster.nodes}
    for i, replica in enumerate(placement.replicas):
        where = f"placement[{i}]"
        if replica.node not in gpus:
            raise InputError(source, f"{where}.node", f"node {replica.node!r} is not in the instance's cluster",
                             "remove the replicas of nodes that are gone from the file, or add the node to the cluster")
        for s, shard in enumerate(replica.shards):
            if shard.gpu >= gpus[replica.node]:
                raise InputError(source, f"{where}.shards[{s}].gpu", f"node {replica.node} has GPUs 0..{gpus[replica.node] - 1}",
                                 "fix the GPU index or the cluster")


def _num(value: float | None) -> float | None:
    """JSON-safe number with 9 significant digits (stable across runs; no NaN/Infinity)."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.9g}")


def allocation_records(allocation: Allocation) -> list[dict]:
    """The `llms` records of an allocation (what parse_allocation reads back)."""
    f = allocation.fractions_per_gpu
    return [
        {"name": c.llm, "gpu_type": c.gpu_type, "tp": c.tp, "fraction": round(c.share / f, 9), "replicas": c.replicas}
        for c in allocation.llms
    ]


def placement_records(placement: Placement) -> list[dict]:
    """The `placement` records (what parse_placement reads back)."""
    f = placement.fractions_per_gpu
    return [
        {
            "llm": r.llm,
            "replica": r.replica,
            "node": r.node,
            "shards": [{"gpu": s.gpu, "fraction": round(s.units / f, 9)} for s in r.shards],
        }
        for r in placement.replicas
    ]


def prediction_sections(prediction: Prediction) -> dict:
    """The `workflows` and `llms` sections of a planned document (also what `scepsy predict` prints);
    an `llms` record holds the allocation's fields, so that a plan reads back as an allocation."""
    workflows = [
        {
            "name": w.name,
            "arrival_rate": _num(w.arrival_rate_rps),
            "latency_s": _num(w.latency_s),
            "max_throughput_rps": _num(w.max_throughput_rps),
            "bottleneck": w.bottleneck,
            "latency_slo_s": _num(w.latency_slo_s),
            "meets_slo": w.meets_slo,
            "stages": [
                {
                    "llm": s.llm,
                    "invocations": _num(s.invocations),
                    "parallelism": _num(s.parallelism),
                    "latency_contribution_s": _num(s.latency_contribution_s),
                }
                for s in w.stages
            ],
        }
        for w in prediction.workflows
    ]
    llms = [
        {
            "name": p.llm,
            "model": p.model,
            "gpu_type": p.gpu_type,
            "tp": p.tp,
            "fraction": _num(p.fraction),
            "replicas": p.replicas,
            "gpus": _num(p.gpus),
            "per_replica_rate": _num(p.per_replica_rate_rps),
            "offered_rate_rps": _num(p.offered_rate_rps),
            "latency_s": _num(p.latency_s),
            "capacity_rps": _num(p.capacity_rps),
            "utilization": _num(p.utilization),
            "overloaded": p.overloaded,
            # only for an unprofiled fraction: its curve is derived, not measured
            **({"profile_derived_from_fractions": [_num(f) for f in p.profile_derived_from]} if p.profile_derived_from else {}),
        }
        for p in prediction.llms
    ]
    return {"workflows": workflows, "llms": llms}


def _objective_section(objective: PlacementObjective) -> dict:
    out: dict[str, int | None] = {"free_domains": objective.free_domains, "free_gpus": objective.free_gpus,
                                  "shared_gpus": objective.shared_gpus}
    if objective.moved_shards is not None:
        out.update(moved_shards=objective.moved_shards, kept_replicas=objective.kept_replicas)
    return out


def _placement_solver_section(info: PlacementInfo, include_wall_time: bool) -> dict:
    out: dict[str, object] = {
        "method": info.method,
        "status": info.status,
        "wall_time_s": _num(info.wall_time_s) if include_wall_time else None,
        "objective": _objective_section(info.objective),
    }
    if info.bounds:
        out["bound"] = dict(info.bounds)
    if info.gap is not None:
        out.update(gap=_num(info.gap), gap_stage=info.gap_stage)
    if info.notes:
        out["notes"] = list(info.notes)
    return out


def _solve_section(plan: Plan, include_wall_time: bool) -> dict:
    """How the allocation was solved: status, objective and its bound, the solver."""
    solver: dict[str, object] = {"backend": plan.solver.backend,
                                 "wall_time_s": _num(plan.solver.wall_time_s) if include_wall_time else None}
    solver.update({"iterations": plan.solver.iterations, "cuts": plan.solver.cuts})
    if plan.solver.notes:
        solver["notes"] = list(plan.solver.notes)
    return {
        "status": plan.status,
        "objective": plan.objective,
        "objective_value": _num(plan.objective_value),
        "bound": _num(plan.bound),
        "gap": _num(plan.gap),
        "solver": solver,
    }


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
    the placement solver follows them. The key order is part of the format (byte-stable outputs);
    `fragmentation` None leaves its section out."""
    document: dict = {}
    if solved is not None:
        document.update(_solve_section(solved, include_wall_time))
        if placement_info is not None:
            document["placement_solver"] = _placement_solver_section(placement_info, include_wall_time)
        document.update({key: _num(value) for key, value in solved.extras})
    document["instance"] = instance
    document["fractions_per_gpu"] = allocation.fractions_per_gpu
    if solved is not None:
        document["gpus_in_use"] = solved.gpus_in_use
        document.update(prediction_sections(solved.prediction))
    else:
        document["llms"] = allocation_records(allocation)
        if placement_info is not None:
            document["placement_solver"] = _placement_solver_section(placement_info, include_wall_time)
    if placement is not None:
        document["placement"] = placement_records(placement)
    if fragmentation is not None:
        document["fragmentation"] = [entry.to_json() for entry in fragmentation]
    return document


def plan_json(plan: Plan, include_wall_time: bool = True) -> dict:
    """The document of a plan (`scepsy plan --json`); without wall times it is byte-stable."""
    return plan_document(plan.instance, plan.allocation, plan.placement, plan.placement_info, plan.fragmentation or None,
                         solved=plan, include_wall_time=include_wall_time)
