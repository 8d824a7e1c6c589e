"""GPU sharing backends: how a replica's placed GPU shares become pod fields and cluster objects.

For a replica with `tp` shards of share s = units/F on GPUs G of node n, whose GPU model reports
R MiB through NVML (`catalog.reported_memory_mib`; what the sharing stacks register and divide):

- `hami` (HAMi vGPU): `nvidia.com/gpu: tp`, `nvidia.com/gpucores: round(100 s)` and
  `nvidia.com/gpumem-percentage: floor(100 s)` per GPU. HAMi turns the percentage into
  `Totalmem * p / 100` of the memory the device registered (pkg/device/nvidia/device.go, Fit), so
  shares whose percentages sum to at most 100 always fit on one GPU, whatever the nominal capacity
  (an absolute `nvidia.com/gpumem` from the nominal 80 GiB of an H100 would exceed the 81559 MiB it
  registers). With `gpu_uuids` in the cluster file the pod annotation `nvidia.com/use-gpuuuid` pins
  the shards to the planned GPUs; `schedulerName: hami-scheduler`. HAMi's in-container hook
  reports the slice as the device's total memory, so the engine sees its slice as a whole GPU.
- `dra-mps` (NVIDIA DRA driver, MPS): the NVIDIA DRA driver realises MPS sharing by letting several
  pods reference one ResourceClaim (one MPS control daemon per claim); it does not allow MPS on
  claims that share a device through consumable capacity, and one process cannot talk to two MPS
  daemons. So the replicas are grouped by the GPUs they share (connected components of "shares a
  GPU with", per node) and each group gets one ResourceClaim over exactly its GPUs (selected by UUID
  through CEL when known). Only a group whose GPUs are shared turns MPS on (`sharing.strategy:
  MPS`, an alpha driver feature that needs the GPUs in EXCLUSIVE_PROCESS mode), with
  `defaultActiveThreadPercentage` and `defaultPinnedDeviceMemoryLimit` at the largest share in the
  group (a ceiling, from the reported memory R); each replica then narrows itself to its own share
  with the MPS client variables CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT
  and to its own GPUs with CUDA_VISIBLE_DEVICES, never UUIDs (vLLM parses every entry with int()):
  ordinals of the claim's GPUs as the MPS server numbers them. The driver starts the claim's MPS
  control daemon with CUDA_VISIBLE_DEVICES = the claim's GPU UUIDs sorted as strings
  (`PreparedDeviceGroup.UUIDs()` sorts them, cmd/gpu-kubelet-plugin/prepared.go; sharing.go
  `MpsControlDaemon.Start`), and the MPS server renumbers its visible devices 0..n-1 in that order
  (NVIDIA MPS documentation, CUDA_VISIBLE_DEVICES): ordinal i is the GPU with the i-th smallest
  UUID. With the node's gpu_uuids the ordinals are exact; without them the driver picks the GPUs
  and the plan's GPUs are numbered in plan order, which keeps who shares what but not which
  physical GPU each is. A replica on whole GPUs gets a plain claim (no MPS, no variables: the pod
  sees exactly its GPUs). Under MPS the engine still sees the whole device's memory.
- `device-plugin-mps` (NVIDIA k8s-device-plugin, MPS): every GPU of a node is split into N equal
  replicas (1/N of memory and compute each); accepted only if every shard on a node has the same
  share s and N = 1/s is an integer; a TP > 1 replica needs whole GPUs (the plugin hands out one
  replica per request and cannot promise distinct GPUs). One ConfigMap for the plugin's namespace
  holds one key per distinct config (`whole`, `mps-N`) plus `default`, the config most nodes use
  (the plugin's config manager falls back to `default` for nodes without a
  `nvidia.com/device-plugin.config` label); the nodes that need another key are listed in the
  ConfigMap's annotation and in `node_labels`. The ConfigMap's namespace is emitted as a
  Namespace object too, so that the ConfigMap applies on a fresh cluster before the plugin's chart.
- `none`: the plain device plugin, whole GPUs only (`nvidia.com/gpu: tp`).

MPS clients (dra-mps groups that share GPUs, device-plugin-mps nodes with N > 1) get no `/dev/shm`
volume of their own: both stacks bind the MPS daemon's shared memory (a tmpfs the daemon's node
mounts, half the node's memory) at `/dev/shm` of every client container (device plugin
internal/plugin/mps.go `updateReponse`, `daemon.ShmDir()` = "/dev/shm"; DRA driver sharing.go
`GetCDIContainerEdits`), and a pod that mounts its own volume there cannot reach the daemon
(NVIDIA/k8s-device-plugin#805). `GpuAccess.mps_client` says which pods these are.

Pinning: only `hami` and `dra-mps` can place shards on chosen GPUs, and only by UUID (HAMi's
annotation; the DRA driver publishes no GPU index attribute). Every engine pod carries the
annotation `scepsy.io/gpu-pinning` (`uuid`, or why not), and `unpinned` lists the replicas a
hami/dra-mps deployment cannot pin because their node lists no `gpu_uuids`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import yaml

from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import ReplicaPlacement

from scepsy.k8s import names
from scepsy.k8s.plan_input import PlacedPlan

BACKENDS = ("hami", "dra-mps", "device-plugin-mps", "none")
HAMI_SCHEDULER = "hami-scheduler"
DRA_DRIVER = "gpu.nvidia.com"
DRA_DEVICE_CLASS = "gpu.nvidia.com"
DRA_CLAIM_REQUEST = "gpus"
MIN_DRA_KUBERNETES = (1, 32)  # the NVIDIA DRA driver needs structured parameters (resource.k8s.io/v1beta1+)
DEVICE_PLUGIN_CONFIGMAP = "scepsy-device-plugin-config"
DEVICE_PLUGIN_NODE_LABEL = "nvidia.com/device-plugin.config"
PINNING_BACKENDS = ("hami", "dra-mps")


PINNING_ANNOTATION = "scepsy.io/gpu-pinning"
PINNED = "uuid"


@dataclass
class GpuAccess:
    """What one replica's pod needs to get its placed GPU shares."""

    limits: dict[str, int] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    env: list[dict] = field(default_factory=list)
    scheduler_name: str | None = None
    claim: str | None = None  # the ResourceClaim (dra-mps)
    engine_sees_slice: bool = False  # the engine's view of "total GPU memory" is its slice
    slice_mib: int = 0  # GPU memory the replica really gets on each of its GPUs
    mps_client: bool = False  # the sharing stack mounts the MPS daemon's shared memory at /dev/shm


