"""Backend-neutral data of the allocation model (planner/allocation/cpsat.py states the formulation; the MILP
backend, planner/allocation/milp.py, builds the same model): the capacity rows, the bin-packing rows, the
replica shapes of the placement counts (placement/feasibility/counts.py) and the rows of a placement cut.

Rows are lists of (coefficient, (llm, option index)) terms with a right-hand side, so each backend
only translates them into its own linear expressions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, TypeVar

from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.instance.instance import Cluster
from scepsy.placement.feasibility.counts import Group
from scepsy.placement.feasibility.packing import Shape, free_in_domains, gpu_weight_capacity, packing_weights

from scepsy.planner.allocation.options import Option, options_allocation

Term = tuple[int, tuple[str, int]]  # (coefficient, (llm, option index))


@dataclass(frozen=True)
class Row:
    """sum of terms <= rhs."""

    name: str
    terms: tuple[Term, ...]
    rhs: int


def items(options: dict[str, list[Option]]) -> list[tuple[str, int, Option]]:
    return [(m, i, o) for m, opts in options.items() for i, o in enumerate(opts)]


def chosen_allocation(fractions_per_gpu: int, options: dict[str, list[Option]],
                      is_chosen: Callable[[tuple[str, int]], bool]) -> Allocation:
    """The allocation a solved model picks: per LLM m the option o whose x[m, o] is set
    (`is_chosen` reads the backend's solution)."""
    chosen = [next(o for i, o in enumerate(opts) if is_chosen((m, i))) for m, opts in options.items()]
    return options_allocation(fractions_per_gpu, chosen)


FULL_PACKING_MAX_OPTIONS = 20_000


def capacity_rows(cluster: Cluster, options: dict[str, list[Option]]) -> list[Row]:
    """Share units of replicas with tp >= t fit the domains of size >= t, and the bin-packing
    inequalities over the same GPUs (per gpu type and TP degree in use). Beyond
    FULL_PACKING_MAX_OPTIONS options only the rows of shards above half a GPU are kept (each row
    spans every option, and large clusters have the slack that makes the others rarely bind)."""
    rows: list[Row] = []
    all_items = items(options)
    f = cluster.fractions_per_gpu
    weights = packing_weights(f)
    if len(all_items) > FULL_PACKING_MAX_OPTIONS:
        weights = [w for w in weights if max(w) == 1 and w.index(1) * 2 > f]
    for gpu_type in sorted({o.gpu_type for _, _, o in all_items}):
        for t in sorted({o.tp for _, _, o in all_items if o.gpu_type == gpu_type}):
            gpus_by_free = free_in_domains(cluster, gpu_type, t)
            inside = [(m, i, o) for m, i, o in all_items if o.gpu_type == gpu_type and o.tp >= t]
            free_units = sum(units * gpus for units, gpus in gpus_by_free.items())
            rows.append(Row(f"units[{gpu_type},tp>={t}]", tuple((o.units, (m, i)) for m, i, o in inside), free_units))
            shards = [(o.share, o.tp * o.replicas, (m, i)) for m, i, o in inside]  # read once, not per weight
            shares = sorted({share for share, _, _ in shards})
            for k, weight in enumerate(weights):
                if not any(weight[share] for share in shares):
                    continue  # no term: most weights miss every share in use (a quick test, not a scan)
                terms = tuple([(count * weight[share], key) for share, count, key in shards if weight[share]])
                if terms:
                    limit = sum(n * gpu_weight_capacity(weight, c) for c, n in gpus_by_free.items())
                    rows.append(Row(f"packing{k}[{gpu_type},tp>={t}]", terms, limit))
    return rows


def shape_groups(options: dict[str, list[Option]]) -> tuple[list[Group], dict[Shape, list[Term]]]:
    """The placement counts' groups, one per replica shape in sorted order with the most replicas an
    allocation can have of it (several LLMs may share a shape, so their largest counts add up), and
    the terms of R_k = sum_{m, o: shape k} d_o x[m, o]."""
    most: dict[Shape, int] = {}
    replicas: dict[Shape, list[Term]] = {}
    for m, opts in options.items():
        per_llm: dict[Shape, int] = {}
        for i, o in enumerate(opts):
            per_llm[o.shape] = max(per_llm.get(o.shape, 0), o.replicas)
            replicas.setdefault(o.shape, []).append((o.replicas, (m, i)))
        for shape, count in per_llm.items():
            most[shape] = most.get(shape, 0) + count
    shapes = sorted(most)
    return [Group(k, *k, most[k]) for k in shapes], {k: replicas[k] for k in shapes}


def counts_model_size(cluster: Cluster, options: dict[str, list[Option]]) -> int:
    """(GPU, shape) pairs of the placement counts: their size grows with it."""
    shapes = {o.shape for opts in options.values() for o in opts}
    return sum(cluster.gpu_count(gpu_type) for gpu_type, _, _ in shapes)


def cut_rows(options: dict[str, list[Option]], allocation: Allocation) -> list[Row]:
    """Rows R_{g,t,s} <= R*_{g,t,s} - 1 of a placement cut: at least one must hold.

    R*_{g,t,s} is the allocation's number of replicas of type g, tp t and share >= s; any allocation
    with at least as many of each needs at least as much room and is unplaceable too."""
    groups: dict[tuple[str, int], list[LlmAllocation]] = {}
    for choice in allocation.llms:
        groups.setdefault((choice.gpu_type, choice.tp), []).append(choice)
    rows = []
    for (g, t), choices in sorted(groups.items()):
        for s in sorted({c.share for c in choices}):
            required = sum(c.replicas for c in choices if c.share >= s)
            terms = tuple(
                (o.replicas, (m, i))
                for m, opts in options.items()
                for i, o in enumerate(opts)
                if o.gpu_type == g and o.tp == t and o.share >= s
            )
            rows.append(Row(f"R[{g},{t},{s}]", terms, required - 1))
    return rows


O = TypeVar("O")  # an option (any type: the rows' coefficient functions read it)


def supported_options(
    options: dict[str, list[O]], rows: list[tuple[Callable[[str, O], float], float]]
) -> dict[str, list[O]] | None:
    """The options of each LLM that some choice of one option per LLM meeting every row
    sum_m c(m, o_m) <= rhs can use, in their order; None when an LLM has none left.

    Bound propagation to a fixed point: an option stays while its coefficient plus the other
    LLMs' smallest fits the row. It removes only options that no such choice uses, so a model
    over the rest has the same solutions that meet the rows."""
    coefficient = [{(m, i): c(m, o) for m, opts in options.items() for i, o in enumerate(opts)} for c, _ in rows]
    alive = {m: list(range(len(opts))) for m, opts in options.items()}
    changed = True
    while changed:
        changed = False
        for row, (_, rhs) in zip(coefficient, rows):
            smallest = {m: min(row[(m, i)] for i in alive[m]) for m in alive}
            total = sum(smallest.values())
            for m in alive:
                fits = [i for i in alive[m] if row[(m, i)] - smallest[m] + total <= rhs]
                if not fits:
                    return None
                if len(fits) < len(alive[m]):
                    alive[m], changed = fits, True
                    least = min(row[(m, i)] for i in fits)
                    total += least - smallest[m]
                    smallest[m] = least
    return {m: [options[m][i] for i in alive[m]] for m in options}


def grid(values: list[float], resolution: float = 1e-5) -> float:
    """Integer grid from per-LLM minima: rounding |M| terms moves a sum by < resolution of its
    lower bound (planner/allocation/cpsat.py, integer scaling)."""
    positive = [v for v in values if v > 0]
    if not positive:
        return 1.0
    return resolution * sum(positive) / len(positive)
