"""Re-planning: the placement that runs now (`--current`), and which of its replicas may stay.

A current placement is a previous plan JSON (its `placement` list is used) or the list alone:
`[{llm, replica, node, shards: [{gpu, fraction}]}]`. Structural problems are input errors (exit 2),
and so (given the cluster) is a replica on a node or GPU the cluster does not have; replicas that no
longer fit the new plan (another shape, a GPU now reserved) are not errors: they simply cannot stay.

A current replica is a *keep candidate* when the new allocation gives its LLM the same shape
(gpu type of its node, tp = its number of shards, the same share per shard) and its GPUs still
exist, are distinct, lie in one NVLink domain of its node and each have room for the share. A new
placement *keeps* a candidate when it has a replica of that LLM on exactly those GPUs; kept
replicas keep their replica index where the new replica count allows, so that their Kubernetes
Deployments keep their names.

    movable_m     = min(#current replicas of m with its new shape, d_m)
    moved_shards  = sum_m t_m * (movable_m - kept_m)

Re-planning minimises `moved_shards` first (the rest of the objective follows, docs/placement.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from scepsy.models.allocation import Allocation, Placement, ReplicaPlacement, Shard
from scepsy.models.errors import InputError
from scepsy.models.inputs import load_json
from scepsy.models.instance import Cluster

_TOLERANCE = 1e-6


@dataclass(frozen=True)
class Candidate:
    """A current replica that may stay: LLM, its old index, node, NVLink domain and GPUs."""

    llm: str
    replica: int
    node: str
    domain: int  # index into cluster.domains()
    gpus: tuple[int, ...]

    @property
    def tp(self) -> int:
        return len(self.gpus)


def load_current(path: Path | str, fractions_per_gpu: int, cluster: Cluster | None = None) -> Placement:
    """Read a previous plan JSON (or its placement list) as a Placement in units of 1/F; with
    `cluster`, a replica on a node or GPU the cluster does not have is an input error (it would
    otherwise be dropped silently: a removed node must be removed from the file too)."""
    path = Path(path)
    source = str(path)
    raw = load_json(path, "pass a plan JSON written by `scepsy plan --out` or a placement list")
    records = raw.get("placement") if isinstance(raw, dict) else raw
    if not isinstance(records, list):
        raise InputError(source, "placement", "no placement list", "pass a plan JSON (with `placement`) or the list itself")
    placement = Placement(fractions_per_gpu, tuple(_replica(source, i, r, fractions_per_gpu) for i, r in enumerate(records)))
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


def _replica(source: str, index: int, record: object, f: int) -> ReplicaPlacement:
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
        fraction = shard.get("fraction") if isinstance(shard, dict) else None
        if not isinstance(gpu, int) or isinstance(gpu, bool) or gpu < 0:
            raise InputError(source, f"{where}.shards[{s}].gpu", f"GPU index {gpu!r} is not an integer >= 0", "fix the placement")
        if not isinstance(fraction, (int, float)) or isinstance(fraction, bool):
            raise InputError(source, f"{where}.shards[{s}].fraction", f"fraction {fraction!r} is not a number", "fix the placement")
        units = round(fraction * f) if 0 < fraction <= 1 + _TOLERANCE else 0
        if not 0 < fraction <= 1 + _TOLERANCE or abs(units - fraction * f) > _TOLERANCE:
            raise InputError(
                source, f"{where}.shards[{s}].fraction", f"fraction {fraction:g} is not a multiple of 1/{f} in (0, 1]", f"use k/{f}"
            )
        shards.append(Shard(gpu, units))
    return ReplicaPlacement(record["llm"], record["replica"], record["node"], tuple(shards))


def keep_candidates(cluster: Cluster, allocation: Allocation, current: Placement | None) -> list[Candidate]:
    """The current replicas that may stay under `allocation` (module docstring), in (llm, replica) order."""
    if current is None:
        return []
    shapes = {c.llm: c.shape for c in allocation.llms if c.replicas > 0}
    domain_of = {(d.node, g): j for j, d in enumerate(cluster.domains()) for g in d.gpus}
    nodes = {n.name: n for n in cluster.nodes}
    out = []
    for rp in sorted(current.replicas, key=lambda r: (r.llm, r.replica, r.node)):
        shape = shapes.get(rp.llm)
        node = nodes.get(rp.node)
        if shape is None or node is None:
            continue
        gpu_type, tp, share = shape
        gpus = tuple(sorted(s.gpu for s in rp.shards))
        if node.gpu_type != gpu_type or len(gpus) != tp or len(set(gpus)) != tp:
            continue
        if any(s.units != share for s in rp.shards) or any(g >= node.gpus for g in gpus):
            continue
        domains = {domain_of[(node.name, g)] for g in gpus}
        if len(domains) != 1 or any(cluster.free_units(node.name, g) < share for g in gpus):
            continue
        out.append(Candidate(rp.llm, rp.replica, node.name, domains.pop(), gpus))
    return out


def movable_replicas(cluster: Cluster, allocation: Allocation, current: Placement | None) -> dict[str, int]:
    """movable_m: current replicas of m with its new shape (wherever they are, also on nodes that
    are gone), at most d_m."""
    if current is None:
        return {}
    types = {n.name: n.gpu_type for n in cluster.nodes}
    out = {}
    for choice in allocation.llms:
        same = [
            r
            for r in current.replicas
            if r.llm == choice.llm
            and types.get(r.node, choice.gpu_type) == choice.gpu_type
            and len(r.shards) == choice.tp
            and all(s.units == choice.share for s in r.shards)
        ]
        out[choice.llm] = min(len(same), choice.replicas)
    return out
