"""Kubernetes (`scepsy manifests`, `deploy`, `status`): the manifests of a placed plan, applied and
watched."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from scepsy.api.plan import PathLike
from scepsy.models.arguments import check_choice, settings_with
from scepsy.models.errors import InputError
from scepsy.models.output import check_output_dir, writing

if TYPE_CHECKING:  # the k8s extra (kubernetes) is imported where it is used
    from rich.console import RenderableType

    from scepsy.k8s.apply import ApplyResult, ReplicaStatus
    from scepsy.k8s.controller import ControllerSettings
    from scepsy.k8s.manifests import ManifestSettings


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


def manifest_settings(settings: ManifestSettings | None = None, **overrides) -> ManifestSettings:
    """`settings` (default: every default of k8s/manifests.py ManifestSettings) with `overrides` of
    its fields, checked (InputError naming the field)."""
    from scepsy.k8s.manifests import ManifestSettings

    return settings_with(ManifestSettings, settings, overrides, "manifest setting")


def controller_settings(image: str | None, prometheus_url: str | None, prometheus_selector: str = "",
                        settings_file: PathLike | None = None) -> ControllerSettings:
    """The in-cluster controller's Deployment settings (k8s/controller.py ControllerSettings),
    checked: an image, the Prometheus it reads, and the policy's settings file (by the policy's own
    check)."""
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
    return ControllerSettings(image, prometheus_url, prometheus_selector, None if settings_file is None else str(settings_file))


def manifests(plan: PathLike, out: PathLike, settings: ManifestSettings | None = None, *, instance: PathLike | None = None,
              controller: ControllerSettings | None = None, **overrides) -> Manifests:
    """Write the Kubernetes manifests that realise a placed plan (a plan JSON of `plan`) into the
    folder `out`: engines, GPU shares, gateways and, by default, the workflow entry (docs/deploy.md),
    as `settings` says (k8s/manifests.py ManifestSettings, every setting with its default; keyword
    `overrides` of its fields for a quick call, e.g. `manifests(plan, out, engine="sglang")`);
    `instance` overrides the instance file the plan names. With `controller`
    (`controller_settings(...)`), also `scepsy control` in the cluster (k8s/controller.py): its
    Deployment, ServiceAccount, least-privilege RBAC and Lease. The result's warnings say when the
    deployment has no workflow entry (which burst recovery it then keeps) and which engines cannot
    be pinned to their planned GPUs."""
    from scepsy.k8s.manifests import cure_warnings, emit, pinning_warnings, write
    from scepsy.k8s.plan_input import load_placed_plan

    settings = manifest_settings(settings, **overrides)
    folder = check_output_dir(out, [plan, instance])
    placed = load_placed_plan(plan, None if instance is None else Path(instance))
    objects = emit(placed, settings, controller)
    with writing(folder / "kustomization.yaml"):
        paths = write(objects, folder)
    warnings = tuple(cure_warnings(placed, settings) + pinning_warnings(placed, settings))
    return Manifests(folder, tuple(paths), len(placed.replicas), settings.engine, settings.gpu_sharing, warnings)


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
