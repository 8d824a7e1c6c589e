"""`scepsy deploy` and `scepsy status` without a cluster: what can be checked here.

No Kubernetes API server can run on this machine (see docs/deploy.md, "Testing"), so these tests
cover: the unreachable-cluster and missing-configuration paths through the real kubernetes client
(exit code 2, one line), the dependency order of the golden objects, the created/configured/
unchanged classification on server-shaped copies of real emitted objects, loading a manifests
directory, and the status summary of real-shaped Deployment and Pod objects.
"""

from __future__ import annotations

import copy
import socket

import pytest
import yaml
from typer.testing import CliRunner

from k8s_support import CASES, GOLDEN, of_kind

from scepsy.cli import app
from scepsy.k8s.apply import APPLY_ORDER, apply_order, classify, deploy, load_manifests, summarize
from scepsy.models.errors import InputError

runner = CliRunner()
DRA = GOLDEN / next(c for c in CASES if c.sharing == "dra-mps").name


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kubeconfig(path, server: str) -> None:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }
    path.write_text(yaml.safe_dump(config))


@pytest.mark.parametrize("command", [["deploy", str(DRA)], ["deploy", str(DRA), "--dry-run", "server"], ["status"]])
def test_unreachable_cluster_exits_2_with_a_clear_line(tmp_path, command):
    kubeconfig = tmp_path / "kubeconfig"
    server = f"http://127.0.0.1:{_closed_port()}"
    _kubeconfig(kubeconfig, server)
    result = runner.invoke(app, [*command, "--kubeconfig", str(kubeconfig)])
    assert result.exit_code == 2, result.output
    assert f"cannot reach the Kubernetes API server at {server}" in result.output
    assert "Traceback" not in result.output


def test_missing_kubeconfig_and_unknown_context_exit_2(tmp_path):
    result = runner.invoke(app, ["deploy", str(DRA), "--kubeconfig", str(tmp_path / "none")])
    assert result.exit_code == 2 and "none: file not found" in result.output
    (tmp_path / "garbage").write_text("clusters: 7\ncontexts: [1, 2]\n")
    result = runner.invoke(app, ["deploy", str(DRA), "--kubeconfig", str(tmp_path / "garbage")])
    assert result.exit_code == 2 and "no usable cluster configuration" in result.output
    result = runner.invoke(app, ["deploy", str(DRA / "kustomization.yaml")])
    assert result.exit_code == 2 and "not a directory" in result.output
    kubeconfig = tmp_path / "kubeconfig"
    _kubeconfig(kubeconfig, "http://127.0.0.1:1")
    result = runner.invoke(app, ["deploy", str(DRA), "--kubeconfig", str(kubeconfig), "--context", "other"])
    assert result.exit_code == 2 and "context other" in result.output


def test_bad_dry_run_mode_and_missing_directory_exit_2(tmp_path):
    assert runner.invoke(app, ["deploy", str(DRA), "--dry-run", "client"]).exit_code == 2
    result = runner.invoke(app, ["deploy", str(tmp_path)])
    assert result.exit_code == 2 and "kustomization.yaml: file not found" in result.output


def test_load_manifests_reads_what_kustomization_lists():
    objects = load_manifests(DRA)
    listed = yaml.safe_load((DRA / "kustomization.yaml").read_text())["resources"]
    assert len(objects) == len(listed)
    assert {o["kind"] for o in objects} == {"Namespace", "PriorityClass", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "ResourceClaim", "Service", "Deployment"}


