"""GPU sharing backends: how a replica's placed GPU shares become pod fields and cluster objects.

For a replica with `tp` shards of share s = units/F on GPUs G of node n (GPU memory M GiB):

- `hami` (HAMi vGPU): `nvidia.com/gpu: tp`, `nvidia.com/gpucores: round(100 s)` and
  `nvidia.com/gpumem: floor(1024 M s)` MiB per GPU (`nvidia.com/gpumem-percentage: 100` for a whole
  GPU, since the nominal memory_gib can exceed what the device reports), the pod annotation
  `nvidia.com/use-gpuuuid` with the UUIDs of G when the cluster file lists them, and
  `schedulerName: hami-scheduler`. HAMi's in-container hook reports the slice as the device's total
  memory, so the engine sees its slice as a whole GPU.
- `dra-mps` (NVIDIA DRA driver, MPS): the NVIDIA DRA driver realises MPS sharing by letting several
  pods reference one ResourceClaim (one MPS control daemon per claim); it does not allow MPS on
  claims that share a device through consumable capacity, and one process cannot talk to two MPS
  daemons. So the replicas are grouped by the GPUs they share (connected components of "shares a
  GPU with", per node) and each group gets one ResourceClaim over exactly its GPUs (selected by UUID
  through CEL when known), with `sharing.strategy: MPS` whose `defaultActiveThreadPercentage` and
  `defaultPinnedDeviceMemoryLimit` are the largest share in the group (a ceiling); each replica then
  narrows itself to its own share with the MPS client variables CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
  and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT and to its own GPUs with CUDA_VISIBLE_DEVICES. Under MPS the
  engine still sees the whole device's memory.
- `device-plugin-mps` (NVIDIA k8s-device-plugin, MPS): every GPU of a node is split into N equal
  replicas (1/N of memory and compute each); accepted only if every shard on a node has the same
  share s and N = 1/s is an integer; a TP > 1 replica needs whole GPUs (the plugin hands out one
  replica per request and cannot promise distinct GPUs). The node's plugin config is emitted as a
  key of one ConfigMap for the plugin's namespace.
- `none`: the plain device plugin, whole GPUs only (`nvidia.com/gpu: tp`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import yaml

from scepsy.models.errors import InputError
from scepsy.models.instance.allocation import ReplicaPlacement

from . import names
from .plan_input import PlacedPlan

BACKENDS = ("hami", "dra-mps", "device-plugin-mps", "none")
HAMI_SCHEDULER = "hami-scheduler"
DRA_DRIVER = "gpu.nvidia.com"
DRA_DEVICE_CLASS = "gpu.nvidia.com"
DRA_CLAIM_REQUEST = "gpus"
MIN_DRA_KUBERNETES = (1, 32)  # the NVIDIA DRA driver needs structured parameters (resource.k8s.io/v1beta1+)
DEVICE_PLUGIN_CONFIGMAP = "scepsy-device-plugin-config"


@dataclass
class GpuAccess:
    """What one replica's pod needs to get its placed GPU shares."""

    limits: dict[str, int] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    env: list[dict] = field(default_factory=list)
    scheduler_name: str | None = None
    claim: str | None = None  # the shared ResourceClaim (dra-mps)
    engine_sees_slice: bool = False  # the engine's view of "total GPU memory" is its slice


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


def _slice_mib(plan: PlacedPlan, replica: ReplicaPlacement) -> int:
    return math.floor(plan.gpu_memory_gib(replica.llm) * 1024 * _share(plan, replica) + 1e-9)


def _percent(share: float) -> int:
    return max(1, round(100 * share))


def _hami(plan: PlacedPlan) -> SharingResult:
    access = {}
    for r in plan.replicas:
        share = _share(plan, r)
        limits = {"nvidia.com/gpu": len(r.shards), "nvidia.com/gpucores": _percent(share)}
        if plan.llm(r.llm).share == plan.fractions_per_gpu:
            limits["nvidia.com/gpumem-percentage"] = 100
        else:
            limits["nvidia.com/gpumem"] = _slice_mib(plan, r)
        uuids = _uuids(plan, r.node, r.gpus)
        annotations = {"nvidia.com/use-gpuuuid": ",".join(uuids)} if uuids else {}
        access[(r.llm, r.replica)] = GpuAccess(limits, annotations, [], HAMI_SCHEDULER, None, True)
    return SharingResult(access, [])


def _none(plan: PlacedPlan) -> SharingResult:
    fractional = [r for r in plan.replicas if plan.llm(r.llm).share != plan.fractions_per_gpu]
    if fractional:
        r = fractional[0]
        raise InputError(
            plan.source,
            f"llms ({r.llm}).fraction",
            f"--gpu-sharing none gives whole GPUs only, but {r.llm} gets {_share(plan, r):g} of a GPU",
            "use --gpu-sharing hami (default) or dra-mps, or plan with whole GPUs only",
        )
    access = {(r.llm, r.replica): GpuAccess({"nvidia.com/gpu": len(r.shards)}) for r in plan.replicas}
    return SharingResult(access, [])


