"""The count model: the one builder of the placement counts every exact model rests on.

Replicas are counted per NVLink domain and shards per GPU instead of being placed one by one. The
counts are kept per *group* of replicas that share a shape: a replica shape k = (gpu type, tp, share)
in the allocation models (planner/allocation/cpsat.py, milp.py) and in the placeability check
(placeability.py), an LLM in the placement model (placement/cpsat.py, which tells LLMs apart
for its shared-GPU objective). Formulation (units in brackets; docs/model.md, docs/placement.md):

Sets
    Q          groups; q has gpu type g_q, tp t_q, share s_q [units of 1/F GPU per shard] and at
               most D_q replicas; W = {q : s_q = F} whole-GPU groups, P the others
    J, I_j     NVLink domains, the GPUs of domain j; j(i) the domain of GPU i
    J_q        domains of type g_q, size >= t_q, with room for at least one replica of q
Parameters
    c_i        free units of GPU i (F minus reservations)
    ub_jq      most replicas of q domain j holds: min(D_q, n fitting with GPU i holding
               min(D_q, c_i // s_q) shards: sum_i min(slots_i, n) >= n t_q, packing.fit_in_domain)
    R_q        replicas of q to place: a number, or the allocation model's sum_o d_o x[m, o]
    K          kept replicas (re-planning): candidate literals k with their domain and GPUs
Variables
    n[j, q]    replicas of q in domain j                                integer, 0..ub_jq
    c[i, q]    shards of fractional q on GPU i                          integer, 0..min(slots_i, ub_jq)
    x[i]       GPU i carries a whole-GPU shard                          {0, 1}
Constraints
    sum_{j in J_q} n[j, q] = R_q                                       every replica in one domain
    sum_{i in I_j} x[i] = sum_{q in W} t_q n[j, q]                     whole shards: one GPU each
    sum_{i in I_j} c[i, q] = t_q n[j, q]                (q in P)        t_q shards per replica
    c[i, q] - K[i, q] <= n[j(i), q] - K[j(i), q]        (q in P)        on distinct GPUs (round robin)
    K[i, q] <= c[i, q] (q in P), K_W[i] <= x[i], K[j, q] <= n[j, q]    kept replicas stay put
with K[i, q], K[j, q], K_W[i] the kept candidates of q on GPU i, in domain j, of whole groups on i.
GPU capacity, sum_q s_q c[i, q] + F x[i] <= c_i, is each model's own (the placement model counts
clean GPUs; the allocation models count used GPUs: `add_used`).

The counts are exact: given c[i, q] <= n[j(i), q], list GPU i c[i, q] times in GPU order and deal
the n replicas round robin (replica r takes positions r, r + n, ...): a GPU's block is at most n
long, so a replica's shards land on distinct GPUs; whole-GPU replicas take the GPUs with x = 1, t at
a time (`decode_counts`).

One formulation, two solvers: the builder states it through `CountSolver`, the few calls a model
needs (CP-SAT: `CpsatCounts` here; PuLP: planner/allocation/milp.py), so that each model reads
data -> variables -> constraints -> objective in its own builder and the counts are written once.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Generic, Hashable, Mapping, Protocol, Sequence, TypeVar

from ortools.sat.python import cp_model

from scepsy.models.instance.instance import Cluster, Domain
from scepsy.placement.feasibility.packing import fit_in_domain

Gpu = tuple[str, int]  # (node, gpu index)
K = TypeVar("K", bound=Hashable)  # what names a group: a shape (allocation models), an LLM (placement)


@dataclass(frozen=True)
class Group(Generic[K]):
    """Replicas counted together: `key` names them (a shape, or an LLM), at most `most` of them."""

    key: K
    gpu_type: str
    tp: int
    share: int
    most: int


@dataclass(frozen=True)
class Kept(Generic[K]):
    """A replica that may stay where it runs (re-planning): its literal, group, domain and GPUs."""

    var: Any
    key: K
    domain: int
    node: str
    gpus: tuple[int, ...]


class CountSolver(Protocol):
    """What the builder needs of a solver. Names are given as parts: (kind, domain, gpu, group)."""

    def int_var(self, upper: int, kind: str, j: int, gpu: Gpu | None, q: int, key: Hashable) -> Any: ...
    def bool_var(self, kind: str, j: int, gpu: Gpu) -> Any: ...
    def weighted(self, terms: Sequence[tuple[int, Any]]) -> Any: ...
    def add(self, constraint: Any) -> None: ...
    def never(self) -> None: ...


@dataclass
class Counts(Generic[K]):
    """The variables of a count model (module docstring), keyed by index tuples."""

    groups: list[Group[K]]
    domains: list[Domain]
    free: dict[Gpu, int]  # free units of each GPU
    fractions_per_gpu: int
    n: dict[tuple[int, K], Any] = field(default_factory=dict)  # (j, key) -> replicas in domain j
    c: dict[tuple[Gpu, K], Any] = field(default_factory=dict)  # (GPU, key) -> shards of a fractional group
    x: dict[Gpu, Any] = field(default_factory=dict)  # GPU -> carries a whole-GPU shard
    upper: dict[tuple[Gpu, K], int] = field(default_factory=dict)  # the bound of each c

    def loads(self) -> dict[Gpu, list[tuple[int, Any]]]:
        """(units, variable) terms of each GPU's load: its fractional shards, then a whole shard."""
        share = {g.key: g.share for g in self.groups}
        out: dict[Gpu, list[tuple[int, Any]]] = defaultdict(list)
        for (i, key), var in self.c.items():
            out[i].append((share[key], var))
        for i, var in self.x.items():
            out[i].append((self.fractions_per_gpu, var))
        return out