@dataclass
class SharingResult:
    access: dict[tuple[str, int], GpuAccess]  # (llm, replica) -> access
    objects: list[dict]  # extra cluster objects (ResourceClaims, device plugin ConfigMap)


def resource_api_version(kubernetes_version: tuple[int, int]) -> str:
    """resource.k8s.io version to write for a target cluster: v1beta1 (1.32), v1beta2 (1.33), v1 (1.34+)."""
    if kubernetes_version >= (1, 34):
        return "resource.k8s.io/v1"
    if kubernetes_version >= (1, 33):
        return "resource.k8s.io/v1beta2"
    return "resource.k8s.io/v1beta1"


def _uuids(plan: PlacedPlan, node: str, gpus: tuple[int, ...]) -> list[str] | None:
    uuids = plan.gpu_uuids(node)
    return [uuids[g] for g in gpus] if uuids is not None else None


def _share(plan: PlacedPlan, replica: ReplicaPlacement) -> float:
    return plan.llm(replica.llm).share / plan.fractions_per_gpu


def _whole(plan: PlacedPlan, replica: ReplicaPlacement) -> bool:
    return plan.llm(replica.llm).share == plan.fractions_per_gpu


def _slice_mib(plan: PlacedPlan, replica: ReplicaPlacement) -> int:
    """The replica's share of the memory its GPU model reports (MPS pinned limits)."""
    return math.floor(plan.gpu_reported_mib(replica.llm) * _share(plan, replica) + 1e-9)


def _percent(share: float) -> int:
    return max(1, round(100 * share))


def hami_memory_percent(share: float) -> int:
    """`nvidia.com/gpumem-percentage` of a share: rounded down, so that shares summing to at most
    one GPU sum to at most 100 %."""
    return max(1, math.floor(100 * share + 1e-9))


def _pinning(plan: PlacedPlan, replica: ReplicaPlacement, backend: str) -> str:
    if backend not in PINNING_BACKENDS:
        return f"none: {backend} cannot choose GPUs; the device plugin picks them on the pinned node"
    if plan.gpu_uuids(replica.node) is None:
        return f"none: node {replica.node} lists no gpu_uuids; run scepsy topology on it"
    return PINNED


