"""The one placement validator: every problem of a placement on a cluster, entry by entry.

Every placement scepsy writes, reads back or deploys is checked here: the placement step checks its
own result (placement/place.py), `scepsy manifests` the plan it realises (k8s/plan_input.py) and
`--current` the placement that runs now (models/plan/document.py). Three levels:

* always (what any running placement is): each entry's node is in the cluster, its GPUs exist and
  are distinct, its shards are of one size, no (llm, replica) is listed twice, and no GPU holds
  more than a whole GPU of shards;
* with an `allocation`: each replica of an LLM it lists has that LLM's shape, i.e. the gpu type of
  its node, `tp` shards, `share` units each;
* `complete` (a plan's placement): exactly the allocation's replicas 0..d-1, each within one NVLink
  domain, and no GPU holds more than its free units (reservations count: `Cluster.free_units`).

Each problem names its entry (an index into `placement.replicas`, as in a plan JSON's `placement`
list) and the field, so a reader can say which line of the file to fix. Linear in the placement.
"""

from __future__ import annotations

from dataclasses import dataclass

from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Cluster


@dataclass(frozen=True)
class PlacementProblem:
    """One problem: `entry` indexes the placement's replicas (None: the placement as a whole),
    `field` is within the entry (`node`, `shards`, `shards[1].gpu`; None: the entry itself)."""

    entry: int | None
    field: str | None
    text: str

    def where(self, section: str = "placement") -> str:
        """The field path in a plan document: `placement[3].shards[1].gpu`."""
        if self.entry is None:
            return section
        return f"{section}[{self.entry}]" + (f".{self.field}" if self.field else "")


def placement_problems(cluster: Cluster, placement: Placement, allocation: Allocation | None = None,
                       complete: bool = True) -> list[PlacementProblem]:
    """Every problem of `placement` on `cluster` (module docstring; empty: valid). `complete`
    needs an allocation."""
    f = cluster.fractions_per_gpu
    shapes = {c.llm: c for c in allocation.llms} if allocation is not None else {}
    nodes = {n.name: n for n in cluster.nodes}
    problems: list[PlacementProblem] = []
    seen: dict[tuple[str, int], int] = {}
    loads: dict[tuple[str, int], list[tuple[int, int]]] = {}  # (node, gpu) -> (entry, units): GPUs in use only
    for i, rp in enumerate(placement.replicas):
        key = (rp.llm, rp.replica)
        name = f"replica {key}"

        def problem(field: str | None, text: str, entry: int = i) -> None:
            problems.append(PlacementProblem(entry, field, text))

        if key in seen:
            problem("replica", f"{name} placed twice (also placement entry {seen[key]})")
        seen.setdefault(key, i)
        choice = shapes.get(rp.llm)
        if complete and (choice is None or not 0 <= rp.replica < choice.replicas):
            problem("replica", f"{name} is not in the allocation")
            continue
        node = nodes.get(rp.node)
        if node is None:
            problem("node", f"{name} on unknown node {rp.node}")
            continue
        if not rp.shards:
            problem("shards", f"{name} has no shards")
            continue
        if choice is not None and node.gpu_type != choice.gpu_type:
            problem("node", f"{name} needs {choice.gpu_type} but {rp.node} has {node.gpu_type}")
        units = choice.share if choice is not None else rp.shards[0].units
        for s, shard in enumerate(rp.shards):
            if not 0 <= shard.gpu < node.gpus:
                problem(f"shards[{s}].gpu", f"{name} on missing GPU {rp.node}/{shard.gpu} (node {rp.node} has GPUs 0..{node.gpus - 1})")
                continue
            if shard.units != units:
                expected = "its llm's share" if choice is not None else "its first shard's"
                problem(f"shards[{s}].fraction", f"{name} shard has {shard.units} units, expected {units} ({expected})")
            loads.setdefault((rp.node, shard.gpu), []).append((i, shard.units))
        gpus = [s.gpu for s in rp.shards]
        if choice is not None and len(gpus) != choice.tp:
            problem("shards", f"{name} needs {choice.tp} distinct GPUs (its tp), got {gpus}")
        elif len(set(gpus)) != len(gpus):
            problem("shards", f"{name} needs {len(gpus)} distinct GPUs, got {gpus}")
        if complete and not any(set(gpus) <= set(d) for d in node.domains):
            problem("shards", f"{name} spans NVLink domains on {rp.node}: {gpus}")
    if complete and allocation is not None:
        for choice in allocation.llms:
            for r in range(choice.replicas):
                if (choice.llm, r) not in seen:
                    problems.append(PlacementProblem(None, None, f"replica {(choice.llm, r)} not placed"))
    order = {n.name: k for k, n in enumerate(cluster.nodes)}
    for gpu in sorted(loads, key=lambda g: (order[g[0]], g[1])):  # in the cluster's order
        used = sum(units for _, units in loads[gpu])
        room = cluster.free_units(*gpu) if complete else f
        if used > room:
            entries = [entry for entry, _ in loads[gpu]]
            where = f"placement entries {', '.join(map(str, entries))}" if len(entries) > 1 else f"placement entry {entries[0]}"
            text = f"GPU {gpu[0]}/{gpu[1]} holds {used} units ({used / f:g} GPU, {where}) but has {room} free"
            problems.append(PlacementProblem(entries[-1], "shards", text))
    return problems


def validate_placement(cluster: Cluster, allocation: Allocation, placement: Placement) -> list[str]:
    """Independent check of a plan's placement: every problem as a sentence (empty list: valid)."""
    return [p.text for p in placement_problems(cluster, placement, allocation)]
