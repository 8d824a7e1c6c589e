"""Kubernetes names and labels of the emitted objects (deterministic, collision-free).

Object names are DNS-1123 labels (lower-case alphanumerics and '-', at most 63 characters). A
scepsy name that is not one already (upper case, '_', '.', too long) is lowered, its other
characters become '-', and a 6-hex-digit hash of the original name is appended so that two
different names never map to the same object name.
"""

from __future__ import annotations

import hashlib
import re

PART_OF = "scepsy"
MANAGED_BY = "scepsy"
CONTROLLER = "scepsy-controller"  # the controller's Deployment, ServiceAccount, RBAC and Lease
LLM_LABEL = "scepsy.io/llm"
REPLICA_LABEL = "scepsy.io/replica"
WORKFLOW_LABEL = "scepsy.io/workflow"
# An engine serves an LLM that several workflows may call: one membership label per workflow.
WORKFLOW_MEMBER_PREFIX = "workflow.scepsy.io/"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
MAX_BASE = 40  # leaves room for prefixes and suffixes such as "-r127" within 63 characters


def dns_label(name: str, max_length: int = MAX_BASE) -> str:
    """`name` as a DNS-1123 label of at most `max_length` characters (stable, collision-free)."""
    if len(name) <= max_length and _DNS_LABEL.match(name):
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[: max_length - 7].strip("-")
    return f"{cleaned}-{digest}" if cleaned else f"x-{digest}"


def label_value(value: str) -> str:
    """A valid label value (at most 63 characters of [A-Za-z0-9-_.], alphanumeric at both ends)."""
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    return dns_label(value, 63)


def engine_deployment(llm: str, replica: int) -> str:
    return f"{dns_label(llm)}-r{replica}"


def llm_service(llm: str) -> str:
    return dns_label(llm)


def gateway(llm: str) -> str:
    return f"{dns_label(llm)}-gateway"


def workflow_member_label(workflow: str) -> str:
    return WORKFLOW_MEMBER_PREFIX + dns_label(workflow, 63)


def labels(name: str, instance: str, component: str, **scepsy: str | int | None) -> dict[str, str]:
    """The recommended app.kubernetes.io labels plus scepsy's own (llm, replica, workflow)."""
    out = {
        "app.kubernetes.io/name": name,
        "app.kubernetes.io/instance": instance,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": PART_OF,
        "app.kubernetes.io/managed-by": MANAGED_BY,
    }
    keys = {"llm": LLM_LABEL, "replica": REPLICA_LABEL, "workflow": WORKFLOW_LABEL}
    for key, value in scepsy.items():
        if value is not None:
            out[keys[key]] = label_value(str(value))
    return out
