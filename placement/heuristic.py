"""The paper's hierarchical placement heuristic (section 6, "Hierarchical placement algorithm").

The paper's text, point by point, and how it is read here (docs/placement.md says the same):

1. *Most constrained first: tensor-parallel models before non-tensor-parallel ones and, within each
   category, larger allocations first.* Replicas are placed one at a time, TP > 1 before TP = 1;
   within each group by units per replica `t * s` (descending), then TP degree, then share, then
   LLM name and replica number (for determinism).
2. *Inter-node stage: first place LLMs into nodes, prioritising larger instances.* The paper does
   not say how a node is chosen. Here: among the nodes of the replica's gpu type on which the
   intra-node stage finds room, the one with the least free capacity (best fit; ties: cluster
   order), so that empty nodes stay empty for later large TP replicas -- the same "preserve large
   capacity" principle the paper states for NVLink domains. The two stages interleave per replica
   (the node is chosen with the node's current state, then the intra-node stage places it), because
   whether a node has room depends on where its earlier replicas went inside it.
3. *Intra-node stage: enumerate the node's NVLink domains with capacity, score them by the imbalance
   between their largest and smallest per-GPU (used) fractions, prefer the most balanced, then the
   one with least capacity.* For TP replicas and whole-GPU replicas: a domain has capacity when at
   least `t` of its GPUs each have `s` free units; the replica's shards go on its `t` least-used
   such GPUs ("well-balanced tensor-parallel instance allocations"); the domain's score is the
   imbalance it would have *with the replica placed* (max minus min used fraction over its GPUs,
   reservations counting as used), then its free capacity, then its index. (Scoring the imbalance
   before placing would send every second TP replica to an empty domain -- a half-used domain is
   unbalanced, an empty one is not -- which is the opposite of preserving large domains.)
4. *Sub-GPU fractions are instead packed onto already occupied GPUs first.* A TP = 1 replica with a
   share below a whole GPU goes on the node's GPU with room that is already occupied (by a shard
   or a reservation), best fit (least free units left); only if none has room, on an empty GPU of
   the domain with the least free capacity. Ties: domain index, GPU index.

Re-planning (`current`): keep candidates (placement/current.py) are pinned first, in (llm, replica)
order, at most d_m per LLM; the remaining replicas are placed as above. If that gets stuck, the
heuristic runs once more without pins.

The heuristic never returns an invalid placement; it may get stuck on a placeable allocation (it
then says on which replica), and its placements are not optimal: placement/cpsat.py is.
Complexity: nodes in the same state (gpu type, domains, free units per GPU) behave alike, so each
replica evaluates each distinct node state once (memoised); 1024 GPUs place in well under a second.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from functools import lru_cache

from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Cluster

from scepsy.placement.current import Candidate, keep_candidates
from scepsy.placement.objective import Spot, number_replicas

Domains = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class HeuristicResult:
    placement: Placement | None
    stuck: str | None = None  # the replica it could not place (placement is None)
    pinned: int = 0  # keep candidates pinned in place (re-planning)


@dataclass(frozen=True)
class _Replica:
    llm: str
    replica: int
    gpu_type: str
    tp: int
    share: int


def placement_order(allocation: Allocation) -> list[_Replica]:
    """Most constrained first: TP replicas, then single-GPU ones; larger (t * s) first in each."""
    replicas = [
        _Replica(c.llm, r, c.gpu_type, c.tp, c.share) for c in allocation.llms for r in range(c.replicas)
    ]
    return sorted(replicas, key=lambda x: (x.tp == 1, -x.tp * x.share, -x.tp, -x.share, x.llm, x.replica))


@lru_cache(maxsize=65536)
def _spot(domains: Domains, free: tuple[int, ...], tp: int, share: int, f: int) -> tuple[int, ...] | None:
    """The intra-node stage for one node state: the GPUs the replica gets, or None (no room)."""
    if tp == 1 and share < f:
        return _packed(domains, free, share, f)
    best: tuple[tuple[int, int, int], tuple[int, ...]] | None = None
    for index, domain in enumerate(domains):
        if len(domain) < tp:
            continue
        fitting = sorted((-free[g], g) for g in domain if free[g] >= share)  # least used first
        if len(fitting) < tp:
            continue
        chosen = tuple(sorted(g for _, g in fitting[:tp]))
        after = [free[g] - share if g in chosen else free[g] for g in domain]
        imbalance = max(after) - min(after)  # = max used - min used, in units
        key = (imbalance, sum(after), index)
        if best is None or key < best[0]:
            best = (key, chosen)
    return best[1] if best is not None else None


def _packed(domains: Domains, free: tuple[int, ...], share: int, f: int) -> tuple[int, ...] | None:
    """A sub-GPU single-GPU shard: occupied GPUs first, best fit; else the emptiest-domain rule."""
    best = None
    for index, domain in enumerate(domains):
        capacity = sum(free[g] for g in domain)
        for g in domain:
            if free[g] >= share:
                key = (free[g] == f, free[g] - share, capacity, index, g)
                if best is None or key < best:
                    best = key
    return (best[-1],) if best is not None else None


@dataclass
class _ClusterState:
    """Free units per GPU, with nodes grouped by state so that alike nodes are evaluated once."""

    cluster: Cluster

    def __post_init__(self) -> None:
        self.f = self.cluster.fractions_per_gpu
        self.nodes = list(self.cluster.nodes)
        self.index = {n.name: i for i, n in enumerate(self.nodes)}
        reserved = {node for node, _ in self.cluster.reserved_units}
        whole: dict[int, tuple[int, ...]] = {}  # a node without reservations: every unit free (shared tuple)
        self.free = [
            tuple(self.cluster.free_units(n.name, g) for g in range(n.gpus)) if n.name in reserved
            else whole.setdefault(n.gpus, (self.f,) * n.gpus)
            for n in self.nodes
        ]
        self.groups: dict[tuple, list[int]] = {}
        for i in range(len(self.nodes)):  # ascending: each group's list stays sorted
            self.groups.setdefault(self._key(i), []).append(i)

    def _key(self, i: int) -> tuple:
        node = self.nodes[i]
        return (node.gpu_type, sum(self.free[i]), node.domains, self.free[i])

    def _join(self, i: int) -> None:
        bisect.insort(self.groups.setdefault(self._key(i), []), i)

    def take(self, i: int, gpus: tuple[int, ...], share: int) -> None:
        key = self._key(i)
        members = self.groups[key]
        members.remove(i)
        if not members:
            del self.groups[key]
        free = list(self.free[i])
        for g in gpus:
            free[g] -= share
        self.free[i] = tuple(free)
        self._join(i)

    def fits(self, i: int, gpus: tuple[int, ...], share: int) -> bool:
        return all(self.free[i][g] >= share for g in gpus)

    def choose(self, replica: _Replica) -> tuple[int, tuple[int, ...]] | None:
        """Inter-node stage: the node with least free capacity where the intra-node stage has room."""
        candidates = sorted(
            (key[1], members[0], key) for key, members in self.groups.items() if key[0] == replica.gpu_type
        )
        for _, first, (_, _, domains, free) in candidates:
            gpus = _spot(domains, free, replica.tp, replica.share, self.f)
            if gpus is not None:
                return first, gpus
        return None


def _run(cluster: Cluster, allocation: Allocation, pins: list[Candidate]) -> HeuristicResult:
    state = _ClusterState(cluster)
    shares = {c.llm: c.share for c in allocation.llms}
    spots: list[Spot] = []
    pinned: dict[str, int] = {}
    for pin in pins:
        spots.append(Spot(pin.llm, pin.node, pin.gpus, shares[pin.llm], pin.replica))
        state.take(state.index[pin.node], pin.gpus, shares[pin.llm])
        pinned[pin.llm] = pinned.get(pin.llm, 0) + 1
    for replica in placement_order(allocation):
        if replica.replica < pinned.get(replica.llm, 0):
            continue  # this LLM's first replicas are the pinned ones
        choice = state.choose(replica)
        if choice is None:
            f = cluster.fractions_per_gpu
            stuck = (
                f"replica {replica.replica} of llm {replica.llm} (tp {replica.tp}, fraction {replica.share / f:g} "
                f"per GPU, {replica.gpu_type}) found no NVLink domain with room"
            )
            return HeuristicResult(None, stuck, len(pins))
        node, gpus = choice
        state.take(node, gpus, replica.share)
        spots.append(Spot(replica.llm, state.nodes[node].name, gpus, replica.share))
    return HeuristicResult(number_replicas(cluster, spots), None, len(pins))


def _pins(cluster: Cluster, allocation: Allocation, current: Placement | None) -> list[Candidate]:
    """Keep candidates that fit together, at most d_m per LLM, in (llm, replica) order."""
    replicas = {c.llm: c.replicas for c in allocation.llms}
    shares = {c.llm: c.share for c in allocation.llms}
    candidates = keep_candidates(cluster, allocation, current)
    if not candidates:  # a first plan: no per-GPU table to build
        return []
    free = {(n.name, g): cluster.free_units(n.name, g) for n in cluster.nodes for g in range(n.gpus)}
    count: dict[str, int] = {}
    pins = []
    for candidate in candidates:
        share = shares[candidate.llm]
        if count.get(candidate.llm, 0) >= replicas[candidate.llm]:
            continue
        if all(free[(candidate.node, g)] >= share for g in candidate.gpus):
            for g in candidate.gpus:
                free[(candidate.node, g)] -= share
            count[candidate.llm] = count.get(candidate.llm, 0) + 1
            pins.append(candidate)
    return pins


def heuristic_placement(cluster: Cluster, allocation: Allocation, current: Placement | None = None) -> HeuristicResult:
    """Place `allocation` with the paper's heuristic (module docstring); pins kept replicas first."""
    pins = _pins(cluster, allocation, current)
    result = _run(cluster, allocation, pins)
    if result.placement is None and pins:
        return _run(cluster, allocation, [])
    return result


