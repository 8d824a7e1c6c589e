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

from dataclasses import asdict, dataclass

from scepsy.models.instance.allocation import Placement
from scepsy.models.instance.instance import Cluster


@dataclass(frozen=True)
class GpuTypeFragmentation:
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
        out = asdict(self)
        out["free_capacity_gpus"] = round(self.free_capacity_gpus, 9)
        out["stranded_capacity_gpus"] = round(self.stranded_capacity_gpus, 9)
        return out


def free_units_after(cluster: Cluster, placement: Placement | None) -> dict[tuple[str, int], int]:
    """(node, gpu) -> units still free after the reservations and the placement."""
    free = {(n.name, g): cluster.free_units(n.name, g) for n in cluster.nodes for g in range(n.gpus)}
    for replica in placement.replicas if placement is not None else ():
        for shard in replica.shards:
            free[(replica.node, shard.gpu)] -= shard.units
    return free


def fragmentation_report(cluster: Cluster, placement: Placement | None) -> tuple[GpuTypeFragmentation, ...]:
    """The report above, one entry per gpu type of the cluster, sorted by gpu type."""
    f = cluster.fractions_per_gpu
    half = (f + 1) // 2
    free = free_units_after(cluster, placement)
    report = []
    for gpu_type in cluster.used_gpu_types():
        nodes = [n for n in cluster.nodes if n.gpu_type == gpu_type]
        units = [free[(n.name, g)] for n in nodes for g in range(n.gpus)]
        domains = [[free[(n.name, g)] for g in d] for n in nodes for d in n.domains]
        report.append(
            GpuTypeFragmentation(
                gpu_type=gpu_type,
                gpus=len(units),
                free_gpus=sum(u == f for u in units),
                domains=len(domains),
                free_domains=sum(all(u == f for u in d) for d in domains),
                free_capacity_gpus=sum(units) / f,
                stranded_capacity_gpus=sum(u for u in units if u < f) / f,
                largest_tp_whole_gpu=max((sum(u == f for u in d) for d in domains), default=0),
                largest_tp_half_gpu=max((sum(u >= half for u in d) for d in domains), default=0),
            )
        )
    return tuple(report)