def unpinned(plan: PlacedPlan, backend: str) -> list[ReplicaPlacement]:
    """Replicas that a backend able to pin GPUs (hami, dra-mps) cannot pin: their node lists no
    gpu_uuids in the cluster file."""
    if backend not in PINNING_BACKENDS:
        return []
    return [r for r in plan.replicas if plan.gpu_uuids(r.node) is None]


def _hami(plan: PlacedPlan) -> SharingResult:
    access = {}
    for r in plan.replicas:
        share = _share(plan, r)
        percent = hami_memory_percent(share)
        limits = {"nvidia.com/gpu": len(r.shards), "nvidia.com/gpucores": _percent(share), "nvidia.com/gpumem-percentage": percent}
        uuids = _uuids(plan, r.node, r.gpus)
        annotations = {"nvidia.com/use-gpuuuid": ",".join(uuids)} if uuids else {}
        annotations[PINNING_ANNOTATION] = _pinning(plan, r, "hami")
        slice_mib = plan.gpu_reported_mib(r.llm) * percent // 100  # HAMi: Totalmem * p / 100
        access[(r.llm, r.replica)] = GpuAccess(limits, annotations, [], HAMI_SCHEDULER, None, True, slice_mib)
    return SharingResult(access, [])


def _none(plan: PlacedPlan) -> SharingResult:
    fractional = [r for r in plan.replicas if not _whole(plan, r)]
    if fractional:
        r = fractional[0]
        raise InputError(
            plan.source,
            f"llms ({r.llm}).fraction",
            f"`gpu_sharing` none gives whole GPUs only, but {r.llm} gets {_share(plan, r):g} of a GPU",
            "use `gpu_sharing` hami (default) or dra-mps, or plan with whole GPUs only",
        )
    access = {
        (r.llm, r.replica): GpuAccess({"nvidia.com/gpu": len(r.shards)}, {PINNING_ANNOTATION: _pinning(plan, r, "none")},
                                      slice_mib=plan.gpu_reported_mib(r.llm))
        for r in plan.replicas
    }
    return SharingResult(access, [])


def _device_plugin_config(replicas_per_gpu: int) -> str:
    config: dict = {"version": "v1", "flags": {"migStrategy": "none"}}
    if replicas_per_gpu > 1:
        resources = [{"name": "nvidia.com/gpu", "replicas": replicas_per_gpu}]
        config["sharing"] = {"mps": {"renameByDefault": False, "resources": resources}}
    return yaml.safe_dump(config, sort_keys=True, default_flow_style=False)


def _config_key(replicas_per_gpu: int) -> str:
    return "whole" if replicas_per_gpu == 1 else f"mps-{replicas_per_gpu}"


def _replicas_per_gpu(plan: PlacedPlan) -> dict[str, int]:
    """N per node: every shard on the node has share 1/N (else InputError)."""
    f = plan.fractions_per_gpu
    per_node: dict[str, set[int]] = {}
    for r in plan.replicas:
        per_node.setdefault(r.node, set()).add(plan.llm(r.llm).share)
    replicas_per_gpu = {}
    for node, shares in sorted(per_node.items()):
        if len(shares) > 1:
            listed = ", ".join(f"{s / f:g}" for s in sorted(shares))
            raise InputError(
                plan.source,
                f"placement (node {node})",
                f"device-plugin MPS splits every GPU of a node into equal replicas, but node {node} holds shares {listed}",
                "use `gpu_sharing` hami or dra-mps, which enforce unequal shares",
            )
        (share,) = shares
        if f % share:
            raise InputError(
                plan.source,
                f"placement (node {node})",
                f"device-plugin MPS gives 1/N of a GPU, but node {node} holds shares of {share / f:g}, not 1/N",
                "use `gpu_sharing` hami or dra-mps, or plan with shares of 1/N",
            )
        replicas_per_gpu[node] = f // share
    return replicas_per_gpu


def device_plugin_node_labels(plan: PlacedPlan) -> dict[str, str]:
    """Node -> value of `nvidia.com/device-plugin.config` for the nodes that do not use the
    `default` key (most nodes need no label)."""
    per_node = _replicas_per_gpu(plan)
    default = _default_replicas(per_node)
    return {node: _config_key(n) for node, n in sorted(per_node.items()) if n != default}