def test_missing_listed_file_is_reported(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: [gone.yaml]\n")
    with pytest.raises(InputError, match="listed file gone.yaml is missing"):
        load_manifests(tmp_path)


def test_apply_order_puts_dependencies_first():
    objects = load_manifests(DRA)
    shuffled = list(reversed(objects))
    ordered = apply_order(shuffled)
    ranks = [APPLY_ORDER.index(o["kind"]) for o in ordered]
    assert ranks == sorted(ranks)
    assert ordered[0]["kind"] == "Namespace"
    kinds = [o["kind"] for o in ordered]
    assert kinds.index("ResourceClaim") < kinds.index("Deployment")
    assert kinds.index("PriorityClass") < kinds.index("Deployment")  # pods name it at admission
    deployments = [o["metadata"]["name"] for o in ordered if o["kind"] == "Deployment"]
    assert deployments == [o["metadata"]["name"] for o in shuffled if o["kind"] == "Deployment"]  # stable


def _as_served(obj: dict, version: str) -> dict:
    """What an API server returns for an applied object: defaults, server metadata, status."""
    served = copy.deepcopy(obj)
    served["metadata"].update(
        resourceVersion=version,
        uid="4b6f1c1e-0000-4000-8000-000000000001",
        generation=1,
        creationTimestamp="2026-01-01T00:00:00Z",
        managedFields=[{"manager": "scepsy", "operation": "Apply", "time": f"2026-01-01T00:00:0{version[-1]}Z"}],
    )
    if served["kind"] == "Deployment":
        served["spec"].setdefault("revisionHistoryLimit", 10)
        served["spec"].setdefault("progressDeadlineSeconds", 600)
        served["status"] = {"observedGeneration": 1, "replicas": 1}
    return served


def test_classification_on_real_objects():
    deployment = of_kind(load_manifests(DRA), "Deployment")[0]
    before = _as_served(deployment, "101")
    assert classify(None, _as_served(deployment, "101")) == "created"
    assert classify(before, _as_served(deployment, "101")) == "unchanged"  # no write: same resourceVersion
    changed = copy.deepcopy(deployment)
    changed["spec"]["template"]["spec"]["containers"][0]["image"] = "vllm/vllm-openai:v0.0.1"
    assert classify(before, _as_served(changed, "102")) == "configured"
    # a dry run never bumps resourceVersion: the content decides
    assert classify(before, _as_served(changed, "101"), dry_run=True) == "configured"
    restatused = _as_served(deployment, "101")
    restatused["status"] = {"observedGeneration": 1, "replicas": 1, "readyReplicas": 1}
    assert classify(before, restatused, dry_run=True) == "unchanged"


class _RecordingApplier:
    """Records the calls `deploy` makes; answers as an API server would for a fresh cluster."""

    def __init__(self, existing: dict[tuple[str, str], dict]):
        self.existing: dict[tuple[str, str], dict] = existing
        self.calls: list[tuple] = []

    def get(self, obj: dict) -> dict | None:
        self.calls.append(("get", obj["kind"], obj["metadata"]["name"]))
        return self.existing.get((obj["kind"], obj["metadata"]["name"]))

    def apply(self, obj: dict, dry_run: bool) -> dict:
        self.calls.append(("apply", obj["kind"], obj["metadata"]["name"], dry_run))
        before = self.existing.get((obj["kind"], obj["metadata"]["name"]))
        if before is not None and before.get("spec") == obj.get("spec"):
            return before  # unchanged
        version = before["metadata"]["resourceVersion"] if before is not None and dry_run else "900"
        return _as_served(obj, version)


def test_deploy_gets_then_applies_each_object_in_order():
    objects = load_manifests(DRA)
    namespace = next(o for o in objects if o["kind"] == "Namespace")
    claim = of_kind(objects, "ResourceClaim")[0]
    existing = {("Namespace", namespace["metadata"]["name"]): _as_served(namespace, "5"), ("ResourceClaim", claim["metadata"]["name"]): _as_served(claim, "7")}
    applier = _RecordingApplier(existing)
    results = deploy(objects, applier, dry_run=False)
    assert [c[0] for c in applier.calls] == ["get", "apply"] * len(objects)
    actions = {(r.kind, r.name): r.action for r in results}
    assert actions[("ResourceClaim", claim["metadata"]["name"])] == "unchanged"
    assert actions[("Namespace", namespace["metadata"]["name"])] == "unchanged"
    assert sum(a == "created" for a in actions.values()) == len(objects) - 2
    assert results[0].ref == f"namespace/{namespace['metadata']['name']}"


def test_status_summary_of_real_shaped_objects():
    deployments = [d for d in of_kind(load_manifests(DRA), "Deployment")]
    gen = next(d for d in deployments if d["metadata"]["name"] == "gen-r0")
    pod = {
        "metadata": {"name": "gen-r0-5d9f-abcde", "labels": gen["spec"]["template"]["metadata"]["labels"], "creation_timestamp": "2026-01-01T00:00:00Z"},
        "spec": {"node_name": "h100"},
        "status": {"phase": "Running", "container_statuses": [{"name": "engine", "ready": True, "restart_count": 2}]},
    }
    as_client = [{"metadata": d["metadata"], "spec": {"selector": {"match_labels": d["spec"]["selector"]["matchLabels"]}}} for d in deployments]
    rows = {r.deployment: r for r in summarize(as_client, [pod])}
    assert rows["gen-r0"].phase == "Running" and rows["gen-r0"].ready and rows["gen-r0"].restarts == 2
    assert rows["gen-r0"].node == "h100" and rows["gen-r0"].llm == "gen" and rows["gen-r0"].replica == "0"
    assert rows["ver-r0"].phase == "NoPod" and not rows["ver-r0"].ready
    assert rows["gen-gateway"].llm == "gen" and rows["gen-gateway"].phase == "NoPod"
    assert rows["gen-r0"].workflow == "beam" and rows["embed-r0"].workflow == "rag"
