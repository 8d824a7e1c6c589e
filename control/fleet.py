"""The GPUs that are there: lost nodes and lost GPUs read from the cluster's Node objects, and the
instance the planner then plans on (its cluster shrunk to what is there).

A node of the instance is lost when the API has no Node of its name (the manifests pin replicas
by the `kubernetes.io/hostname` label, so that label names it, else `metadata.name`), when its
`Ready` condition is not "True" (False: the kubelet reports it unhealthy; Unknown: the node
controller stopped hearing from it), or when it is cordoned (`spec.unschedulable`: it is being
drained, and no new replica can start on it).

A GPU is lost when the device plugin reports it unhealthy: the kubelet counts every device the
plugin registered in `status.capacity` and only the healthy ones in `status.allocatable`
(kubelet's device manager, `GetCapacity`). Each GPU contributes the same number of devices (one;
the sharing replicas of MPS or time-slicing; HAMi's split count), so a node of `gpus` GPUs has
lost ceil(gpus * (capacity - allocatable) / capacity) of them. The count does not say which: the
GPUs no running replica uses count as lost first, highest index first (the planner then keeps
the replicas that run where they are where it can). A node without the resource in its capacity
(a DRA driver publishes ResourceSlices instead) keeps the instance's GPUs. Where no Node is named
like any of the instance's nodes, the instance names them otherwise: nothing is read as lost, and
the controller says so (losing every node at once would leave no API to ask).

A replica whose pod stays Pending because the scheduler cannot place it (PodScheduled False:
Unschedulable, e.g. Insufficient nvidia.com/gpu) holds no capacity, and the share units the plan
gave it on its GPUs are not to be had: they are blocked (reserved at the replica's share on each of
its GPUs, so a replica that runs beside it stays), and no new replica is planned there.

The planner plans around what is lost through the cluster's reserved units: every GPU of a lost
node, and every lost GPU, is reserved whole (models/instance/instance.py `reserved_units`), so no
plan puts a replica there; the node names stay, so the replicas that still run there are read as
before (and count as capacity only while they are Ready).
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from scepsy.models.instance.instance import Instance

GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's and HAMi's resource
HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class Fleet:
    """What is lost of the instance's cluster: node -> why, node -> lost GPU indices."""

    lost_nodes: Mapping[str, str] = field(default_factory=dict)
    lost_gpus: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    unmatched: bool = False  # no Node has a name of the instance's nodes: nothing is read as lost
    blocked_units: Mapping[tuple[str, int], int] = field(default_factory=dict)  # (node, GPU) -> units of unschedulable replicas

    @property
    def whole(self) -> bool:
        return not self.lost_nodes and not self.lost_gpus and not self.blocked_units

    def document(self) -> dict:
        blocked = {f"{node}/{gpu}": units for (node, gpu), units in sorted(self.blocked_units.items())}
        if self.unmatched:
            return {"unmatched": True, **({"blocked_units": blocked} if blocked else {})}
        return {"lost_nodes": dict(sorted(self.lost_nodes.items())),
                "lost_gpus": {node: list(gpus) for node, gpus in sorted(self.lost_gpus.items())},
                **({"blocked_units": blocked} if blocked else {})}

    def text(self) -> str:
        parts = [f"node {node} ({why})" for node, why in sorted(self.lost_nodes.items())]
        parts += [f"GPU {','.join(map(str, gpus))} of {node}" for node, gpus in sorted(self.lost_gpus.items())]
        parts += [f"{units} units of GPU {gpu} of {node} (unschedulable)" for (node, gpu), units in sorted(self.blocked_units.items())]
        if self.unmatched:
            head = "no Node is named like the instance's nodes (kubernetes.io/hostname): planning on the instance's cluster"
            return "; ".join([head] + parts[len(parts) - len(self.blocked_units):])
        return "; ".join(parts) if parts else "nothing lost"


def _quantity(value: object) -> int | None:
    """A device count of a Node's capacity or allocatable (a plain integer string)."""
    try:
        return int(str(value))
    except ValueError:
        return None


def _why_lost(node: dict) -> str | None:
    spec, status = node.get("spec") or {}, node.get("status") or {}
    if spec.get("unschedulable"):
        return "cordoned"
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready is None:
        return "no Ready condition"
    if ready.get("status") != "True":
        reason = ready.get("reason") or ("not ready" if ready.get("status") == "False" else "unreachable")
        return f"Ready is {ready.get('status')}: {reason}"
    return None


def _lost_count(node: dict, gpus: int) -> int:
    status = node.get("status") or {}
    capacity = _quantity((status.get("capacity") or {}).get(GPU_RESOURCE, "0"))
    allocatable = _quantity((status.get("allocatable") or {}).get(GPU_RESOURCE, "0"))
    if not capacity or capacity <= 0 or allocatable is None or allocatable >= capacity:
        return 0
    return min(gpus, math.ceil(gpus * (capacity - max(allocatable, 0)) / capacity))


def read_fleet(instance: Instance, nodes: Iterable[dict], busy: Collection[tuple[str, int]] = (),
               blocked: Mapping[tuple[str, int], int] | None = None) -> Fleet:
    """The lost nodes and GPUs of the instance's cluster, from the API's Node objects (`busy`:
    (node, GPU) that running replicas use; `blocked`: (node, GPU) -> the share units of replicas
    the scheduler cannot place there; module docstring)."""
    blocked_units = {key: units for key, units in sorted((blocked or {}).items()) if units > 0}
    by_name: dict[str, dict] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        name = (meta.get("labels") or {}).get(HOSTNAME_LABEL) or meta.get("name")
        if name:
            by_name[str(name)] = node
    if not any(spec.name in by_name for spec in instance.cluster.nodes):
        return Fleet(unmatched=True, blocked_units=blocked_units)  # another naming, not every node lost at once: shrinking to nothing would stop all
    lost_nodes: dict[str, str] = {}
    lost_gpus: dict[str, tuple[int, ...]] = {}
    for spec in instance.cluster.nodes:
        found = by_name.get(spec.name)
        if found is None:
            lost_nodes[spec.name] = "no such Node"
            continue
        why = _why_lost(found)
        if why is not None:
            lost_nodes[spec.name] = why
            continue
        count = _lost_count(found, spec.gpus)
        if count:
            order = sorted(range(spec.gpus), key=lambda g: ((spec.name, g) in busy, -g))
            lost_gpus[spec.name] = tuple(sorted(order[:count]))
    return Fleet(lost_nodes, lost_gpus, blocked_units=blocked_units)


def shrink(instance: Instance, fleet: Fleet) -> Instance:
    """The instance whose cluster has every lost GPU reserved whole (unchanged when nothing is lost)."""
    if fleet.whole:
        return instance
    cluster = instance.cluster
    reserved = dict(cluster.reserved_units)
    for node in cluster.nodes:
        gone = range(node.gpus) if node.name in fleet.lost_nodes else fleet.lost_gpus.get(node.name, ())
        for gpu in gone:
            reserved[(node.name, gpu)] = cluster.fractions_per_gpu
    for key, units in fleet.blocked_units.items():
        reserved[key] = min(reserved.get(key, 0) + units, cluster.fractions_per_gpu)
    return replace(instance, cluster=replace(cluster, reserved_units=reserved))