def _default_replicas(per_node: dict[str, int]) -> int:
    """The N most nodes use (ties: the smaller N); it becomes the `default` key."""
    counts: dict[int, int] = {}
    for n in per_node.values():
        counts[n] = counts.get(n, 0) + 1
    return min(counts, key=lambda n: (-counts[n], n))


def _device_plugin_mps(plan: PlacedPlan, namespace: str) -> SharingResult:
    replicas_per_gpu = _replicas_per_gpu(plan)
    access = {}
    for r in plan.replicas:
        n = replicas_per_gpu[r.node]
        if n > 1 and len(r.shards) > 1:
            raise InputError(
                plan.source,
                f"llms ({r.llm}).tp",
                f"{r.llm} has tp {len(r.shards)} on shared GPUs; device-plugin MPS hands one GPU replica per request and cannot place shards on distinct GPUs",
                "use `gpu_sharing` hami or dra-mps",
            )
        # the plugin's MPS daemon limits each client to 1/N of the device's memory
        access[(r.llm, r.replica)] = GpuAccess({"nvidia.com/gpu": len(r.shards)}, {PINNING_ANNOTATION: _pinning(plan, r, "device-plugin-mps")},
                                               slice_mib=plan.gpu_reported_mib(r.llm) // n, mps_client=n > 1)
    default = _default_replicas(replicas_per_gpu)
    data = {"default": _device_plugin_config(default)}
    data.update({_config_key(n): _device_plugin_config(n) for n in sorted(set(replicas_per_gpu.values())) if n != default})
    labels = device_plugin_node_labels(plan)
    usage = (
        f"helm upgrade -i nvdp nvdp/nvidia-device-plugin --namespace {namespace} --set config.name={DEVICE_PLUGIN_CONFIGMAP} "
        "--set config.default=default --set gfd.enabled=true"
    )
    if labels:
        usage += "; then label: " + "; ".join(f"kubectl label node {node} {DEVICE_PLUGIN_NODE_LABEL}={key}" for node, key in labels.items())
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": DEVICE_PLUGIN_CONFIGMAP,
            "namespace": namespace,
            "labels": names.labels("nvidia-device-plugin", DEVICE_PLUGIN_CONFIGMAP, "gpu-sharing"),
            "annotations": {"scepsy.io/usage": usage},
        },
        "data": data,
    }
    namespace_object = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": namespace, "labels": names.labels("nvidia-device-plugin", namespace, "gpu-sharing")},
    }
    return SharingResult(access, [namespace_object, configmap])


def _groups(plan: PlacedPlan) -> list[tuple[str, tuple[int, ...], list[ReplicaPlacement]]]:
    """Connected components of replicas that share a GPU, per node: (node, gpus, replicas)."""
    parent: dict[tuple[str, int], tuple[str, int]] = {}

    def find(x):
        while parent.setdefault(x, x) != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for r in plan.replicas:
        first = (r.node, r.gpus[0])
        for g in r.gpus:
            parent[find((r.node, g))] = find(first)
    members: dict[tuple[str, int], list[ReplicaPlacement]] = {}
    gpus: dict[tuple[str, int], set[int]] = {}
    for r in plan.replicas:
        root = find((r.node, r.gpus[0]))
        members.setdefault(root, []).append(r)
        gpus.setdefault(root, set()).update(r.gpus)
    out = [(root[0], tuple(sorted(gpus[root])), members[root]) for root in members]
    out.sort(key=lambda g: (g[0], g[1]))
    return out


def _claim_request(api_version: str, count: int, uuids: list[str] | None) -> dict:
    device: dict = {"deviceClassName": DRA_DEVICE_CLASS, "allocationMode": "ExactCount", "count": count}
    if uuids:
        listed = ", ".join(f'"{u}"' for u in uuids)
        device["selectors"] = [{"cel": {"expression": f'device.attributes["{DRA_DRIVER}"].uuid in [{listed}]'}}]
    if api_version == "resource.k8s.io/v1beta1":
        return {"name": DRA_CLAIM_REQUEST, **device}
    return {"name": DRA_CLAIM_REQUEST, "exactly": device}


