"""What a placement leaves free: the fragmentation report that comes with every plan.

Per gpu type of the cluster, after the reservations (`cluster.reserved`) and the placement:

    gpus                    GPUs of the type
    free_gpus               GPUs with every unit free (no reservation, no shard): whole GPUs free
    domains                 NVLink domains of the type (a GPU in no listed domain is a domain of its own)
    free_domains            domains whose GPUs are all free whole GPUs
    free_capacity_gpus      free units of all GPUs of the type / F           [GPUs]
    stranded_capacity_gpus  free units on GPUs that are partly taken / F     [GPUs]
    largest_tp_whole_gpu    the largest number of free whole GPUs in one domain: the largest TP
                            degree a replica with whole-GPU shards can still get
    largest_tp_half_gpu     the same for shards of half a GPU (ceil(F/2) units, F/2 for even F)

A placement is fragmented when `stranded_capacity_gpus` is large while `largest_tp_whole_gpu` is
small: the capacity is there but not in one piece.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel, ConfigDict

from scepsy.models.instance.allocation import Placement
from scepsy.models.instance.instance import Cluster


class GpuTypeFragmentation(BaseModel):
    """One gpu type's entry (module docstring); also the `fragmentation[]` record of the plan
    document (models/plan/document.py), so it is read back as strictly as it is written."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    gpu_type: str
    gpus: int
    free_gpus: int
    domains: int
    free_domains: int
    free_capacity_gpus: float
    stranded_capacity_gpus: float
    largest_tp_whole_gpu: int
    largest_tp_half_gpu: int

    def to_json(self) -> dict:
        return self.model_dump()


def domain_counts_after(cluster: Cluster, placement: Placement | None) -> Counter[tuple[str, tuple[int, ...]]]:
    """Cluster.domain_counts after the placement: only the domains the placement touches change
    kind, so this takes time in the placement's size, not in the cluster's (a million GPUs)."""
    counts = Counter(cluster.domain_counts)
    taken: dict[tuple[str, int], int] = {}
    for replica in placement.replicas if placement is not None else ():
        for shard in replica.shards:
            taken[(replica.node, shard.gpu)] = taken.get((replica.node, shard.gpu), 0) + shard.units
    for name in sorted({node for node, _ in taken}):
        node = cluster.node(name)
        for domain in node.domains:
            if any((name, g) in taken for g in domain):
                before = tuple(cluster.free_units(name, g) for g in domain)
                counts[(node.gpu_type, before)] -= 1
                counts[(node.gpu_type, tuple(units - taken.get((name, g), 0) for g, units in zip(domain, before)))] += 1
    return +counts  # drops the kinds no domain is left of


def fragmentation_report(cluster: Cluster, placement: Placement | None) -> tuple[GpuTypeFragmentation, ...]:
    """The report above, one entry per gpu type of the cluster, sorted by gpu type (counted per
    kind of domain: linear in the placement and the kinds, not in the GPUs)."""
    f = cluster.fractions_per_gpu
    half = (f + 1) // 2
    kinds = domain_counts_after(cluster, placement)
    report = []
    for gpu_type in cluster.used_gpu_types():
        mine = [(free, count) for (kind_type, free), count in kinds.items() if kind_type == gpu_type]
        report.append(
            GpuTypeFragmentation(
                gpu_type=gpu_type,
                gpus=sum(len(free) * count for free, count in mine),
                free_gpus=sum(sum(u == f for u in free) * count for free, count in mine),
                domains=sum(count for _, count in mine),
                free_domains=sum(count for free, count in mine if all(u == f for u in free)),
                free_capacity_gpus=round(sum(sum(free) * count for free, count in mine) / f, 9),
                stranded_capacity_gpus=round(sum(sum(u for u in free if u < f) * count for free, count in mine) / f, 9),
                largest_tp_whole_gpu=max((sum(u == f for u in free) for free, _ in mine), default=0),
                largest_tp_half_gpu=max((sum(u >= half for u in free) for free, _ in mine), default=0),
            )
        )
    return tuple(report)
