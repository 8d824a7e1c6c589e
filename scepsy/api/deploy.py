"""Kubernetes (`scepsy manifests`, `deploy`, `status`): the manifests of a placed plan, applied and
watched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scepsy.api.plan import PathLike
from scepsy.models.arguments import check_choice
from scepsy.models.errors import InputError
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
    warnings: tuple[str, ...]  # no workflow entry; engines pinned to GPUs the plan does not name (k8s/manifests.py)


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
    gateway_provider: str = "istio",
    endpoint_picker: str = "llm-d-router",
    picker_replicas: int = 2,
    scheduling: str = "priority",
    entry: bool = True,
    entry_image: str | None = None,
    controller: bool = False,
    controller_image: str | None = None,
    prometheus_url: str | None = None,
    prometheus_selector: str = "",
    settings_file: PathLike | None = None,
) -> Manifests:
    """Write the Kubernetes manifests that realise a placed plan (a plan JSON of `plan`) into the
    folder `out`: engines, GPU shares, gateways (docs/deploy.md); `instance` overrides the
    instance file the plan names. `router` "sglang" gives every LLM an SGLang model gateway;
    "inference-gateway" gives it an InferencePool, its endpoint picker and an HTTPRoute attached to
    the platform's Gateway `gateway_name` (in `gateway_namespace`, default `namespace`), with what
    the upstream chart adds for `gateway_provider` (istio, gke or none), the endpoint picker of
    `endpoint_picker` (llm-d-router v0.10.0, or the extension's inference-extension-v1.5.0) and
    `picker_replicas` leader-elected pickers per pool.
    `scheduling` "priority" runs the generating engines with priority scheduling, for calls tagged
    with their workflow request's start (`proxy(workflow_priority=True)`); "fcfs" leaves the
    engines' default. With `entry` (the default; `--router sglang`), also the workflow entry in
    front of the LLMs' Services (k8s/entry.py: `scepsy proxy --workflow-priority` tagging every call
    and holding each LLM's calls beyond the plan's entry limit), from `entry_image` (default: scepsy's
    own image, k8s/entry.py DEFAULT_ENTRY_IMAGE); without it the result's warnings say which burst
    recovery the deployment then keeps. With `controller`, also `scepsy control` in the cluster (k8s/controller.py): its Deployment (image
    `controller_image`, reading `prometheus_url`, `prometheus_selector` and the policy's
    `settings_file`), ServiceAccount, least-privilege RBAC and Lease."""
    from scepsy.k8s.manifests import ManifestSettings, cure_warnings, emit, pinning_warnings, write
    from scepsy.k8s.plan_input import load_placed_plan

    settings = ManifestSettings(
        engine=engine, gpu_sharing=gpu_sharing, namespace=namespace, image=image,
        **({"gateway_image": gateway_image} if gateway_image else {}),
        gpu_memory_utilization=gpu_memory_utilization, shm_gib=shm_gib, prometheus=prometheus,
        hf_token_secret=hf_token_secret, hf_cache_pvc=hf_cache_pvc, kubernetes_version=kubernetes_version,
        device_plugin_namespace=device_plugin_namespace, router=router, gateway_name=gateway_name,
        gateway_namespace=gateway_namespace, gateway_provider=gateway_provider, endpoint_picker=endpoint_picker,
        picker_replicas=picker_replicas, scheduling=scheduling,
        entry=entry, **({"entry_image": entry_image} if entry_image else {}),
    )
    folder = check_output_dir(out, [plan, instance])
    control = None
    if controller:
        control = _controller_settings(controller_image, prometheus_url, prometheus_selector, settings_file)
    placed = load_placed_plan(plan, None if instance is None else Path(instance))
    objects = emit(placed, settings, control)
    with writing(folder / "kustomization.yaml"):
        paths = write(objects, folder)
    return Manifests(folder, tuple(paths), len(placed.replicas), engine, gpu_sharing, tuple(cure_warnings(placed, settings) + pinning_warnings(placed, settings)))




def _controller_settings(image: str | None, prometheus_url: str | None, selector: str, settings_file: PathLike | None):
    """The controller's Deployment settings, checked (the settings file: by the policy's own check)."""
    from scepsy.control.knobs import control_settings
    from scepsy.k8s.controller import ControllerSettings
    from scepsy.k8s.manifests import check_image

    if image is None:
        raise InputError(None, "controller_image", "the controller needs an image with scepsy installed",
                         "build one (docs/deploy.md, \"The controller in the cluster\") and pass its reference")
    check_image("controller_image", image)
    if prometheus_url is None or not prometheus_url.startswith(("http://", "https://")):
        raise InputError(None, "prometheus_url", "the controller reads the engines' rates from Prometheus: give its http(s) URL",
                         "give e.g. http://prometheus.monitoring:9090")
    if settings_file is not None:
        control_settings({}, settings_file)  # refuse a bad knob now, not in the pod
    return ControllerSettings(image, prometheus_url, selector, None if settings_file is None else str(settings_file))




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