def _device_plugin_config(replicas_per_gpu: int) -> str:
    config: dict = {"version": "v1", "flags": {"migStrategy": "none"}}
    if replicas_per_gpu > 1:
        resources = [{"name": "nvidia.com/gpu", "replicas": replicas_per_gpu}]
        config["sharing"] = {"mps": {"renameByDefault": False, "resources": resources}}
    return yaml.safe_dump(config, sort_keys=True, default_flow_style=False)


def _device_plugin_mps(plan: PlacedPlan, namespace: str) -> SharingResult:
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
                "use --gpu-sharing hami or dra-mps, which enforce unequal shares",
            )
        (share,) = shares
        if f % share:
            raise InputError(
                plan.source,
                f"placement (node {node})",
                f"device-plugin MPS gives 1/N of a GPU, but node {node} holds shares of {share / f:g}, not 1/N",
                "use --gpu-sharing hami or dra-mps, or plan with shares of 1/N",
            )
        replicas_per_gpu[node] = f // share
    access = {}
    for r in plan.replicas:
        n = replicas_per_gpu[r.node]
        if n > 1 and len(r.shards) > 1:
            raise InputError(
                plan.source,
                f"llms ({r.llm}).tp",
                f"{r.llm} has tp {len(r.shards)} on shared GPUs; device-plugin MPS hands one GPU replica per request and cannot place shards on distinct GPUs",
                "use --gpu-sharing hami or dra-mps",
            )
        access[(r.llm, r.replica)] = GpuAccess({"nvidia.com/gpu": len(r.shards)})
    data = {node: _device_plugin_config(n) for node, n in sorted(replicas_per_gpu.items())}
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": DEVICE_PLUGIN_CONFIGMAP,
            "namespace": namespace,
            "labels": names.labels("nvidia-device-plugin", DEVICE_PLUGIN_CONFIGMAP, "gpu-sharing"),
            "annotations": {
                "scepsy.io/usage": "install the NVIDIA device plugin with config.name="
                + DEVICE_PLUGIN_CONFIGMAP
                + " and label every node: nvidia.com/device-plugin.config=<node name>",
            },
        },
        "data": data,
    }
    return SharingResult(access, [configmap])


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


def _dra_mps(plan: PlacedPlan, namespace: str, kubernetes_version: tuple[int, int]) -> SharingResult:
    if kubernetes_version < MIN_DRA_KUBERNETES:
        raise InputError(
            None,
            "--kubernetes-version",
            f"the NVIDIA DRA driver needs Kubernetes >= {MIN_DRA_KUBERNETES[0]}.{MIN_DRA_KUBERNETES[1]}",
            "target a newer cluster or use --gpu-sharing hami",
        )
    api_version = resource_api_version(kubernetes_version)
    access, objects = {}, []
    counters: dict[str, int] = {}
    for node, gpus, members in _groups(plan):
        k = counters[node] = counters.get(node, -1) + 1
        claim = f"gpus-{names.dns_label(node)}-{k}"
        uuids = _uuids(plan, node, gpus)
        ceiling = max(members, key=lambda r: plan.llm(r.llm).share)
        mps = {
            "defaultActiveThreadPercentage": _percent(_share(plan, ceiling)),
            "defaultPinnedDeviceMemoryLimit": f"{_slice_mib(plan, ceiling)}Mi",
        }
        parameters = {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "MPS", "mpsConfig": mps},
        }
        objects.append(
            {
                "apiVersion": api_version,
                "kind": "ResourceClaim",
                "metadata": {
                    "name": claim,
                    "namespace": namespace,
                    "labels": names.labels("nvidia-dra-driver-gpu", claim, "gpu-sharing"),
                    "annotations": {"scepsy.io/node": node, "scepsy.io/gpus": ",".join(map(str, gpus))},
                },
                "spec": {
                    "devices": {
                        "requests": [_claim_request(api_version, len(gpus), uuids)],
                        "config": [{"requests": [DRA_CLAIM_REQUEST], "opaque": {"driver": DRA_DRIVER, "parameters": parameters}}],
                    }
                },
            }
        )
        position = {g: i for i, g in enumerate(gpus)}
        for r in members:
            share = _share(plan, r)
            own = _uuids(plan, r.node, r.gpus) or [str(position[g]) for g in r.gpus]
            limit = ",".join(f"{i}={_slice_mib(plan, r)}M" for i in range(len(r.gpus)))
            env = [
                {"name": "CUDA_VISIBLE_DEVICES", "value": ",".join(own)},
                {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": str(_percent(share))},
                {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": limit},
            ]
            access[(r.llm, r.replica)] = GpuAccess({}, {}, env, None, claim, False)
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
    raise InputError(None, "--gpu-sharing", f"unknown backend {backend!r}", f"use one of: {', '.join(BACKENDS)}")
