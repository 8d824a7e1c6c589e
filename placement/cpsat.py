"""Exact placement model (OR-Tools CP-SAT): every shard on a GPU, lexicographically least fragmented.

An LLM has exactly one shape (gpu type, tp, share) in an allocation, so counts per (domain, LLM) and
(GPU, LLM) describe a placement exactly (deal a domain's replicas round robin over its GPUs, each
GPU listed as often as it holds shards: placement/feasibility/placeability.py) and are far fewer than one boolean
per shard and GPU. Shards of a whole GPU (s = F) need even less: a GPU holds at most one, so one
boolean per GPU says whether it carries a whole shard, and any whole-GPU replica of the domain may
take it. Formulation (units in brackets; docs/placement.md states the same):

Sets
    M = W + P  LLMs: W whole-GPU (s_m = F), P fractional (s_m < F); m has gpu type g_m, tp t_m,
               share s_m [units of 1/F GPU per shard], replicas d_m
    J          NVLink domains; I_j the GPUs of domain j; j(i) the domain of GPU i
    J_m        domains eligible for m: type g_m, room for at least one replica of m
    Q_m        keep candidates of m (re-planning, placement/current.py): domain j_q, GPUs G_q
    I*, J*     clean GPUs (c_i = F: no reservation) and clean domains (all GPUs clean)
    I^b        GPUs the current placement holds units on, with room for fewer new units now
               (re-planning: c_i^now < c_i, only among GPUs with variables)
Parameters
    F          units per GPU;  c_i  free units of GPU i (F minus reservations)
    c_i^now    units of GPU i free now: max(0, c_i - units the current placement holds on it)
    ub_im      most shards of m on GPU i: min(d_m, c_i // s_m, most replicas of m in j(i))
    w, W(c)    bin-packing weights, the most weight that fits c units (planner/allocation/cpsat.py)
Variables
    n[j, m]    replicas of m in domain j                           integer, 0..most that fit j
    c[i, m]    shards of fractional m on GPU i                     integer, 0..ub_im
    x[i]       clean GPU i carries a whole-GPU shard               {0, 1}
    u[i]       clean GPU i holds a shard                           {0, 1}
    v[j]       clean domain j holds a shard                        {0, 1}
    e[i, m]    GPU i holds shards of m and of no other LLM         {0, 1}
    h[i]       GPU i holds shards of two or more LLMs              {0, 1}
    k[q]       candidate q stays where it is                       {0, 1}
    o[i]       units of new replicas on GPU i in I^b beyond c_i^now   integer, 0..c_i - c_i^now
Constraints
    sum_{j in J_m} n[j, m] = d_m                                   every replica in one domain
    sum_{i in I_j} x[i] = sum_{m in W} t_m n[j, m]                 whole shards: one GPU each
    sum_{i in I_j} c[i, m] = t_m n[j, m]            (m in P)        its t_m shards in that domain
    c[i, m] - K[i, m] <= n[j(i), m] - K[j(i), m]     (m in P)        distinct GPUs per replica (round
        K[i, m] = sum_{q in Q_m: i in G_q} k[q],  K[j, m] = sum_{q in Q_m: j_q = j} k[q]    robin), kept
    K[i, m] <= c[i, m] (m in P);  sum_{q in Q_W: i in G_q} k[q] <= x[i];  K[j, m] <= n[j, m]   stay put
    F x[i] + sum_{m in P} s_m c[i, m] <= c_i u[i]   (i clean; else without x, <= c_i)   capacity
    u[i] <= v[j(i)]                                                a used GPU uses its domain
    c[i, m] <= ub_im (e[i, m] + h[i]);  sum_m e[i, m] + h[i] <= u[i]      one LLM's, or shared
    sum_{m in P} s_m c[i, m] <= sum_m s_m ub_im e[i, m] + c_i h[i]        (fractional LLMs only:
                                                                   a whole-GPU shard is never shared)
    sum_{i of type g} (w(F) x[i] + sum_m w(s_m) c[i, m]) <= W(F) sum_i u[i]   (and per clean domain
                                                                   with v)  bin-packing cuts, valid
    o[i] >= F x[i] + sum_{m in P} s_m c[i, m] - sum_{q: i in G_q} s_q k[q] - c_i^now   (i in I^b)
                                                                   new units past what is free now
    symmetry breaking: interchangeable nodes (same gpu type, domains, free units and units held
    now, no candidate), domains of a node and GPUs of a domain are ordered by load: load(a) >=
    load(b), a before b
Objective (lexicographic; stages solved in turn, each fixed at its optimum)
    re-planning:  max sum_q t_q k[q]       (= fewest moved shards)
    re-planning:  min sum_{i in I^b} o[i]  (= fewest occupied units: o[i] = max(0, N_i - c_i^now)
                                           at the optimum, placement/current.py; a GPU outside I^b
                                           has room for every new unit now)
    1. min sum_{j in J*} v[j]             (= most free whole NVLink domains)
    2. min sum_{i in I*} u[i]             (= most free whole GPUs)
    3. min sum_i h[i]                     (= fewest GPUs shared by different LLMs)
Decode: per domain, kept candidates on their GPUs; the other whole-GPU replicas take the remaining
GPUs with x = 1, t at a time; the other fractional replicas of m are dealt round robin over the GPUs
listed c - K times each (valid because c - K <= n - K). Every placement returned is also checked by
the placement validator (models/instance/placement_check.py, from placement/place.py).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TypeAlias

from ortools.sat.python import cp_model

from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import Cluster, Domain
from scepsy.placement.feasibility.solver import STATUS_NAMES, cpsat_solver
from scepsy.placement.feasibility.counts import Counts, CpsatCounts, Group, Kept, add_count_rows, count_variables, decode_counts
from scepsy.placement.feasibility.packing import packing_weights

from scepsy.placement.current import Candidate, free_now, held_units, keep_candidates, movable_replicas
from scepsy.placement.heuristic import first_fit_placement
from scepsy.placement.objective import Spot, evaluate, number_replicas

Gpu = tuple[str, int]  # (node, gpu index)
Var: TypeAlias = cp_model.IntVar


@dataclass(frozen=True)
class Stage:
    name: str  # moved_shards | occupied_units | free_domains | free_gpus | shared_gpus
    expr: cp_model.LinearExprT  # minimised (an int when the stage has nothing to decide)
    offset: int  # reported value = offset + sign * expr
    sign: int


@dataclass(frozen=True)
class SymmetryClasses:
    """Interchangeable elements, each tuple in the order their loads are constrained (descending)."""

    nodes: tuple[tuple[str, ...], ...]  # nodes with equal gpu type, domains and free units per GPU
    domains: tuple[tuple[int, ...], ...]  # domains of one node with equal sorted free units
    gpus: tuple[tuple[Gpu, ...], ...]  # GPUs of one domain with equal free units (and units held now)


@dataclass
class PlacementModel:
    cluster: Cluster
    allocation: Allocation
    model: cp_model.CpModel
    domains: list[Domain]
    candidates: list[Candidate]
    counts: Counts[str]
    kept: list[Kept[str]]  # the keep candidates' literals k[q], for the count model
    n: dict[tuple[int, str], Var]
    c: dict[tuple[Gpu, str], Var]
    x: dict[Gpu, Var]
    u: dict[Gpu, Var]
    v: dict[int, Var]
    e: dict[tuple[Gpu, str], Var]
    h: dict[Gpu, Var]
    k: dict[int, Var]
    o: dict[Gpu, Var]
    now: dict[Gpu, int]  # c_i^now of the GPUs in I^b (re-planning; empty otherwise)
    classes: SymmetryClasses = SymmetryClasses((), (), ())
    stages: list[Stage] = field(default_factory=list)
    held: dict[Gpu, int] = field(default_factory=dict)  # units the current placement holds per GPU
    replanning: bool = False  # built with a current placement

    def variables(self):
        for group in (self.n, self.c, self.x, self.u, self.v, self.e, self.h, self.k, self.o):
            yield from group.values()


def _sum(terms: list[tuple[int, Var]]) -> cp_model.LinearExprT:
    return cp_model.LinearExpr.weighted_sum([v for _, v in terms], [k for k, _ in terms]) if terms else 0


class ModelTooLargeError(Exception):
    """Building the model passed its deadline: the cluster is too large for the time limit."""


CHECK_EVERY = 256  # loop steps between two deadline checks while building (each step is cheap)


def _check_deadline(deadline: float | None, step: int = 0) -> None:
    """Past `deadline`: ModelTooLargeError; in a loop only every CHECK_EVERY steps (`step`)."""
    if step % CHECK_EVERY == 0 and deadline is not None and time.perf_counter() > deadline:
        raise ModelTooLargeError()


def build_placement_model(
    cluster: Cluster, allocation: Allocation, current: Placement | None = None, deadline: float | None = None
) -> PlacementModel:
    """Data -> variables -> constraints -> objective stages (module docstring). Past `deadline`
    (perf_counter seconds) it raises ModelTooLargeError: the time limit covers building too."""
    # data
    f = cluster.fractions_per_gpu
    llms = [m for m in allocation.llms if m.replicas > 0]
    share = {m.llm: m.share for m in llms}
    tp = {m.llm: m.tp for m in llms}
    candidates = keep_candidates(cluster, allocation, current)
    _check_deadline(deadline)  # each step here is linear in the GPUs: a second for a million
    model = cp_model.CpModel()

    # n[j, m]: replicas of m in domain j;  c[i, m]: shards of fractional m on GPU i;  x[i]: whole shard
    # (the count model: placement/feasibility/counts.py, one group per LLM)
    solver = CpsatCounts(model)
    tick = lambda step: _check_deadline(deadline, step)  # noqa: E731
    counts = count_variables(solver, cluster, [Group(m.llm, m.gpu_type, m.tp, m.share, m.replicas) for m in llms], tick)
    n, c, x, upper = counts.n, counts.c, counts.x, counts.upper
    domains, free = counts.domains, counts.free
    clean = {i for i, units in free.items() if units == f}
    _check_deadline(deadline)
    # k[q]: candidate q stays (only where its domain is eligible)
    k = {q: model.new_bool_var(f"k[{q}]") for q, cand in enumerate(candidates) if (cand.domain, cand.llm) in n}
    kept = [Kept(var, candidates[q].llm, candidates[q].domain, candidates[q].node, candidates[q].gpus) for q, var in k.items()]

    # every replica in one eligible domain (none eligible: infeasible, diagnosed by the caller);
    # whole shards one GPU each; fractional shards t_m per replica on distinct GPUs; kept ones stay
    add_count_rows(solver, counts, {m.llm: m.replicas for m in llms}, kept, tick)

    # GPU capacity; u[i], v[j]: clean GPUs and clean domains in use
    fractional: dict[Gpu, list[tuple[str, Var]]] = defaultdict(list)
    for (i, m), var in c.items():
        fractional[i].append((m, var))
    modelled = set(fractional) | set(x)
    domain_of = {(d.node, g): j for j, d in enumerate(domains) for g in d.gpus}
    v = {
        j: model.new_bool_var(f"v[{j}]")
        for j, d in enumerate(domains)
        if all((d.node, g) in clean for g in d.gpus) and any((d.node, g) in modelled for g in d.gpus)
    }
    u: dict[Gpu, Var] = {}
    loads: dict[Gpu, list[tuple[int, Var]]] = {}
    for step, i in enumerate(sorted(modelled)):
        _check_deadline(deadline, step)
        loads[i] = [(share[m], var) for m, var in fractional.get(i, [])] + ([(f, x[i])] if i in x else [])
        if i in clean:
            u[i] = model.new_bool_var(f"u[{i[0]}/{i[1]}]")
            model.add(_sum(loads[i]) <= free[i] * u[i])
            if domain_of[i] in v:
                model.add_implication(u[i], v[domain_of[i]])
        else:
            model.add(_sum(loads[i]) <= free[i])

    # e[i, m], h[i]: a GPU is one LLM's or shared (only where two fractional LLMs could meet)
    e: dict[tuple[Gpu, str], Var] = {}
    h: dict[Gpu, Var] = {}
    for step, (i, terms) in enumerate(sorted(fractional.items())):
        _check_deadline(deadline, step)
        if len(terms) < 2:
            continue
        h[i] = model.new_bool_var(f"h[{i[0]}/{i[1]}]")
        for m, var in terms:
            e[(i, m)] = model.new_bool_var(f"e[{i[0]}/{i[1]},{m}]")
            model.add(var <= upper[(i, m)] * (e[(i, m)] + h[i]))
        model.add(sum(e[(i, m)] for m, _ in terms) + h[i] <= (u[i] if i in u else 1))
        model.add(
            _sum([(share[m], var) for m, var in terms])
            <= _sum([(share[m] * upper[(i, m)], e[(i, m)]) for m, _ in terms] + [(free[i], h[i])])
        )

    # o[i]: units of new (not kept) replicas on GPU i past what is free there now (re-planning:
    # only GPUs the current placement holds units on can have any)
    held = held_units(cluster, current)
    now = {i: units for i, units in free_now(cluster, current).items() if i in modelled and units < free[i]}
    kept_on: dict[Gpu, list[tuple[int, Var]]] = defaultdict(list)
    for q, var in k.items():
        for g in candidates[q].gpus:
            kept_on[(candidates[q].node, g)].append((share[candidates[q].llm], var))
    o: dict[Gpu, Var] = {}
    for step, (i, units) in enumerate(sorted(now.items())):
        _check_deadline(deadline, step)
        o[i] = model.new_int_var(0, free[i] - units, f"o[{i[0]}/{i[1]}]")
        model.add(o[i] + units >= _sum(loads[i] + [(-units_kept, var) for units_kept, var in kept_on.get(i, [])]))

    _check_deadline(deadline)
    _add_packing_cuts(model, cluster, domains, loads, u, v)
    _check_deadline(deadline)
    classes = symmetry_classes(cluster, domains, candidates, modelled, held)
    _break_symmetry(model, cluster, domains, classes, loads)
    _check_deadline(deadline)

    pm = PlacementModel(cluster, allocation, model, domains, candidates, counts, kept, n, c, x, u, v, e, h, k, o, now,
                        classes, held=held, replanning=current is not None)
    if current is not None:
        movable = sum(tp[m] * count for m, count in movable_replicas(cluster, allocation, current).items() if m in tp)
        pm.stages.append(Stage("moved_shards", _sum([(-candidates[q].tp, var) for q, var in k.items()]), movable, 1))
        pm.stages.append(Stage("occupied_units", _sum([(1, var) for var in o.values()]), 0, 1))
    clean_domains = sum(all((d.node, g) in clean for g in d.gpus) for d in domains)
    pm.stages.append(Stage("free_domains", _sum([(1, var) for var in v.values()]), clean_domains, -1))
    pm.stages.append(Stage("free_gpus", _sum([(1, var) for var in u.values()]), len(clean), -1))
    pm.stages.append(Stage("shared_gpus", _sum([(1, var) for var in h.values()]), 0, 1))
    return pm


def _restricted_weights(f: int, sizes: list[int]) -> list[tuple[dict[int, int], int]]:
    """Bin-packing weight functions restricted to the shard sizes present, with W(F) = the most
    weight of present sizes that fits one GPU (a knapsack over those sizes only: valid, and tighter
    than over all sizes); duplicates and all-zero functions dropped. The identity w(s) = s comes
    first: the GPUs' capacity summed, which presolve cannot weaken as it may a single GPU's row."""
    out: dict[tuple[int, ...], int] = {}
    identity = tuple(range(f + 1))  # w(s) = s: plain capacity, aggregated
    for weight in [identity, *packing_weights(f)]:
        restricted = tuple(weight[s] for s in sizes)
        if not any(restricted):
            continue
        best = [0] * (f + 1)
        for room in range(1, f + 1):
            best[room] = max([best[room - 1]] + [best[room - s] + w for s, w in zip(sizes, restricted) if s <= room])
        out[restricted] = min(out.get(restricted, best[f]), best[f])
    return [(dict(zip(sizes, key)), capacity) for key, capacity in sorted(out.items())]


def _add_packing_cuts(model, cluster: Cluster, domains: list[Domain], loads, u, v) -> None:
    """Aggregated bin-packing inequalities (dual feasible functions) per gpu type over clean GPUs
    and clean domains: valid, and they give the LP relaxation the bounds of stages 1 and 2."""
    f = cluster.fractions_per_gpu
    type_of = {n.name: n.gpu_type for n in cluster.nodes}
    in_clean_domain = {(domains[j].node, g) for j in v for g in domains[j].gpus}
    for gpu_type in sorted({type_of[i[0]] for i in u}):
        gpus = [i for i in u if type_of[i[0]] == gpu_type]
        shards = [(i, s, var) for i in gpus for s, var in loads[i]]
        doms = [j for j in v if domains[j].gpu_type == gpu_type]
        for weight, capacity in _restricted_weights(f, sorted({s for _, s, _ in shards})):
            terms = [(weight[s], i, var) for i, s, var in shards if weight[s]]
            model.add(_sum([(wt, var) for wt, _, var in terms]) <= _sum([(capacity, u[i]) for i in gpus]))
            in_domains = [(wt, var) for wt, i, var in terms if i in in_clean_domain]
            if doms and in_domains:
                model.add(_sum(in_domains) <= _sum([(capacity * domains[j].size, v[j]) for j in doms]))


def symmetry_classes(cluster: Cluster, domains: list[Domain], candidates: list[Candidate], modelled: set[Gpu],
                     held: dict[Gpu, int] | None = None) -> SymmetryClasses:
    """Classes of interchangeable nodes, domains and GPUs. Elements touched by a keep candidate
    (re-planning) or without variables are left out: they are not interchangeable. `held`: the
    units the current placement holds per GPU (re-planning); GPUs are interchangeable only with
    equal free units and equal units held, which is what the occupied units depend on."""
    touched = {(cand.node, g) for cand in candidates for g in cand.gpus}
    held = held or {}

    def units(i: Gpu) -> int | tuple[int, int]:  # free units, with the units held where there are any
        return (cluster.free_units(*i), held[i]) if i in held else cluster.free_units(*i)

    nodes: dict[tuple, list[str]] = defaultdict(list)
    for node in cluster.nodes:
        gpus = [(node.name, g) for g in range(node.gpus)]
        if any(i in touched for i in gpus) or not any(i in modelled for i in gpus):
            continue
        frees = tuple(units((node.name, g)) for g in range(node.gpus))
        nodes[(node.gpu_type, node.domains, frees)].append(node.name)
    in_node: dict[tuple, list[int]] = defaultdict(list)
    in_domain: dict[tuple, list[Gpu]] = defaultdict(list)
    for j, domain in enumerate(domains):
        gpus = [(domain.node, g) for g in domain.gpus]
        if not any(i in modelled for i in gpus):
            continue
        if not any(i in touched for i in gpus):
            frees = tuple(sorted(cluster.free_units(*i) for i in gpus))
            pairs = tuple(sorted((cluster.free_units(*i), held[i]) for i in gpus if i in held))
            in_node[(domain.node, frees) + ((pairs,) if pairs else ())].append(j)
        for i in gpus:
            if i not in touched:
                in_domain[(j, units(i))].append(i)

    def classes(groups: dict) -> tuple:
        return tuple(tuple(members) for _, members in sorted(groups.items(), key=lambda kv: repr(kv[0])) if len(members) > 1)

    return SymmetryClasses(classes(nodes), classes(in_node), classes(in_domain))


def _break_symmetry(model, cluster: Cluster, domains: list[Domain], classes: SymmetryClasses, loads) -> None:
    """Order the loads of interchangeable nodes, domains within a node and GPUs within a domain.

    Sorting nodes by load, then each node's domains, then each domain's GPUs maps any placement to
    one that satisfies all three orders with the same objective (`canonical` does exactly that to
    the hint), so some optimum survives."""

    def load(gpus: list[Gpu]) -> cp_model.LinearExprT:
        return _sum([term for i in gpus for term in loads.get(i, [])])

    sizes = {n.name: n.gpus for n in cluster.nodes}
    groups = [[[(name, g) for g in range(sizes[name])] for name in members] for members in classes.nodes]
    groups += [[[(domains[j].node, g) for g in domains[j].gpus] for j in members] for members in classes.domains]
    groups += [[[i] for i in members] for members in classes.gpus]
    for members in groups:
        for a, b in zip(members, members[1:]):
            la, lb = load(a), load(b)
            if not (isinstance(la, int) and isinstance(lb, int)):
                model.add(la >= lb)


def canonical(pm: PlacementModel, placement: Placement) -> Placement:
    """The same placement with interchangeable nodes, then domains, then GPUs permuted into
    descending load order: it satisfies the symmetry-breaking constraints, so it can be a hint.
    Objective values are unchanged (the permutations preserve free units, units held now and domains)."""
    content: dict[Gpu, list[tuple[int, int]]] = defaultdict(list)  # GPU -> (replica position, units)
    for r, rp in enumerate(placement.replicas):
        for shard in rp.shards:
            content[(rp.node, shard.gpu)].append((r, shard.units))

    def load(gpus) -> int:
        return sum(units for i in gpus for _, units in content.get(i, ()))

    def free_and_held(i: Gpu) -> tuple[int, int]:
        return (pm.cluster.free_units(*i), pm.held.get(i, 0))

    def permute(mapping: dict[Gpu, Gpu]) -> None:  # the contents of GPU src move to GPU dst
        moved = {dst: content.pop(src, []) for src, dst in mapping.items()}
        content.update({dst: items for dst, items in moved.items() if items})

    sizes = {n.name: n.gpus for n in pm.cluster.nodes}
    for nodes in pm.classes.nodes:
        by_load = sorted(nodes, key=lambda name: -load([(name, g) for g in range(sizes[name])]))
        permute({(src, g): (dst, g) for src, dst in zip(by_load, nodes) for g in range(sizes[src])})
    for domain_indices in pm.classes.domains:
        doms = [pm.domains[j] for j in domain_indices]
        doms_by_load = sorted(doms, key=lambda d: -load([(d.node, g) for g in d.gpus]))
        mapping: dict[Gpu, Gpu] = {}
        for src_domain, dst_domain in zip(doms_by_load, doms):  # pair GPUs of equal free and held units
            a = sorted(src_domain.gpus, key=lambda g: (*free_and_held((src_domain.node, g)), g))
            b = sorted(dst_domain.gpus, key=lambda g: (*free_and_held((dst_domain.node, g)), g))
            mapping.update({(src_domain.node, p): (dst_domain.node, q) for p, q in zip(a, b)})
        permute(mapping)
    for gpus in pm.classes.gpus:
        gpus_by_load = sorted(gpus, key=lambda i: -load([i]))
        permute(dict(zip(gpus_by_load, gpus)))
    shards: dict[int, list[Shard]] = defaultdict(list)
    node_of: dict[int, str] = {}
    for (node, gpu), items in content.items():
        for r, units in items:
            shards[r].append(Shard(gpu, units))
            node_of[r] = node
    replicas = tuple(
        ReplicaPlacement(rp.llm, rp.replica, node_of[r], tuple(sorted(shards[r]))) for r, rp in enumerate(placement.replicas)
    )
    return Placement(placement.fractions_per_gpu, replicas)


def hint_values(pm: PlacementModel, placement: Placement) -> dict[Var, int]:
    """The value of every variable for a valid placement that satisfies the symmetry breaking."""
    f = pm.cluster.fractions_per_gpu
    domain_of = {(d.node, g): j for j, d in enumerate(pm.domains) for g in d.gpus}
    replicas: dict[tuple[int, str], int] = defaultdict(int)
    counts: dict[tuple[Gpu, str], int] = defaultdict(int)
    holds: dict[Gpu, set[str]] = defaultdict(set)
    whole: set[Gpu] = set()
    spots: dict[tuple, int] = defaultdict(int)
    for rp in placement.replicas:
        replicas[(domain_of[(rp.node, rp.shards[0].gpu)], rp.llm)] += 1
        spots[(rp.llm, rp.node, tuple(sorted(s.gpu for s in rp.shards)))] += 1
        for shard in rp.shards:
            counts[((rp.node, shard.gpu), rp.llm)] += 1
            holds[(rp.node, shard.gpu)].add(rp.llm)
            if shard.units == f:
                whole.add((rp.node, shard.gpu))
    values: dict[Var, int] = {}
    values.update({var: replicas.get(key, 0) for key, var in pm.n.items()})
    values.update({var: counts.get(key, 0) for key, var in pm.c.items()})
    values.update({var: int(i in whole) for i, var in pm.x.items()})
    values.update({var: int(i in holds) for i, var in pm.u.items()})
    values.update({var: int(any((pm.domains[j].node, g) in holds for g in pm.domains[j].gpus)) for j, var in pm.v.items()})
    values.update({var: int(holds.get(i, set()) == {m}) for (i, m), var in pm.e.items()})
    values.update({var: int(len(holds.get(i, ())) > 1) for i, var in pm.h.items()})
    share = {m.llm: m.share for m in pm.allocation.llms}
    new: dict[Gpu, int] = defaultdict(int)  # units of replicas that keep no candidate
    for (i, m), count in counts.items():
        new[i] += share[m] * count
    for q, var in sorted(pm.k.items()):
        cand = pm.candidates[q]
        key = (cand.llm, cand.node, cand.gpus)
        values[var] = int(spots.get(key, 0) > 0)
        spots[key] -= values[var]
        for g in cand.gpus:
            new[(cand.node, g)] -= share[cand.llm] * values[var]
    values.update({var: max(0, new.get(i, 0) - pm.now[i]) for i, var in pm.o.items()})
    return values


# ---------------------------------------------------------------------------------------------
# solve and decode


@dataclass(frozen=True)
class StageOutcome:
    name: str
    status: str  # optimal | feasible | unknown | infeasible
    value: int | None  # the reported value (free counts, moved or shared ...)
    bound: int | None  # the best bound on it


@dataclass(frozen=True)
class CpsatOutcome:
    placement: Placement | None
    stages: tuple[StageOutcome, ...]
    status: str  # optimal (every stage proven) | feasible | infeasible | unknown (no placement in time)
    wall_time_s: float


def solve_placement(
    pm: PlacementModel,
    time_limit_s: float,
    workers: int = 1,
    hint: Placement | None = None,
    deadline: float | None = None,
    current: Placement | None = None,
    polish: bool = True,
    parameters: tuple[tuple[str, int | float], ...] = (),
) -> CpsatOutcome:
    """Solve the stages in turn, each fixed at its optimum before the next; a stage that hits the
    time limit ends the search. Every placement met (the hint, each stage's solution) is polished
    domain by domain (`Polisher`) and kept in a pool; each stage starts from the pool's best
    placement that attains the optima fixed so far, and the pool's lexicographically best
    placement is returned, so the result is never worse than the hint. `parameters`: CP-SAT
    parameters of every solve (PlacementSettings.solver_parameters)."""
    start = time.perf_counter()
    deadline = deadline if deadline is not None else start + time_limit_s
    polisher = None
    if polish:
        polisher = Polisher(pm, deadline, parameters=parameters)
        if any(name == "max_deterministic_time" for name, _ in parameters):
            polisher.per_domain_s = math.inf  # each domain's solve is stopped by the deterministic limit

    pool: list[tuple[tuple, Placement]] = []

    def remember(placement: Placement) -> None:
        if polisher is not None:
            placement = polisher(placement)
        objective = evaluate(pm.cluster, pm.allocation, placement, current)
        pool.append((tuple(getattr(objective, stage.name) for stage in pm.stages), placement))

    if hint is not None:
        remember(hint)
    if polish:  # a second start aimed at the objective (not for re-planning: it ignores candidates)
        packed = first_fit_placement(pm.cluster, pm.allocation) if current is None else None
        if packed is not None:
            remember(packed)
    outcomes: list[StageOutcome] = []
    fixed: list[int] = []  # reported optimum of each stage solved so far
    status = "optimal"
    for index, stage in enumerate(pm.stages):
        if isinstance(stage.expr, int):  # nothing to decide in this stage
            value = stage.offset + stage.sign * stage.expr
            outcomes.append(StageOutcome(stage.name, "optimal", value, value))
            fixed.append(value)
            continue
        usable = [(values, p) for values, p in pool if list(values[:index]) == fixed]
        seed = min(usable, key=lambda item: stage.sign * item[0][index], default=(None, None))[1]
        values = hint_values(pm, canonical(pm, seed)) if seed is not None else None
        result, solver = _solve_once(pm, stage, deadline - time.perf_counter(), workers, values, parameters)
        if result == cp_model.MODEL_INVALID:
            raise RuntimeError(f"internal error: invalid placement model ({pm.model.validate()})")
        if result == cp_model.INFEASIBLE:
            outcomes.append(StageOutcome(stage.name, "infeasible", None, None))
            return CpsatOutcome(None, tuple(outcomes), "infeasible", time.perf_counter() - start)
        if result not in (cp_model.OPTIMAL, cp_model.FEASIBLE):  # the time limit before a solution
            outcomes.append(StageOutcome(stage.name, "unknown", None, None))
            status = "unknown" if not pool else "feasible"
            break
        # the minimised expression is integer, so its bound rounds up
        bound = stage.offset + stage.sign * math.ceil(solver.best_objective_bound - 1e-6)
        remember(decode(pm, solver))
        optimum = stage.offset + stage.sign * int(round(solver.objective_value))
        outcomes.append(StageOutcome(stage.name, STATUS_NAMES[result], optimum, bound))
        if result != cp_model.OPTIMAL:
            status = "feasible"
            break
        pm.model.add(stage.expr <= int(round(solver.objective_value)))
        fixed.append(optimum)
    if not pool:
        return CpsatOutcome(None, tuple(outcomes), status, time.perf_counter() - start)
    signs = [stage.sign for stage in pm.stages]
    best_values, best = min(pool, key=lambda item: tuple(s * v for s, v in zip(signs, item[0])))
    # report the values of the placement returned (polishing may have improved the last stage)
    outcomes = [
        StageOutcome(o.name, o.status, best_values[k], o.bound) if o.value is not None else o for k, o in enumerate(outcomes)
    ]
    return CpsatOutcome(best, tuple(outcomes), status, time.perf_counter() - start)


@dataclass
class Polisher:
    """Re-arrange each NVLink domain's replicas over its GPUs, exactly, for the fewest used GPUs and
    then the fewest shared GPUs, keeping what each domain holds. The objective is a sum over domains,
    so this never makes a placement worse; identical (free units, contents) pairs are solved once.
    Re-planning, a domain's solve also gets the units the current placement holds on its GPUs and
    minimises the occupied units first (a sum over GPUs too), so those never grow. Domains with keep
    candidates, and domains already at their lower bounds (used GPUs = whole shards + the
    fractional units over F, nothing shared, no occupied units past what the domain's units free
    now force), are left alone."""

    pm: PlacementModel
    deadline: float
    per_domain_s: float = 0.5
    memo: dict = field(default_factory=dict)
    parameters: tuple[tuple[str, int | float], ...] = ()  # CP-SAT parameters of each domain's solve

    def __call__(self, placement: Placement) -> Placement:
        cluster = self.pm.cluster
        domain_of = {(d.node, g): j for j, d in enumerate(self.pm.domains) for g in d.gpus}
        frozen = {c.domain for c in self.pm.candidates}
        groups: dict[int, list[ReplicaPlacement]] = defaultdict(list)
        for rp in placement.replicas:
            groups[domain_of[(rp.node, rp.shards[0].gpu)]].append(rp)
        spots: list[Spot] = []
        for j, replicas in sorted(groups.items()):
            domain = self.pm.domains[j]
            arranged = None
            if j not in frozen and self._improvable(domain, replicas) and time.perf_counter() < self.deadline:
                arranged = self._arrange(domain, replicas)
            if arranged is None:
                spots += [Spot(rp.llm, rp.node, tuple(s.gpu for s in rp.shards), rp.shards[0].units, rp.replica) for rp in replicas]
            else:
                spots += [Spot(m, domain.node, tuple(domain.gpus[k] for k in local), share) for m, local, share in arranged]
        return number_replicas(cluster, spots)

    def _improvable(self, domain: Domain, replicas: list[ReplicaPlacement]) -> bool:
        f = self.pm.cluster.fractions_per_gpu
        free = {g: self.pm.cluster.free_units(domain.node, g) for g in domain.gpus}
        holds: dict[int, set[str]] = defaultdict(set)
        load: dict[int, int] = defaultdict(int)
        whole = fractional = 0
        for rp in replicas:
            for s in rp.shards:
                holds[s.gpu].add(rp.llm)
                load[s.gpu] += s.units
                whole += s.units == f
                fractional += s.units if s.units < f else 0
        spare = sum(units for units in free.values() if units < f)  # room on reserved GPUs
        lower = whole + -(-max(0, fractional - spare) // f)
        used = sum(1 for g in holds if free[g] == f)
        # occupied units (no replica here is kept: such domains are frozen): at least the domain's
        # new units past its units free now
        now = {g: self.pm.now.get((domain.node, g), free[g]) for g in domain.gpus}
        occupied = sum(max(0, load[g] - now[g]) for g in domain.gpus)
        least_occupied = max(0, sum(load.values()) - sum(now.values()))
        return used > lower or any(len(llms) > 1 for llms in holds.values()) or occupied > least_occupied

    def _arrange(self, domain: Domain, replicas: list[ReplicaPlacement]):
        """(llm, local GPU indices, share) of each replica in the best arrangement, or None."""
        frees = tuple(self.pm.cluster.free_units(domain.node, g) for g in domain.gpus)
        counts: dict[str, int] = defaultdict(int)
        for rp in replicas:
            counts[rp.llm] += 1
        helds = tuple(self.pm.held.get((domain.node, g), 0) for g in domain.gpus)
        key = (domain.gpu_type, frees, helds, tuple(sorted(counts.items())))
        if key not in self.memo:
            self.memo[key] = self._solve(domain, replicas, frees, helds, counts)
        return self.memo[key]

    def _solve(self, domain: Domain, replicas, frees, helds, counts):
        from scepsy.models.instance.instance import Node

        f = self.pm.cluster.fractions_per_gpu
        local = {g: k for k, g in enumerate(domain.gpus)}
        node = Node("d", domain.gpu_type, domain.size, (tuple(range(domain.size)),))
        reserved = {("d", k): f - units for k, units in enumerate(frees) if units < f}
        sub_cluster = Cluster(f, self.pm.cluster.gpu_types, (node,), reserved)
        shapes = {m.llm: m for m in self.pm.allocation.llms}
        sub_allocation = Allocation(f, tuple(
            LlmAllocation(m, shapes[m].gpu_type, shapes[m].tp, shapes[m].share, count) for m, count in sorted(counts.items())
        ))
        sub_hint = number_replicas(
            sub_cluster, [Spot(rp.llm, "d", tuple(sorted(local[s.gpu] for s in rp.shards)), rp.shards[0].units) for rp in replicas]
        )
        # the units held now, as one stand-in replica per GPU of an LLM the allocation does not have:
        # it is no keep candidate (a domain with candidates is never polished) and holds the units
        sub_current = None
        if self.pm.replanning:
            sub_current = Placement(f, tuple(
                ReplicaPlacement("", k, "d", (Shard(k, units),)) for k, units in enumerate(helds) if units > 0
            ))
        limit = min(self.per_domain_s, self.deadline - time.perf_counter())
        if limit <= 0:
            return None
        sub = build_placement_model(sub_cluster, sub_allocation, sub_current)
        outcome = solve_placement(sub, limit, 1, sub_hint, current=sub_current, polish=False, parameters=self.parameters)
        if outcome.placement is None:
            return None
        return [(rp.llm, tuple(s.gpu for s in rp.shards), rp.shards[0].units) for rp in outcome.placement.replicas]


def _solve_once(pm: PlacementModel, stage: Stage, time_limit_s: float, workers: int, hint,
                parameters: tuple[tuple[str, int | float], ...] = ()):
    pm.model.clear_objective()
    pm.model.minimize(stage.expr)
    pm.model.clear_hints()
    for var, value in (hint or {}).items():
        pm.model.add_hint(var, value)
    # measured on bench/placement_scaling.py: the full LP (all constraints, added up front) gives the
    # stage bounds; presolve probing costs seconds on large clusters and buys nothing here
    solver = cpsat_solver(time_limit_s, workers, **{"linearization_level": 2, "add_lp_constraints_lazily": False,
                                                    "cp_model_probing_level": 0, **dict(parameters)})
    return solver.solve(pm.model), solver


def decode(pm: PlacementModel, solver: cp_model.CpSolver) -> Placement:
    """Counts -> replicas (module docstring; placement/feasibility/counts.py decode_counts)."""
    share = {m.llm: m.share for m in pm.allocation.llms}
    spots = [
        Spot(spot.key, spot.node, spot.gpus, share[spot.key], pm.candidates[pm.kept.index(spot.kept)].replica if spot.kept else None)
        for spot in decode_counts(pm.counts, solver.value, pm.kept)
    ]
    return number_replicas(pm.cluster, spots)