def first_fit_placement(cluster: Cluster, allocation: Allocation) -> Placement | None:
    """Not the paper's heuristic: a second start for the CP-SAT model, aimed at its objective.

    First fit decreasing over NVLink domains (replicas by TP degree, then units per replica, both
    descending: a wide replica needs a large domain, so it goes before the large domains fill up;
    domains with a reservation first -- filling them costs no free domain -- then larger domains first, then cluster
    order), best fit over a domain's GPUs (the t GPUs with the least room that still fits). A domain
    that cannot take a shape now never can later (room only shrinks), so each shape keeps a pointer
    to its first possible domain: linear time. Returns None if it gets stuck.
    """
    f = cluster.fractions_per_gpu
    domains = cluster.domains()
    free = {(d.node, g): cluster.free_units(d.node, g) for d in domains for g in d.gpus}
    order = sorted(
        range(len(domains)),
        key=lambda j: (all(free[(domains[j].node, g)] == f for g in domains[j].gpus), -domains[j].size, j),
    )
    pointer: dict[tuple[str, int, int], int] = {}
    spots: list[Spot] = []
    replicas = sorted(placement_order(allocation), key=lambda r: (-r.tp, -r.tp * r.share))  # stable
    for replica in replicas:
        shape = (replica.gpu_type, replica.tp, replica.share)
        k = pointer.get(shape, 0)
        while k < len(order):
            domain = domains[order[k]]
            if domain.gpu_type == replica.gpu_type and domain.size >= replica.tp:
                fitting = sorted((free[(domain.node, g)], g) for g in domain.gpus if free[(domain.node, g)] >= replica.share)
                if len(fitting) >= replica.tp:
                    gpus = tuple(sorted(g for _, g in fitting[: replica.tp]))
                    for g in gpus:
                        free[(domain.node, g)] -= replica.share
                    spots.append(Spot(replica.llm, domain.node, gpus, replica.share))
                    break
            k += 1
        pointer[shape] = k
        if k == len(order):
            return None
    return number_replicas(cluster, spots)
