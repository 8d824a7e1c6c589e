"""The plan document: the JSON `scepsy plan --out` writes (models/plan/plan.py, `Plan.to_json`),
read back by `--current` (re-planning), `--allocation` (predict, place, simulate) and `scepsy
manifests` (k8s/plan_input.py). This module is its one reader and its one validation:

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
from scepsy.models.plan.plan import PlacementInfo

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
# (models/plan/plan.py, prediction_to_json), so that a plan is an allocation too.
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
        raise InputError(source, "placement", "no placement list", "pass a plan JSON (with `placement`) or the list itself")
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


def allocation_records(allocation: Allocation) -> list[dict]:
    """The `llms` records of an allocation (what parse_allocation reads back)."""
    f = allocation.fractions_per_gpu
    return [
        {"name": c.llm, "gpu_type": c.gpu_type, "tp": c.tp, "fraction": round(c.share / f, 9), "replicas": c.replicas}
        for c in allocation.llms
    ]


def placement_document(instance: str, allocation: Allocation, placement: Placement, info: PlacementInfo,
                       fragmentation: Sequence[GpuTypeFragmentation]) -> dict:
    """What `scepsy place` writes: a plan document without a prediction (it reads back as one)."""
    return {
        "instance": instance,
        "fractions_per_gpu": allocation.fractions_per_gpu,
        "llms": allocation_records(allocation),
        "placement_solver": info.to_json(),
        "placement": placement.to_json(),
        "fragmentation": [entry.to_json() for entry in fragmentation],
    }
