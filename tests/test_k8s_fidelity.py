"""Every engine pod realises the plan: node pinning, TP size, GPU share and memory flag.

Checked independently of the generator, from the emitted YAML and the plan JSON alone, for every
golden case and for a synthetic cluster whose nodes list GPU UUIDs (so that HAMi's UUID annotation
and the DRA claims' UUID selectors are checked too).
"""

from __future__ import annotations

import json
import math

import pytest

from k8s_support import CASES, engine_deployments, env_of, flag, objects_of, of_kind, regenerate, synthetic

from scepsy.k8s.manifests import ManifestSettings, emit
from scepsy.k8s.plan_input import load_placed_plan

U = ManifestSettings().gpu_memory_utilization


def _plan_view(plan_json: dict):
    llms = {m["name"]: m for m in plan_json["llms"]}
    replicas = {(p["llm"], p["replica"]): p for p in plan_json["placement"]}
    return llms, replicas


def check_pods(objects: list[dict], plan_json: dict, engine: str, sharing: str, memory_gib: float, uuids: dict | None) -> int:
    llms, placed = _plan_view(plan_json)
    claims = {c["metadata"]["name"]: c for c in of_kind(objects, "ResourceClaim")}
    seen = set()
    for deployment in engine_deployments(objects):
        labels = deployment["metadata"]["labels"]
        key = (labels["scepsy.io/llm"], int(labels["scepsy.io/replica"]))
        seen.add(key)
        where, llm = placed[key], llms[key[0]]
        gpus = [s["gpu"] for s in where["shards"]]
        share = where["shards"][0]["fraction"]
        pod = deployment["spec"]["template"]
        spec, container = pod["spec"], pod["spec"]["containers"][0]
        # pinning: required node affinity on the plan's node
        term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert term == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [where["node"]]}]}]
        assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"]["type"] == "Recreate"
        # TP size and memory flag
        args = container["args"]
        tp_flag, mem_flag = ("--tensor-parallel-size", "--gpu-memory-utilization") if engine == "vllm" else ("--tp", "--mem-fraction-static")
        assert int(flag(args, tp_flag)) == llm["tp"] == len(gpus)
        visible = 1.0 if sharing in ("hami", "none") else share
        assert float(flag(args, mem_flag)) == pytest.approx(U * visible, abs=1e-4)
        assert (args[0] if engine == "vllm" else flag(args, "--model-path")) == llm["model"]
        limits = container["resources"].get("limits", {})
        env = env_of(container)
        node_uuids = uuids[where["node"]] if uuids else None
        # GPU share
        if sharing == "hami":
            assert spec["schedulerName"] == "hami-scheduler"
            assert limits["nvidia.com/gpu"] == len(gpus)
            assert limits["nvidia.com/gpucores"] == round(100 * share)
            if share < 1:
                assert limits["nvidia.com/gpumem"] == math.floor(share * memory_gib * 1024 + 1e-9)
            else:
                assert limits["nvidia.com/gpumem-percentage"] == 100
            annotation = pod["metadata"]["annotations"].get("nvidia.com/use-gpuuuid")
            assert annotation == (",".join(node_uuids[g] for g in gpus) if node_uuids else None)
        elif sharing == "dra-mps":
            assert "limits" not in container["resources"]
            claim = claims[spec["resourceClaims"][0]["resourceClaimName"]]
            claim_gpus = [int(g) for g in claim["metadata"]["annotations"]["scepsy.io/gpus"].split(",")]
            assert claim["metadata"]["annotations"]["scepsy.io/node"] == where["node"]
            assert set(gpus) <= set(claim_gpus)
            request = claim["spec"]["devices"]["requests"][0]
            device = request.get("exactly", request)
            assert device["count"] == len(claim_gpus)
            expected_visible = [node_uuids[g] for g in gpus] if node_uuids else [str(claim_gpus.index(g)) for g in gpus]
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(expected_visible)
            if node_uuids:
                for g in claim_gpus:
                    assert f'"{node_uuids[g]}"' in device["selectors"][0]["cel"]["expression"]
            assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(round(100 * share))
            mib = math.floor(share * memory_gib * 1024 + 1e-9)
            assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == ",".join(f"{i}={mib}M" for i in range(len(gpus)))
            mps = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["mpsConfig"]
            assert mps["defaultActiveThreadPercentage"] >= round(100 * share)
        elif sharing == "device-plugin-mps":
            assert limits == {"nvidia.com/gpu": 1 if share < 1 else len(gpus)}
            config = of_kind(objects, "ConfigMap")
            plugin = next(c for c in config if c["metadata"]["name"] == "scepsy-device-plugin-config")
            node_config = plugin["data"][where["node"]]
            if share < 1:
                assert f"replicas: {round(1 / share)}" in node_config
        else:
            assert share == 1 and limits == {"nvidia.com/gpu": len(gpus)}
        # /dev/shm for TP > 1 only
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert ("/dev/shm" in mounts) == (len(gpus) > 1)
    assert seen == set(placed), "every placed replica has exactly one Deployment"
    return len(seen)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_golden_pods_realise_the_plan(case):
    plan_file = regenerate.plan_path(case)
    plan = load_placed_plan(plan_file)
    memory = plan.instance.cluster.gpu_types[plan.llms[0].gpu_type].memory_gib
    objects = objects_of(regenerate.emit(case))
    assert check_pods(objects, json.loads(plan_file.read_text()), case.engine, case.sharing, memory, None) > 0