def count_variables(solver: CountSolver, cluster: Cluster, groups: Sequence[Group[K]],
                    tick: Callable[[int], None] = lambda step: None) -> Counts[K]:
    """n, c and x (module docstring), domain by domain; `tick(step)` lets the caller stop a build
    that passes its deadline."""
    f = cluster.fractions_per_gpu
    domains = cluster.domains()
    free = {(d.node, g): cluster.free_units(d.node, g) for d in domains for g in d.gpus}
    counts = Counts(list(groups), domains, free, f)
    for j, domain in enumerate(domains):
        tick(j)
        gpus = [(domain.node, g) for g in domain.gpus]
        for q, group in enumerate(groups):
            if domain.gpu_type != group.gpu_type or domain.size < group.tp:
                continue
            # n[j, q]: replicas of q in domain j, at most what fits it
            slots = {i: min(group.most, free[i] // group.share) for i in gpus}
            most = min(group.most, fit_in_domain(list(slots.values()), group.tp))
            if most == 0:
                continue
            counts.n[(j, group.key)] = solver.int_var(most, "n", j, None, q, group.key)
            for i, slot in slots.items():
                if slot == 0:
                    continue
                if group.share == f:
                    # x[i]: GPU i carries a whole-GPU shard (of any whole-GPU group)
                    if i not in counts.x:
                        counts.x[i] = solver.bool_var("x", j, i)
                else:
                    # c[i, q]: shards of q on GPU i
                    counts.upper[(i, group.key)] = min(slot, most)
                    counts.c[(i, group.key)] = solver.int_var(counts.upper[(i, group.key)], "c", j, i, q, group.key)
    return counts


def add_count_rows(solver: CountSolver, counts: Counts[K], replicas: Mapping[K, Any], kept: Sequence[Kept[K]] = (),
                   tick: Callable[[int], None] = lambda step: None) -> None:
    """The constraints of the count model (module docstring); `replicas[key]` is R_q, a number or
    a linear expression of the caller's variables."""
    f = counts.fractions_per_gpu
    groups = {g.key: g for g in counts.groups}
    whole = {g.key for g in counts.groups if g.share == f}

    # every replica in one eligible domain (none eligible: no replica of it, or no placement)
    for group in counts.groups:
        eligible = [counts.n[(j, group.key)] for j in range(len(counts.domains)) if (j, group.key) in counts.n]
        wanted = replicas[group.key]
        if eligible:
            solver.add(sum(eligible) == wanted)
        elif isinstance(wanted, int):
            solver.never()
        else:
            solver.add(wanted == 0)

    kept_on_gpu: dict[tuple[Gpu, K], list[Any]] = defaultdict(list)
    kept_in_domain: dict[tuple[int, K], list[Any]] = defaultdict(list)
    kept_whole: dict[Gpu, list[Any]] = defaultdict(list)
    for candidate in kept:
        kept_in_domain[(candidate.domain, candidate.key)].append(candidate.var)
        for g in candidate.gpus:
            (kept_whole[(candidate.node, g)] if candidate.key in whole else kept_on_gpu[((candidate.node, g), candidate.key)]).append(candidate.var)

    # whole shards: one GPU each, as many per domain as its whole-GPU replicas have shards
    whole_in_domain: dict[int, list[tuple[int, Any]]] = defaultdict(list)
    for (j, key), var in counts.n.items():
        if key in whole:
            whole_in_domain[j].append((groups[key].tp, var))
    for step, (j, terms) in enumerate(whole_in_domain.items()):
        tick(step)
        domain = counts.domains[j]
        solver.add(sum(counts.x[i] for i in [(domain.node, g) for g in domain.gpus] if i in counts.x) == solver.weighted(terms))
    # kept replicas stay put: their GPUs carry their shards, their domain counts them
    for i, literals in kept_whole.items():
        solver.add(sum(literals) <= counts.x[i])
    for (j, key), literals in kept_in_domain.items():
        solver.add(sum(literals) <= counts.n[(j, key)])

    # fractional shards: t_q per replica in its domain, on distinct GPUs (round robin), kept ones stay
    for step, ((j, key), replica_count) in enumerate(counts.n.items()):
        tick(step)
        if key in whole:
            continue
        domain = counts.domains[j]
        gpus = [(domain.node, g) for g in domain.gpus if ((domain.node, g), key) in counts.c]
        solver.add(sum(counts.c[(i, key)] for i in gpus) == groups[key].tp * replica_count)
        in_domain = sum(kept_in_domain.get((j, key), []))
        for i in gpus:
            on_gpu = sum(kept_on_gpu.get((i, key), []))
            solver.add(counts.c[(i, key)] - on_gpu <= replica_count - in_domain)
            if (i, key) in kept_on_gpu:
                solver.add(on_gpu <= counts.c[(i, key)])


def add_used(solver: CountSolver, counts: Counts[K], cluster: Cluster) -> dict[Gpu, Any]:
    """GPU capacity with used[i], true exactly when GPU i holds a shard (the allocation models count
    the GPUs in use, the placeability check prices them):
        sum_q s_q c[i, q] + F x[i] <= c_i used[i],   load_i >= used[i]
    GPUs of a domain with equal free units are interchangeable: their loads are ordered."""
    loads = counts.loads()
    used = {}
    for j, domain in enumerate(counts.domains):
        ordered = []
        for g in domain.gpus:
            i = (domain.node, g)
            used[i] = flag = solver.bool_var("used", j, i)
            terms = loads.get(i, [])
            load = solver.weighted(terms) if terms else 0
            if terms:
                solver.add(load <= counts.free[i] * flag)
                solver.add(load >= flag)
            else:
                solver.add(flag == 0)
            ordered.append((counts.free[i], load))
        for (free_a, load_a), (free_b, load_b) in zip(ordered, ordered[1:]):
            if free_a == free_b and not (isinstance(load_a, int) and isinstance(load_b, int)):
                solver.add(load_a >= load_b)
    return used


@dataclass(frozen=True)
class CountSpot(Generic[K]):
    """A replica decoded from the counts: its group, node and GPUs (`kept`: a kept candidate)."""

    key: K
    node: str
    gpus: tuple[int, ...]
    kept: Kept[K] | None = None


def decode_counts(counts: Counts[K], value: Callable[[Any], int], kept: Sequence[Kept[K]] = ()) -> list[CountSpot[K]]:
    """Counts -> replicas (module docstring): the kept candidates whose literal is set on their
    GPUs, the other whole-GPU replicas on the remaining GPUs with x = 1, t at a time, the other
    fractional replicas of q dealt round robin over the GPUs listed c - K times each."""
    f = counts.fractions_per_gpu
    groups = {g.key: g for g in counts.groups}
    spots: list[CountSpot[K]] = []
    kept_replicas: dict[tuple[int, K], int] = defaultdict(int)
    kept_shards: dict[tuple[Gpu, K], int] = defaultdict(int)
    kept_whole: set[Gpu] = set()
    for candidate in kept:
        if value(candidate.var):
            spots.append(CountSpot(candidate.key, candidate.node, candidate.gpus, candidate))
            kept_replicas[(candidate.domain, candidate.key)] += 1
            for g in candidate.gpus:
                kept_shards[((candidate.node, g), candidate.key)] += 1
                if groups[candidate.key].share == f:
                    kept_whole.add((candidate.node, g))
    by_domain: dict[int, list[tuple[K, int]]] = defaultdict(list)
    for (j, key), var in sorted(counts.n.items(), key=lambda item: item[0]):
        count = value(var) - kept_replicas.get((j, key), 0)
        if count > 0:
            by_domain[j].append((key, count))
    for j, entries in sorted(by_domain.items()):
        domain = counts.domains[j]
        whole = [g for g in domain.gpus if (domain.node, g) in counts.x and value(counts.x[(domain.node, g)])]
        whole = [g for g in whole if (domain.node, g) not in kept_whole]
        for key, count in entries:
            group = groups[key]
            if group.share == f:
                for _ in range(count):
                    gpus, whole = tuple(whole[: group.tp]), whole[group.tp :]
                    spots.append(CountSpot(key, domain.node, gpus))
                continue
            positions = [
                g
                for g in domain.gpus
                if ((domain.node, g), key) in counts.c
                for _ in range(value(counts.c[((domain.node, g), key)]) - kept_shards.get(((domain.node, g), key), 0))
            ]
            for r in range(count):
                spots.append(CountSpot(key, domain.node, tuple(sorted(positions[r + t * count] for t in range(group.tp)))))
    return spots


class CpsatCounts:
    """The count model on a CP-SAT model. Variable names: n[j,key], c[node/gpu,key], x[node/gpu]."""

    def __init__(self, model: cp_model.CpModel):
        self.model = model

    def int_var(self, upper: int, kind: str, j: int, gpu: Gpu | None, q: int, key: Hashable) -> cp_model.IntVar:
        where = f"{j}" if gpu is None else f"{gpu[0]}/{gpu[1]}"
        return self.model.new_int_var(0, upper, f"{kind}[{where},{key}]")

    def bool_var(self, kind: str, j: int, gpu: Gpu) -> cp_model.IntVar:
        return self.model.new_bool_var(f"{kind}[{gpu[0]}/{gpu[1]}]")

    def weighted(self, terms: Sequence[tuple[int, Any]]) -> cp_model.LinearExprT:
        return cp_model.LinearExpr.weighted_sum([v for _, v in terms], [k for k, _ in terms]) if terms else 0

    def add(self, constraint: Any) -> None:
        self.model.add(constraint)

    def never(self) -> None:
        self.model.add_bool_or([])  # the empty clause: no placement
