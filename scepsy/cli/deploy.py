"""Kubernetes: `scepsy manifests`, `deploy`, `status` (docs/deploy.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from scepsy.cli.app import app
from scepsy.cli.common import (
    ContextOpt,
    JsonOpt,
    KubeconfigOpt,
    NamespaceOpt,
    emit_json,
    errors,
    stderr,
    stdout,
)
from scepsy.models.errors import InputError
from scepsy.models.output import check_output_dir, writing


@app.command()
def manifests(
    plan_file: Annotated[Path, typer.Argument(help="Placed plan JSON (scepsy plan --out).", show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="Directory for the manifests (one object per file + kustomization.yaml).")],
    engine: Annotated[str, typer.Option("--engine", help="Serving engine: vllm or sglang.")] = "vllm",
    gpu_sharing: Annotated[str, typer.Option("--gpu-sharing", help="GPU sharing: hami, dra-mps, device-plugin-mps or none.")] = "hami",
    namespace: NamespaceOpt = "scepsy",
    image: Annotated[Optional[str], typer.Option("--image", help="Engine image (default: the pinned vllm/vllm-openai or lmsysorg/sglang release).")] = None,
    gateway_image: Annotated[Optional[str], typer.Option("--gateway-image", help="SGLang model gateway image (default: the pinned lmsysorg/sgl-model-gateway release).")] = None,
    prometheus: Annotated[bool, typer.Option("--prometheus", help="Add prometheus-operator PodMonitors for engines and gateways.")] = False,
    shm_gib: Annotated[int, typer.Option("--shm-gib", help="/dev/shm of engines with TP > 1, GiB (TP 1: 2 GiB).")] = 16,
    gpu_memory_utilization: Annotated[float, typer.Option("--gpu-memory-utilization", help="Fraction of its GPU memory slice an engine may fill (weights + KV cache).")] = 0.9,
    instance: Annotated[Optional[Path], typer.Option("--instance", help="Instance YAML (default: the plan's `instance`).")] = None,
    kubernetes_version: Annotated[str, typer.Option("--kubernetes-version", help="Target cluster version (selects the resource.k8s.io API for dra-mps).")] = "1.34",
    hf_token_secret: Annotated[str, typer.Option("--hf-token-secret", help="Secret (key `token`) with a Hugging Face token; required by pods of gated models, optional otherwise.")] = "hf-token",
    hf_cache_pvc: Annotated[Optional[str], typer.Option("--hf-cache-pvc", help="PersistentVolumeClaim for the HF cache (default: an emptyDir per pod).")] = None,
    device_plugin_namespace: Annotated[str, typer.Option("--device-plugin-namespace", help="Namespace of the NVIDIA device plugin (device-plugin-mps config).")] = "nvidia-device-plugin",
    router: Annotated[str, typer.Option("--router", help="Routing: sglang (an SGLang model gateway per LLM) or inference-gateway (InferencePools, endpoint pickers and HTTPRoutes of the Gateway API Inference Extension).")] = "sglang",
    gateway_name: Annotated[str, typer.Option("--gateway-name", help="The platform's Gateway the HTTPRoutes attach to (--router inference-gateway).")] = "inference-gateway",
    gateway_namespace: Annotated[Optional[str], typer.Option("--gateway-namespace", help="Namespace of that Gateway (default: --namespace).")] = None,
    json_output: JsonOpt = False,
) -> None:
    """Write Kubernetes manifests that realise a placed plan (engines, GPU shares, gateways)."""
    from scepsy.k8s.manifests import ManifestSettings, emit, pinning_warnings, write
    from scepsy.k8s.plan_input import load_placed_plan

    with errors():
        settings = ManifestSettings(
            engine=engine,
            gpu_sharing=gpu_sharing,
            namespace=namespace,
            image=image,
            **({"gateway_image": gateway_image} if gateway_image else {}),
            gpu_memory_utilization=gpu_memory_utilization,
            shm_gib=shm_gib,
            prometheus=prometheus,
            hf_token_secret=hf_token_secret,
            hf_cache_pvc=hf_cache_pvc,
            kubernetes_version=kubernetes_version,
            device_plugin_namespace=device_plugin_namespace,
            router=router,
            gateway_name=gateway_name,
            gateway_namespace=gateway_namespace,
        )
        check_output_dir(out, [plan_file, instance])
        placed = load_placed_plan(plan_file, instance)
        objects = emit(placed, settings)
        with writing(out / "kustomization.yaml"):
            paths = write(objects, out)
        for line in pinning_warnings(placed, settings):
            stderr.print(line, markup=False, highlight=False, soft_wrap=True)
        if json_output:
            emit_json({"out": str(out), "files": [p.name for p in paths]}, None, True)
        else:
            stdout.print(f"wrote {len(paths)} files to {out} ({len(placed.replicas)} engine replicas, {engine}, {gpu_sharing}); apply with: scepsy deploy {out}", highlight=False)


@app.command()
def deploy(
    directory: Annotated[Path, typer.Argument(help="Manifests directory (scepsy manifests --out).", show_default=False)],
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    dry_run: Annotated[str, typer.Option("--dry-run", help="server: validate on the API server without persisting; none: apply.")] = "none",
    json_output: JsonOpt = False,
) -> None:
    """Apply a manifests directory with server-side apply (field manager `scepsy`), in dependency order."""
    from scepsy.k8s.apply import DRY_RUN_MODES, KubeApplier, connect, load_manifests
    from scepsy.k8s.apply import deploy as run_deploy

    with errors():
        if dry_run not in DRY_RUN_MODES:
            raise InputError(None, "--dry-run", f"unknown mode {dry_run!r}", f"use one of: {', '.join(DRY_RUN_MODES)}")
        objects = load_manifests(directory)
        api_client = connect(kubeconfig, context)
        results = run_deploy(objects, KubeApplier(api_client), dry_run=dry_run == "server")
        suffix = " (server dry run)" if dry_run == "server" else ""
        if json_output:
            rows = [{"kind": r.kind, "namespace": r.namespace, "name": r.name, "action": r.action} for r in results]
            emit_json({"dry_run": dry_run, "objects": rows}, None, True)
        else:
            for r in results:
                stdout.print(f"{r.ref} {r.action}{suffix}", highlight=False, markup=False)


@app.command()
def status(
    namespace: NamespaceOpt = "scepsy",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Show each replica's pod phase and readiness."""
    from rich.table import Table

    from scepsy.k8s.apply import connect, pod_statuses

    with errors():
        rows = pod_statuses(connect(kubeconfig, context), namespace)
        if json_output:
            emit_json({"namespace": namespace, "replicas": [r.__dict__ for r in rows]}, None, True)
            return
        table = Table(title=f"scepsy deployments in {namespace}")
        for column in ("deployment", "llm", "replica", "workflow", "node", "phase", "ready", "restarts"):
            table.add_column(column)
        for r in rows:
            table.add_row(r.deployment, r.llm or "-", r.replica or "-", r.workflow or "-", r.node or "-", r.phase, "yes" if r.ready else "no", str(r.restarts))
        stdout.print(table)
