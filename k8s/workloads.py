"""The Deployment shape every emitted workload shares: replaced (not rolled) on change.

Engines are pinned to a node and hold GPU shares, so two pods of one replica must never run at once
(`Recreate`); gateways keep per-process routing state and run one pod each; endpoint pickers run a
leader-elected set (one active, the others standing by), replaced together as the upstream chart does.
"""

from __future__ import annotations


def single_pod_deployment(name: str, namespace: str, labels: dict[str, str], selector: dict[str, str], pod_spec: dict,
                          annotations: dict[str, str] | None = None, replicas: int = 1) -> dict:
    template: dict = {"metadata": {"labels": labels}, "spec": pod_spec}
    if annotations:
        template["metadata"]["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": replicas, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector}, "template": template},
    }
