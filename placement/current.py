"""Re-planning: the placement that runs now (`--current`), and which of its replicas may stay.

A current placement is a previous plan JSON (its `placement` list is used) or the list alone:
`[{llm, replica, node, shards: [{gpu, fraction}]}]` (read by models/plan/document.read_current).
A placement that cannot run is an input error (exit 2) naming the entry: a node or GPU the cluster
does not have, a GPU filled twice over, a shard count that is not its LLM's TP; replicas of an LLM
the instance no longer has are ignored with a warning. Replicas that no longer fit the new plan
(another shape, a GPU now reserved) are not errors: they simply cannot stay.

A current replica is a *keep candidate* when the new allocation gives its LLM the same shape
(gpu type of its node, tp = its number of shards, the same share per shard) and its GPUs still
exist, are distinct, lie in one NVLink domain of its node and each have room for the share. A new
placement *keeps* a candidate when it has a replica of that LLM on exactly those GPUs; kept
replicas keep their replica index where the new replica count allows, so that their Kubernetes
Deployments keep their names.

    movable_m     = min(#current replicas of m with its new shape, d_m)
    moved_shards  = sum_m t_m * (movable_m - kept_m)

A replica that is not kept is *new*: it starts. It starts at once where the units it takes are free
now; units the current replicas still hold must first be given back, i.e. a current replica stops
before the new one starts (break before make). With c_i the free units of GPU i (F minus
reservations), b_i the units the current placement holds on it and N_i the units of new replicas
on it:

    c_i^now         = max(0, c_i - b_i)                    (free_now)
    occupied_units  = sum_i max(0, N_i - c_i^now)

the units of new replicas that wait for a current replica to stop (0 where every new replica fits
on what is free now). Re-planning minimises `moved_shards` first, `occupied_units` second (the rest
of the objective follows, docs/placement.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Cluster

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


def held_units(cluster: Cluster, current: Placement | None) -> dict[tuple[str, int], int]:
    """b_i: the units the current placement holds on each GPU of the cluster (GPUs it holds nothing
    on are left out)."""
    if current is None:
        return {}
    gpus = {n.name: n.gpus for n in cluster.nodes}
    out: dict[tuple[str, int], int] = {}
    for rp in current.replicas:
        for s in rp.shards:
            if s.gpu < gpus.get(rp.node, 0):
                out[(rp.node, s.gpu)] = out.get((rp.node, s.gpu), 0) + s.units
    return out


def free_now(cluster: Cluster, current: Placement | None) -> dict[tuple[str, int], int]:
    """c_i^now = max(0, c_i - b_i) of every GPU the current placement holds units on."""
    return {i: max(0, cluster.free_units(*i) - units) for i, units in sorted(held_units(cluster, current).items())}


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
