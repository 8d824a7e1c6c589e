"""Kubernetes (`scepsy manifests`, `deploy`, `status`): the manifests of a placed plan, applied and
watched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scepsy.api.plan import PathLike
from scepsy.models.arguments import check_choice
from scepsy.models.output import check_output_dir, writing

if TYPE_CHECKING:  # the k8s extra (kubernetes) is imported where it is used
    from rich.console import RenderableType

    from scepsy.k8s.apply import ApplyResult, ReplicaStatus


@dataclass(frozen=True)
class Manifests:
    """The manifests written for a placed plan (`scepsy manifests`)."""

    out: Path
    files: tuple[Path, ...]
    replicas: int  # engine replicas
    engine: str
    gpu_sharing: str
    warnings: tuple[str, ...]  # engines pinned to GPUs the plan does not name (k8s/manifests.py)


def manifests_document(written: Manifests) -> dict:
    """What `scepsy manifests --json` prints."""
    return {"out": str(written.out), "files": [p.name for p in written.files]}


def manifests_view(written: Manifests) -> str:
    """What `scepsy manifests` prints: one line."""
    return (f"wrote {len(written.files)} files to {written.out} ({written.replicas} engine replicas, {written.engine}, "
            f"{written.gpu_sharing}); apply with: scepsy deploy {written.out}")


def manifests(
    plan: PathLike,
    out: PathLike,
    *,
    instance: PathLike | None = None,
    engine: str = "vllm",
    gpu_sharing: str = "hami",
    namespace: str = "scepsy",
    image: str | None = None,
    gateway_image: str | None = None,
    prometheus: bool = False,
    shm_gib: int = 16,
    gpu_memory_utilization: float = 0.9,
    kubernetes_version: str = "1.34",
    hf_token_secret: str = "hf-token",
    hf_cache_pvc: str | None = None,
    device_plugin_namespace: str = "nvidia-device-plugin",
    router: str = "sglang",
    gateway_name: str = "inference-gateway",
    gateway_namespace: str | None = None,
) -> Manifests:
    """Write the Kubernetes manifests that realise a placed plan (a plan JSON of `plan`) into the
    folder `out`: engines, GPU shares, gateways (docs/deploy.md); `instance` overrides the
    instance file the plan names. `router` "sglang" gives every LLM an SGLang model gateway;
    "inference-gateway" gives it an InferencePool, its endpoint picker and an HTTPRoute attached to
    the platform's Gateway `gateway_name` (in `gateway_namespace`, default `namespace`)."""
    from scepsy.k8s.manifests import ManifestSettings, emit, pinning_warnings, write
    from scepsy.k8s.plan_input import load_placed_plan

    settings = ManifestSettings(
        engine=engine, gpu_sharing=gpu_sharing, namespace=namespace, image=image,
        **({"gateway_image": gateway_image} if gateway_image else {}),
        gpu_memory_utilization=gpu_memory_utilization, shm_gib=shm_gib, prometheus=prometheus,
        hf_token_secret=hf_token_secret, hf_cache_pvc=hf_cache_pvc, kubernetes_version=kubernetes_version,
        device_plugin_namespace=device_plugin_namespace, router=router, gateway_name=gateway_name,
        gateway_namespace=gateway_namespace,
    )
    folder = check_output_dir(out, [plan, instance])
    placed = load_placed_plan(plan, None if instance is None else Path(instance))
    objects = emit(placed, settings)
    with writing(folder / "kustomization.yaml"):
        paths = write(objects, folder)
    return Manifests(folder, tuple(paths), len(placed.replicas), engine, gpu_sharing, tuple(pinning_warnings(placed, settings)))


@dataclass(frozen=True)
class Deployed:
    """What server-side apply did to each object (`scepsy deploy`)."""

    dry_run: str  # none | server
    results: tuple[ApplyResult, ...]


def deployed_document(applied: Deployed) -> dict:
    """What `scepsy deploy --json` prints."""
    rows = [{"kind": r.kind, "namespace": r.namespace, "name": r.name, "action": r.action} for r in applied.results]
    return {"dry_run": applied.dry_run, "objects": rows}


def deployed_view(applied: Deployed) -> list[str]:
    """What `scepsy deploy` prints: a line per object."""
    suffix = " (server dry run)" if applied.dry_run == "server" else ""
    return [f"{r.ref} {r.action}{suffix}" for r in applied.results]


def deploy(directory: PathLike, *, kubeconfig: PathLike | None = None, context: str | None = None,
           dry_run: str = "none") -> Deployed:
    """Apply a manifests folder (`manifests`) with server-side apply (field manager `scepsy`), in
    dependency order; `dry_run` "server" validates on the API server without persisting."""
    from scepsy.k8s.apply import DRY_RUN_MODES, KubeApplier, connect, load_manifests
    from scepsy.k8s.apply import deploy as apply_objects

    check_choice(dry_run, DRY_RUN_MODES, "dry_run", "mode")
    objects = load_manifests(Path(directory))
    client = connect(None if kubeconfig is None else Path(kubeconfig), context)
    return Deployed(dry_run, tuple(apply_objects(objects, KubeApplier(client), dry_run=dry_run == "server")))


@dataclass(frozen=True)
class Status:
    """Each scepsy replica's pod phase and readiness (`scepsy status`)."""

    namespace: str
    replicas: tuple[ReplicaStatus, ...]


def status_document(found: Status) -> dict:
    """What `scepsy status --json` prints."""
    return {"namespace": found.namespace, "replicas": [r.__dict__ for r in found.replicas]}


def status_view(found: Status) -> RenderableType:
    """Each replica's pod phase and readiness, as a table."""
    from scepsy.k8s.apply import status_table

    return status_table(list(found.replicas), found.namespace)


def status(namespace: str = "scepsy", *, kubeconfig: PathLike | None = None, context: str | None = None) -> Status:
    """The pod phase and readiness of every replica scepsy deployed in `namespace`."""
    from scepsy.k8s.apply import connect, pod_statuses

    client = connect(None if kubeconfig is None else Path(kubeconfig), context)
    return Status(namespace, tuple(pod_statuses(client, namespace)))
