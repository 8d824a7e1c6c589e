"""Re-planning: the placement that runs now (`--current`), and which of its replicas may stay.

A current placement is a previous plan JSON (its `placement` list is used) or the list alone:
`[{llm, replica, node, shards: [{gpu, fraction}]}]`. Structural problems are input errors (exit 2);
replicas that no longer fit the new plan or cluster (another shape, a node that is gone, a GPU now
reserved) are not errors: they simply cannot stay.

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


def load_current(path: Path | str, fractions_per_gpu: int) -> Placement:
    """Read a previous plan JSON (or its placement list) as a Placement in units of 1/F."""
    path = Path(path)
    source = str(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError(source, None, "file not found", "pass a plan JSON written by `scepsy plan --out`") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise InputError(source, None, f"cannot read the file ({exc})", "pass a readable plan JSON") from None
    except json.JSONDecodeError as exc:
        raise InputError(source, f"line {exc.lineno}", f"malformed JSON: {exc.msg}", "pass a plan JSON or a placement list") from None
    records = raw.get("placement") if isinstance(raw, dict) else raw
    if not isinstance(records, list):
        raise InputError(source, "placement", "no placement list", "pass a plan JSON (with `placement`) or the list itself")
    return Placement(fractions_per_gpu, tuple(_replica(source, i, r, fractions_per_gpu) for i, r in enumerate(records)))


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
        units = round(fraction * f)
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
