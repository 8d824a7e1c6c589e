"""A re-plan that adds or removes replicas changes only engine Deployments: every gateway object
(the SGLang gateways with their RBAC and Services, or the inference-gateway objects: InferencePool,
endpoint picker, HTTPRoute) renders byte for byte the same, so applying the new plan restarts no
gateway. Two plans of one instance that differ only in the replica count of some LLMs are rendered
with every engine and router (and their PodMonitors); the only files that may differ are the engine Deployments of the
replicas that come or go, the plan ConfigMap (it holds the plan), kustomization.yaml (it lists
the files) and, with the SGLang gateways, the workflow entry's Deployment (its hold, `--max-in-flight`,
follows the LLMs' replicas)."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from k8s_support import ROOT, regenerate

from scepsy.k8s.manifests import ManifestSettings, emit
from scepsy.k8s.plan_input import load_placed_plan
from scepsy.k8s.sizing import most_replicas, tree_chars_per_worker
from scepsy.models.instance.instance import load_instance

INSTANCES = ROOT / "instances"

# golden plan -> the LLMs that lose their last replica in the re-plan (each keeps two or more, so
# that no PodDisruptionBudget comes or goes; a vLLM reranker's Service selects its engines directly)
REPLANS = {
    "beam-4xa6000-halves": ("gen", "ver"),  # gen 3 -> 2, ver 5 -> 4
    "rag-4xa6000-optimal": ("rerank",),  # rerank 3 -> 2
}
SETTINGS = [(engine, router) for engine in ("vllm", "sglang") for router in ("sglang", "inference-gateway")]


def _without_last_replica(plan: dict, llms: tuple[str, ...]) -> dict:
    out = copy.deepcopy(plan)
    for llm in llms:
        record = next(m for m in out["llms"] if m["name"] == llm)
        record["replicas"] -= 1
        out["placement"] = [p for p in out["placement"] if not (p["llm"] == llm and p["replica"] == record["replicas"])]
    return out


def _render(plan: dict, instance: str, path, engine: str, router: str) -> dict[str, str]:
    path.write_text(json.dumps(plan))
    placed = load_placed_plan(path, INSTANCES / f"{instance}.yaml")
    return emit(placed, ManifestSettings(engine=engine, gpu_sharing="hami", router=router, prometheus=True))


ROUTING_KINDS = {"ServiceAccount", "Role", "RoleBinding", "Service", "InferencePool", "HTTPRoute", "DestinationRule"}


def _routing_files(files: dict[str, str]) -> dict[str, str]:
    """name -> kind of the routing objects' files: gateway.py's and inference_gateway.py's objects
    and the RBAC they run with (every Deployment and ConfigMap but the engines' and the plan's)."""
    out = {}
    for name, text in files.items():
        obj = yaml.safe_load(text)
        component = obj.get("metadata", {}).get("labels", {}).get("app.kubernetes.io/component")
        if obj["kind"] in ROUTING_KINDS or (obj["kind"] in ("Deployment", "ConfigMap") and component in ("gateway", "endpoint-picker")):
            out[name] = obj["kind"]
    return out


@pytest.mark.parametrize(("engine", "router"), SETTINGS, ids=lambda v: v)
@pytest.mark.parametrize("plan_name", sorted(REPLANS))
def test_a_replan_with_other_replica_counts_changes_only_engines(tmp_path, plan_name, engine, router):
    plan = json.loads((regenerate.PLANS / f"{plan_name}.json").read_text())
    instance = plan_name.rsplit("-", 1)[0]
    smaller = _without_last_replica(plan, REPLANS[plan_name])
    before = _render(plan, instance, tmp_path / "before.json", engine, router)
    after = _render(smaller, instance, tmp_path / "after.json", engine, router)

    removed = {f"70-deployment-{llm}-r{next(m for m in smaller['llms'] if m['name'] == llm)['replicas']}.yaml" for llm in REPLANS[plan_name]}
    assert set(before) - set(after) == removed
    assert set(after) <= set(before)
    changed = {name for name in after if after[name] != before[name]}
    entry = {"70-deployment-scepsy-entry.yaml"} if router == "sglang" else set()
    assert changed == {"40-configmap-scepsy-plan.yaml", "kustomization.yaml"} | entry

    # the routing objects are there, and the same: no gateway or endpoint picker is rewritten or restarted
    routing = _routing_files(before)
    expected = {"sglang": {"Deployment", "ServiceAccount", "Role", "RoleBinding", "Service"},
                "inference-gateway": {"Deployment", "ConfigMap", "InferencePool", "HTTPRoute", "Service", "Role", "DestinationRule"}}[router]
    assert set(routing.values()) >= expected, routing
    assert all(after[name] == before[name] for name in routing)


def test_most_replicas_fills_every_gpu_with_the_smallest_share_that_fits():
    """combined-8xh100: 8 H100 (80 GiB), F = 10. gen (Llama-3.2-1B, 3.31 GiB) fits in 1/10 of a GPU:
    80. ver (8B, 16.96 GiB): tp 1 needs 3/10 (3 per GPU: 24), tp 2 needs 2/10 per shard (5 per GPU,
    two shards each: 20), so 24. The gateway's tree per worker follows: 2^28 / M."""
    instance = load_instance(INSTANCES / "combined-8xh100.yaml")
    assert most_replicas(instance, "gen") == 80
    assert most_replicas(instance, "ver") == 24
    assert tree_chars_per_worker(80) == 2**28 // 80
    assert tree_chars_per_worker(2) == 2**26  # never above the gateway's own default
