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
    SchedulingOpt,
    SettingsFileOpt,
    emit_json,
    errors,
    stderr,
    stdout,
)


@app.command()
def manifests(
    plan_file: Annotated[Path, typer.Argument(help="Placed plan JSON (scepsy plan --out).", show_default=False)],
    out: Annotated[Path, typer.Option("--out", help="Directory for the manifests (one object per file + kustomization.yaml).")],
    engine: Annotated[str, typer.Option("--engine", help="Serving engine: vllm or sglang.")] = "vllm",
    gpu_sharing: Annotated[str, typer.Option("--gpu-sharing", help="GPU sharing: hami, dra-mps, device-plugin-mps or none.")] = "hami",
    namespace: NamespaceOpt = "scepsy",
    image: Annotated[Optional[str], typer.Option("--image", help="Engine image (default: the pinned vllm/vllm-openai or lmsysorg/sglang release).")] = None,
    gateway_image: Annotated[str, typer.Option("--gateway-image", help="SGLang model gateway image (the pinned release).")] = "lmsysorg/sgl-model-gateway:v0.3.2",
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
    gateway_provider: Annotated[str, typer.Option("--gateway-provider", help="The Gateway's implementation, for what the upstream chart adds for it: istio (a DestinationRule for the picker's TLS), gke (health check and backend policies, no route timeout) or none (kgateway, agentgateway, NGINX Gateway Fabric, others).")] = "istio",
    endpoint_picker: Annotated[str, typer.Option("--endpoint-picker", help="Endpoint picker release: llm-d-router (v0.10.0) or inference-extension-v1.5.0.")] = "llm-d-router",
    picker_replicas: Annotated[int, typer.Option("--picker-replicas", help="Endpoint pickers per pool, leader-elected (one active, the others standing by).")] = 2,
    scheduling: SchedulingOpt = "priority",
    entry: Annotated[bool, typer.Option("--entry/--no-entry", help="Emit the workflow entry in front of the LLMs' Services (--router sglang): scepsy proxy --workflow-priority, tagging every call with its workflow's start and holding each LLM's calls beyond the plan's entry_limit, so that the deployment recovers from bursts. --no-entry leaves the engines first come first served (a warning gives the plan's recovery_limit_fcfs_rps).")] = True,
    entry_image: Annotated[str, typer.Option("--entry-image", help="The entry's image: scepsy's own, built from the repository's Dockerfile (docs/deploy.md).")] = "ghcr.io/scepsy/scepsy:0.1.0",
    controller: Annotated[bool, typer.Option("--controller", help="Also run `scepsy control` in the cluster: its Deployment, ServiceAccount, least-privilege RBAC and Lease (docs/deploy.md).")] = False,
    controller_image: Annotated[Optional[str], typer.Option("--controller-image", help="With --controller: an image with scepsy and its k8s and control extras.")] = None,
    prometheus_url: Annotated[Optional[str], typer.Option("--prometheus-url", help="With --controller: the Prometheus that scrapes the engines, e.g. http://prometheus.monitoring:9090.")] = None,
    prometheus_selector: Annotated[str, typer.Option("--prometheus-selector", help="With --controller: label matchers narrowing the engines' series, e.g. 'namespace=\"scepsy\"'.")] = "",
    settings_file: SettingsFileOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Write Kubernetes manifests that realise a placed plan (engines, GPU shares, gateways), and with --controller the controller's."""
    from scepsy import api

    with errors():
        settings = api.ManifestSettings(
            engine=engine, gpu_sharing=gpu_sharing, namespace=namespace, image=image, gateway_image=gateway_image,
            gpu_memory_utilization=gpu_memory_utilization, shm_gib=shm_gib, prometheus=prometheus,
            hf_token_secret=hf_token_secret, hf_cache_pvc=hf_cache_pvc, kubernetes_version=kubernetes_version,
            device_plugin_namespace=device_plugin_namespace, router=router, gateway_name=gateway_name,
            gateway_namespace=gateway_namespace, gateway_provider=gateway_provider, endpoint_picker=endpoint_picker,
            picker_replicas=picker_replicas, scheduling=scheduling, entry=entry, entry_image=entry_image)
        deployment = api.controller_settings(controller_image, prometheus_url, prometheus_selector, settings_file) if controller else None
        written = api.manifests(plan_file, out, settings, instance=instance, controller=deployment)
        for line in written.warnings:
            stderr.print(line, markup=False, highlight=False, soft_wrap=True)
        if json_output:
            emit_json(api.manifests_document(written), None, True)
        else:
            stdout.print(api.manifests_view(written), highlight=False)


@app.command()
def deploy(
    directory: Annotated[Path, typer.Argument(help="Manifests directory (scepsy manifests --out).", show_default=False)],
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    dry_run: Annotated[str, typer.Option("--dry-run", help="server: validate on the API server without persisting; none: apply.")] = "none",
    json_output: JsonOpt = False,
) -> None:
    """Apply a manifests directory with server-side apply (field manager `scepsy`), in dependency order."""
    from scepsy import api

    with errors():
        applied = api.deploy(directory, kubeconfig=kubeconfig, context=context, dry_run=dry_run)
        if json_output:
            emit_json(api.deployed_document(applied), None, True)
        else:
            for line in api.deployed_view(applied):
                stdout.print(line, highlight=False, markup=False)


@app.command()
def status(
    namespace: NamespaceOpt = "scepsy",
    kubeconfig: KubeconfigOpt = None,
    context: ContextOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Show each replica's pod phase and readiness."""
    from scepsy import api

    with errors():
        found = api.status(namespace, kubeconfig=kubeconfig, context=context)
        if json_output:
            emit_json(api.status_document(found), None, True)
        else:
            stdout.print(api.status_view(found))