@pytest.mark.parametrize("sharing", ["hami", "dra-mps"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_synthetic_cluster_with_uuids_realises_the_plan(tmp_path, engine, sharing):
    plan_file = synthetic.write_synthetic(tmp_path, nodes=3)
    uuids = {f"h100-{n:04d}": [synthetic.gpu_uuid(n, g) for g in range(8)] for n in range(3)}
    objects = objects_of(emit(load_placed_plan(plan_file), ManifestSettings(engine=engine, gpu_sharing=sharing)))
    assert check_pods(objects, json.loads(plan_file.read_text()), engine, sharing, 80.0, uuids) == 21
    if sharing == "dra-mps":
        # per node: one claim over GPUs 0-3 (rag-gen, embed, rerank) and one over 4-7 (gen, ver)
        claims = of_kind(objects, "ResourceClaim")
        assert sorted(c["metadata"]["annotations"]["scepsy.io/gpus"] for c in claims) == ["0,1,2,3"] * 3 + ["4,5,6,7"] * 3


def test_router_discovers_exactly_its_workflows_engines():
    case = next(c for c in CASES if c.instance == "combined-8xh100" and c.sharing == "hami" and c.engine == "vllm")
    objects = objects_of(regenerate.emit(case))
    plan = json.loads(regenerate.plan_path(case).read_text())
    for workflow in plan["workflows"]:
        router = next(d for d in of_kind(objects, "Deployment") if d["metadata"]["name"] == f"router-{workflow['name']}")
        args = router["spec"]["template"]["spec"]["containers"][0]["args"]
        assert flag(args, "--policy") == "cache_aware"
        selector = dict(s.split("=") for s in args[args.index("--selector") + 1 : args.index("--service-discovery-port")])
        matched = {
            d["metadata"]["labels"]["scepsy.io/llm"]
            for d in engine_deployments(objects)
            if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        }
        assert matched == {s["llm"] for s in workflow["stages"]}
        role = next(r for r in of_kind(objects, "Role") if r["metadata"]["name"] == f"router-{workflow['name']}")
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]


def test_every_object_carries_the_common_labels():
    for case in CASES[:1] + CASES[-3:]:
        for obj in objects_of(regenerate.emit(case)):
            if obj["kind"] == "Kustomization":
                continue
            labels = obj["metadata"]["labels"]
            for key in ("name", "instance", "component", "part-of", "managed-by"):
                assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], obj["metadata"]["name"], key)
            assert labels["app.kubernetes.io/managed-by"] == "scepsy"