def _mps_config(plan: PlacedPlan, members: list[ReplicaPlacement]) -> list[dict]:
    """The claim's opaque GpuConfig turning MPS on, with the group's largest share as ceiling."""
    ceiling = max(members, key=lambda r: plan.llm(r.llm).share)
    mps = {
        "defaultActiveThreadPercentage": _percent(_share(plan, ceiling)),
        "defaultPinnedDeviceMemoryLimit": f"{_slice_mib(plan, ceiling)}Mi",
    }
    parameters = {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "GpuConfig", "sharing": {"strategy": "MPS", "mpsConfig": mps}}
    return [{"requests": [DRA_CLAIM_REQUEST], "opaque": {"driver": DRA_DRIVER, "parameters": parameters}}]


def mps_ordinals(claim_gpus: tuple[int, ...], uuids: list[str] | None) -> dict[int, int]:
    """Plan GPU -> the ordinal an MPS client of the claim sees it as: its rank among the claim's
    GPU UUIDs sorted as strings (the order the DRA driver gives the MPS daemon); without UUIDs the
    plan's order (the driver picks the GPUs)."""
    if uuids is None:
        return {g: i for i, g in enumerate(claim_gpus)}
    rank = {u: i for i, u in enumerate(sorted(uuids))}
    return {g: rank[u] for g, u in zip(claim_gpus, uuids)}


def _mps_client_env(plan: PlacedPlan, replica: ReplicaPlacement, ordinals: dict[int, int]) -> list[dict]:
    """A replica narrowed to its own GPUs (ordinals of the claim's MPS server) and share."""
    limit = ",".join(f"{i}={_slice_mib(plan, replica)}M" for i in range(len(replica.gpus)))
    return [
        {"name": "CUDA_VISIBLE_DEVICES", "value": ",".join(str(ordinals[g]) for g in replica.gpus)},
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": str(_percent(_share(plan, replica)))},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": limit},
    ]


def _dra_mps(plan: PlacedPlan, namespace: str, kubernetes_version: tuple[int, int]) -> SharingResult:
    if kubernetes_version < MIN_DRA_KUBERNETES:
        raise InputError(
            None,
            "kubernetes_version",
            f"the NVIDIA DRA driver needs Kubernetes >= {MIN_DRA_KUBERNETES[0]}.{MIN_DRA_KUBERNETES[1]}",
            "target a newer cluster or use `gpu_sharing` hami",
        )
    api_version = resource_api_version(kubernetes_version)
    access, objects = {}, []
    counters: dict[str, int] = {}
    for node, gpus, members in _groups(plan):
        k = counters[node] = counters.get(node, -1) + 1
        claim = f"gpus-{names.dns_label(node)}-{k}"
        shared = len(members) > 1 or not _whole(plan, members[0])
        devices: dict = {"requests": [_claim_request(api_version, len(gpus), _uuids(plan, node, gpus))]}
        if shared:
            devices["config"] = _mps_config(plan, members)
        objects.append(
            {
                "apiVersion": api_version,
                "kind": "ResourceClaim",
                "metadata": {
                    "name": claim,
                    "namespace": namespace,
                    "labels": names.labels("nvidia-dra-driver-gpu", claim, "gpu-sharing"),
                    "annotations": {"scepsy.io/node": node, "scepsy.io/gpus": ",".join(map(str, gpus)), "scepsy.io/mps": str(shared).lower()},
                },
                "spec": {"devices": devices},
            }
        )
        ordinals = mps_ordinals(gpus, _uuids(plan, node, gpus))
        for r in members:
            env = _mps_client_env(plan, r, ordinals) if shared else []
            slice_mib = _slice_mib(plan, r) if shared else plan.gpu_reported_mib(r.llm)
            annotations = {PINNING_ANNOTATION: _pinning(plan, r, "dra-mps")}
            access[(r.llm, r.replica)] = GpuAccess({}, annotations, env, None, claim, False, slice_mib, mps_client=shared)
    return SharingResult(access, objects)


def realise(plan: PlacedPlan, backend: str, namespace: str, device_plugin_namespace: str, kubernetes_version: tuple[int, int]) -> SharingResult:
    if backend == "hami":
        return _hami(plan)
    if backend == "dra-mps":
        return _dra_mps(plan, namespace, kubernetes_version)
    if backend == "device-plugin-mps":
        return _device_plugin_mps(plan, device_plugin_namespace)
    if backend == "none":
        return _none(plan)
    raise InputError(None, "gpu_sharing", f"unknown backend {backend!r}", f"use one of: {', '.join(BACKENDS)}")
