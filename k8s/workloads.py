"""The Deployment shape every emitted workload shares: one pod, replaced (not rolled) on change.

Engines are pinned to a node and hold GPU shares, so two pods of one replica must never run at once
(`Recreate`); gateways and endpoint pickers keep per-process routing state and run one pod each.
"""

from __future__ import annotations


def single_pod_deployment(name: str, namespace: str, labels: dict[str, str], selector: dict[str, str], pod_spec: dict,
                          annotations: dict[str, str] | None = None) -> dict:
    template: dict = {"metadata": {"labels": labels}, "spec": pod_spec}
    if annotations:
        template["metadata"]["annotations"] = annotations
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector}, "template": template},
    }
