"""Every engine pod realises the plan: node pinning, TP size, GPU share and memory flag.

Checked independently of the generator, from the emitted YAML and the plan JSON alone, for every
golden case and for a synthetic cluster whose nodes list GPU UUIDs (so that HAMi's UUID annotation
and the DRA claims' UUID selectors are checked too): node pinning, TP, GPU resources and claims,
memory flags and MPS limits from the memory the GPU reports, CPU/memory requests and limits,
/dev/shm (none for MPS clients), priority, drain hook and grace period, UUID handling
(CUDA_VISIBLE_DEVICES only ever holds ordinals, for MPS clients as the DRA driver's MPS server numbers
the claim's GPUs: by sorted UUID), the HF token for gated models, and the routing labels (Services,
the gateways' discovery selectors and RBAC, budgets).
"""

from __future__ import annotations

import json
import math

import pytest
import yaml

from k8s_support import CASES, engine_deployments, env_of, flag, objects_of, of_kind, regenerate, synthetic

from scepsy.k8s.engines import ENGINE_PORTS, METRICS
from scepsy.k8s.gateway import DRAIN_LIMIT_S, SETTLE_S, membership
from scepsy.k8s.manifests import ManifestSettings, emit
from scepsy.k8s.plan_input import load_placed_plan
from scepsy.models.catalog import catalog

U = ManifestSettings().gpu_memory_utilization


def _plan_view(plan_json: dict):
    llms = {m["name"]: m for m in plan_json["llms"]}
    replicas = {(p["llm"], p["replica"]): p for p in plan_json["placement"]}
    return llms, replicas


def _reported_mib(gpu_type: str, memory_gib: float) -> int:
    return catalog.gpu(gpu_type).nvml_memory_mib or math.floor(memory_gib * 1024)


def _visible_ordinals(env: dict, visible_gpus: int) -> None:
    """CUDA_VISIBLE_DEVICES, where set, holds ordinals of what the pod sees, never UUIDs (vLLM
    parses each entry with int())."""
    for name, value in env.items():
        assert "GPU-" not in (value or ""), (name, value)
    if "CUDA_VISIBLE_DEVICES" in env:
        ordinals = [int(v) for v in env["CUDA_VISIBLE_DEVICES"].split(",")]
        assert all(0 <= o < visible_gpus for o in ordinals) and len(set(ordinals)) == len(ordinals)
        assert "CUDA_DEVICE_ORDER" not in env  # the MPS server's numbering, not the bus order


def _check_resources(container: dict, spec: dict, llm: dict, weights_gib: float, mps_client: bool) -> None:
    """CPU and memory requests and limits from the model (k8s/sizing.py), shm, priority, drain."""
    tp = llm["tp"]
    requests, limits = container["resources"]["requests"], container["resources"]["limits"]
    shm = 2 if tp == 1 else 16
    memory = f"{math.ceil(weights_gib) + 4 * (tp + 1) + shm}Gi"
    assert requests == {"cpu": str(2 + 2 * tp), "memory": memory}
    assert limits["cpu"] == str(2 * (2 + 2 * tp)) and limits["memory"] == memory
    shm_mounts = [m for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    if mps_client:
        # the MPS stack binds the daemon's shared memory at /dev/shm; a pod volume there breaks MPS
        assert shm_mounts == [] and all(v["name"] != "dshm" for v in spec["volumes"])
    else:
        dshm = next(v for v in spec["volumes"] if v["name"] == "dshm")
        assert dshm["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{shm}Gi"}
        assert shm_mounts == [{"name": "dshm", "mountPath": "/dev/shm"}]
    assert spec["priorityClassName"] == "scepsy-serving"


def _check_drain(container: dict, spec: dict, labels: dict, llm: str, engine: str, namespace: str) -> None:
    """The replica joins its gateway by its labels and leaves it drained (gateway.membership)."""
    member = membership(llm, engine, namespace)
    assert member.labels.items() <= labels.items()
    assert container["ports"][0]["containerPort"] == member.port == ENGINE_PORTS[engine]
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert tuple(command) == member.pre_stop
    assert command[3] == f"http://127.0.0.1:{ENGINE_PORTS[engine]}/metrics"
    assert command[4].split(",") == [METRICS[engine].running, METRICS[engine].waiting]
    # the grace period covers the settle time, the drain limit and the engine's own shutdown
    assert spec["terminationGracePeriodSeconds"] == member.termination_grace_s > SETTLE_S + DRAIN_LIMIT_S


def check_pods(objects: list[dict], plan_json: dict, engine: str, sharing: str, memory_gib: float, uuids: dict | None,
               weights: dict[str, float]) -> int:
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
        reported = _reported_mib(llm["gpu_type"], memory_gib)
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
        assert ("--is-embedding" in args) == (engine == "sglang" and catalog.serving_task(llm["model"]) != "generate")
        # SGLang serves /metrics only with --enable-metrics (the drain hook and the controller read it)
        assert ("--enable-metrics" in args) == (engine == "sglang")
        mps_client = (sharing == "device-plugin-mps" and share < 1) or (
            sharing == "dra-mps" and claims[spec["resourceClaims"][0]["resourceClaimName"]]["metadata"]["annotations"]["scepsy.io/mps"] == "true")
        _check_resources(container, spec, llm, weights[key[0]], mps_client)
        _check_drain(container, spec, pod["metadata"]["labels"], key[0], engine, deployment["metadata"]["namespace"])
        limits = container["resources"]["limits"]
        gpu_limits = {k: v for k, v in limits.items() if k.startswith("nvidia.com/")}
        env = env_of(container)
        node_uuids = uuids[where["node"]] if uuids else None
        annotations = pod["metadata"]["annotations"]
        # GPU share
        if sharing == "hami":
            assert spec["schedulerName"] == "hami-scheduler"
            assert gpu_limits == {"nvidia.com/gpu": len(gpus), "nvidia.com/gpucores": round(100 * share),
                                  "nvidia.com/gpumem-percentage": math.floor(100 * share + 1e-9)}
            annotation = annotations.get("nvidia.com/use-gpuuuid")
            assert annotation == (",".join(node_uuids[g] for g in gpus) if node_uuids else None)
            assert annotations["scepsy.io/gpu-pinning"] == ("uuid" if node_uuids else f"none: node {where['node']} lists no gpu_uuids; run scepsy topology on it")
            _visible_ordinals(env, len(gpus))
        elif sharing == "dra-mps":
            assert gpu_limits == {}
            claim = claims[spec["resourceClaims"][0]["resourceClaimName"]]
            claim_gpus = [int(g) for g in claim["metadata"]["annotations"]["scepsy.io/gpus"].split(",")]
            assert claim["metadata"]["annotations"]["scepsy.io/node"] == where["node"]
            assert set(gpus) <= set(claim_gpus)
            request = claim["spec"]["devices"]["requests"][0]
            device = request.get("exactly", request)
            assert device["count"] == len(claim_gpus)
            if node_uuids:
                for g in claim_gpus:
                    assert f'"{node_uuids[g]}"' in device["selectors"][0]["cel"]["expression"]
            else:
                assert "selectors" not in device
            shared = claim["metadata"]["annotations"]["scepsy.io/mps"] == "true"
            assert shared == (share < 1 or len(claim_gpus) > len(gpus))
            if shared:
                # the MPS server numbers the claim's GPUs by their UUIDs sorted as strings (the DRA
                # driver's prepared.go); without UUIDs, in plan order
                order = sorted(claim_gpus, key=lambda g: (node_uuids or [])[g]) if node_uuids else claim_gpus
                assert env["CUDA_VISIBLE_DEVICES"] == ",".join(str(order.index(g)) for g in gpus)
                assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == str(round(100 * share))
                mib = math.floor(share * reported + 1e-9)  # from the memory the GPU reports
                assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == ",".join(f"{i}={mib}M" for i in range(len(gpus)))
                mps = claim["spec"]["devices"]["config"][0]["opaque"]["parameters"]["sharing"]["mpsConfig"]
                assert mps["defaultActiveThreadPercentage"] >= round(100 * share)
                assert int(mps["defaultPinnedDeviceMemoryLimit"].removesuffix("Mi")) <= reported
            else:
                assert "config" not in claim["spec"]["devices"]  # a plain claim: no MPS for whole GPUs
                assert not any(k.startswith("CUDA_") for k in env)
            _visible_ordinals(env, len(claim_gpus))
        elif sharing == "device-plugin-mps":
            assert gpu_limits == {"nvidia.com/gpu": 1 if share < 1 else len(gpus)}
            plugin = next(c for c in of_kind(objects, "ConfigMap") if c["metadata"]["name"] == "scepsy-device-plugin-config")
            assert "default" in plugin["data"]
            if share < 1:
                assert any(f"replicas: {round(1 / share)}" in text for text in plugin["data"].values())
            _visible_ordinals(env, len(gpus))
        else:
            assert share == 1 and gpu_limits == {"nvidia.com/gpu": len(gpus)}
            _visible_ordinals(env, len(gpus))
        # gated models need the HF token Secret: a missing Secret stops the pod with a clear event
        token = next(e for e in container["env"] if e["name"] == "HF_TOKEN")["valueFrom"]["secretKeyRef"]
        assert token["optional"] == (not llm["model"].startswith("meta-llama/"))
    assert seen == set(placed), "every placed replica has exactly one Deployment"
    return len(seen)


def check_inference_gateway(objects: list[dict], plan_json: dict, engine: str) -> None:
    """`--router inference-gateway` with its defaults (Istio, llm-d-router's picker, two pickers):
    per LLM an InferencePool over exactly its replica pods on the engine port, its leader-elected
    endpoint pickers (Service, Deployment, RBAC with leases, config whose parsers take every path),
    a DestinationRule that speaks TLS to them, and an HTTPRoute that sends every path of requests
    whose body-based-routing header names the LLM to that pool."""
    llms, _ = _plan_view(plan_json)
    namespace = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "scepsy-plan")["metadata"]["namespace"]
    pods = [(d["metadata"]["name"], d["spec"]["template"]["metadata"]["labels"]) for d in of_kind(objects, "Deployment")]
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objects if "metadata" in o}
    assert not [d for d in of_kind(objects, "Deployment") if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"]
    assert ("ServiceAccount", "scepsy-gateway") not in by_name
    engine_grace = {d["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] for d in of_kind(objects, "Deployment")
                    if d["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"}

    def selected(selector: dict) -> set[str]:
        return {name for name, labels in pods if selector.items() <= labels.items()}

    for name, llm in llms.items():
        pool = by_name[("InferencePool", name)]["spec"]
        assert selected(pool["selector"]["matchLabels"]) == {f"{name}-r{k}" for k in range(llm["replicas"])}
        assert pool["targetPorts"] == [{"number": ENGINE_PORTS[engine]}]
        picker = pool["endpointPickerRef"]
        assert picker["name"] == f"{name}-epp" and picker["port"] == {"number": 9002}
        service = by_name[("Service", f"{name}-epp")]["spec"]
        assert {p["port"] for p in service["ports"]} == {9002, 9090}
        assert selected(service["selector"]) == {f"{name}-epp"}
        deployment = by_name[("Deployment", f"{name}-epp")]["spec"]
        assert deployment["replicas"] == 2 and deployment["strategy"] == {"type": "Recreate"}
        epp = deployment["template"]["spec"]
        container = epp["containers"][0]
        args = container["args"]
        assert flag(args, "--pool-name") == name and flag(args, "--pool-namespace") == namespace
        assert "--ha-enable-leader-election" in args
        assert container["image"] == "ghcr.io/llm-d/llm-d-router-endpoint-picker:v0.10.0"
        # leader election: only the leader is ready, so the Service sends to it
        assert container["readinessProbe"]["grpc"] == {"port": 9003, "service": "readiness"}
        assert container["livenessProbe"]["grpc"] == {"port": 9003, "service": "liveness"}
        assert {epp["terminationGracePeriodSeconds"]} == engine_grace
        assert epp["serviceAccountName"] == f"{name}-epp"
        rules = by_name[("Role", f"{name}-epp")]["rules"]
        assert {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]} in rules
        assert any(r["resources"] == ["inferencepools"] for r in rules)
        assert any(r["apiGroups"] == ["llm-d.ai"] and "inferenceobjectives" in r["resources"] for r in rules)
        assert any(r["apiGroups"] == ["coordination.k8s.io"] and r["resources"] == ["leases"] and "update" in r["verbs"] for r in rules)
        config = yaml.safe_load(by_name[("ConfigMap", f"{name}-epp")]["data"]["default-plugins.yaml"])
        assert config["apiVersion"] == "llm-d.ai/v1alpha1"
        assert config["requestHandler"]["parsers"] == [{"pluginRef": "openai-parser"}, {"pluginRef": "passthrough-parser"}]
        extractor = next(p for p in config["plugins"] if p["type"] == "core-metrics-extractor")
        assert extractor.get("parameters", {}).get("defaultEngine", "vllm") == engine
        rule = by_name[("DestinationRule", f"{name}-epp")]["spec"]
        assert rule["host"] == f"{name}-epp.{namespace}.svc.cluster.local"
        assert rule["trafficPolicy"]["tls"] == {"mode": "SIMPLE", "insecureSkipVerify": True}
        route = by_name[("HTTPRoute", name)]["spec"]
        assert route["parentRefs"] == [{"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}]
        (route_rule,) = route["rules"]
        assert route_rule["backendRefs"] == [{"group": "inference.networking.k8s.io", "kind": "InferencePool", "name": name}]
        assert route_rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"},
                                          "headers": [{"type": "Exact", "name": "X-Gateway-Model-Name", "value": name}]}]
        assert route_rule["timeouts"] == {"request": "600s"}


def check_routing(objects: list[dict], plan_json: dict, engine: str) -> None:
    """Routing labels: each LLM's Service selects its gateway (or, for a vLLM reranker, its
    engines), each gateway's discovery selector picks exactly its LLM's replica pods in its
    namespace on their engine port, the gateways run with a ServiceAccount allowed to watch pods,
    and the policy fits the model."""
    llms, placed = _plan_view(plan_json)
    namespace = next(o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "scepsy-plan")["metadata"]["namespace"]
    pods = [(d["metadata"]["name"], d["spec"]["template"]["metadata"]["labels"]) for d in of_kind(objects, "Deployment")]
    services = {s["metadata"]["name"]: s for s in of_kind(objects, "Service")}
    assert not [s for s in services.values() if "scepsy.io/replica" in s["spec"]["selector"]], "no per-replica Services"

    def selected(service: dict) -> set[str]:
        return {name for name, labels in pods if service["spec"]["selector"].items() <= labels.items()}

    gateways = {d["metadata"]["labels"]["scepsy.io/llm"]: d for d in of_kind(objects, "Deployment")
                if d["metadata"]["labels"]["app.kubernetes.io/component"] == "gateway"}
    for name, llm in llms.items():
        replicas = {f"{name}-r{k}" for k in range(llm["replicas"])}
        assert {(n, k) for n, k in placed if n == name} == {(name, k) for k in range(llm["replicas"])}
        reranker = catalog.serving_task(llm["model"]) == "score"
        if engine == "vllm" and reranker:
            assert name not in gateways and selected(services[name]) == replicas
            continue
        assert selected(services[name]) == {f"{name}-gateway"}
        assert services[name]["spec"]["ports"][0]["port"] == 30000
        args = gateways[name]["spec"]["template"]["spec"]["containers"][0]["args"]
        selector = dict(item.split("=", 1) for item in args[args.index("--selector") + 1 : args.index("--service-discovery-namespace")])
        assert selected({"spec": {"selector": selector}}) == replicas
        assert flag(args, "--service-discovery-namespace") == namespace
        assert int(flag(args, "--service-discovery-port")) == ENGINE_PORTS[engine]
        assert flag(args, "--policy") == ("cache_aware" if catalog.serving_task(llm["model"]) == "generate" else "round_robin")
        assert "--service-discovery" in args and "--worker-urls" not in args and "--enable-igw" not in args
        gateway_spec = gateways[name]["spec"]["template"]["spec"]
        assert gateway_spec["serviceAccountName"] == "scepsy-gateway"
        assert gateway_spec["terminationGracePeriodSeconds"] > int(flag(args, "--shutdown-grace-period-secs"))
        resources = gateway_spec["containers"][0]["resources"]
        # sized from nothing a plan changes (tests/test_k8s_replan.py); the whole cache-aware tree of
        # this plan's replicas stays within the 2^28 characters its memory is sized for
        cache_aware = flag(args, "--policy") == "cache_aware"
        assert resources["requests"]["memory"] == resources["limits"]["memory"] == ("2304Mi" if cache_aware else "1024Mi")
        assert (resources["requests"]["cpu"], resources["limits"]["cpu"]) == ("1", "2")
        if cache_aware:
            assert int(flag(args, "--max-tree-size")) * llm["replicas"] <= 2**28
        else:
            assert "--max-tree-size" not in args
    if gateways:
        role = next(r for r in of_kind(objects, "Role") if r["metadata"]["name"] == "scepsy-gateway")
        assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}]
        binding = next(b for b in of_kind(objects, "RoleBinding") if b["metadata"]["name"] == "scepsy-gateway")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "scepsy-gateway", "namespace": namespace}]
        assert binding["roleRef"]["name"] == "scepsy-gateway"
        accounts = [a["metadata"]["name"] for a in of_kind(objects, "ServiceAccount")]
        assert "scepsy-gateway" in accounts and set(accounts) <= {"scepsy-gateway", "scepsy-controller"}
    budgets = {b["metadata"]["name"]: b for b in of_kind(objects, "PodDisruptionBudget")}
    assert set(budgets) == {n for n, m in llms.items() if m["replicas"] > 1}
    for name, budget in budgets.items():
        assert budget["spec"]["maxUnavailable"] == 1
        assert selected({"spec": {"selector": budget["spec"]["selector"]["matchLabels"]}}) == {f"{name}-r{k}" for k in range(llms[name]["replicas"])}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_golden_pods_realise_the_plan(case):
    plan_file = regenerate.plan_path(case)
    plan = load_placed_plan(plan_file)
    memory = plan.instance.cluster.gpu_types[plan.llms[0].gpu_type].memory_gib
    weights = {m.name: m.weights_gib for m in plan.llms}
    objects = objects_of(regenerate.emit(case))
    plan_json = json.loads(plan_file.read_text())
    assert check_pods(objects, plan_json, case.engine, case.sharing, memory, None, weights) > 0
    if case.router == "inference-gateway":
        check_inference_gateway(objects, plan_json, case.engine)
    else:
        check_routing(objects, plan_json, case.engine)


@pytest.mark.parametrize("uuid_order", ["bus", "reversed"])
@pytest.mark.parametrize("sharing", ["hami", "dra-mps"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_synthetic_cluster_with_uuids_realises_the_plan(tmp_path, engine, sharing, uuid_order):
    """`reversed`: UUIDs that sort against the bus order (real UUIDs are random), so that MPS
    ordinals by sorted UUID and by bus position differ."""
    plan_file = synthetic.write_synthetic(tmp_path, nodes=3)
    uuids = {f"h100-{n:04d}": [synthetic.gpu_uuid(n, g if uuid_order == "bus" else 7 - g) for g in range(8)] for n in range(3)}
    if uuid_order == "reversed":
        instance_file = tmp_path / "instance.yaml"
        data = yaml.safe_load(instance_file.read_text())
        for node in data["cluster"]["nodes"]:
            node["gpu_uuids"] = uuids[node["name"]]
        instance_file.write_text(yaml.safe_dump(data))
    plan = load_placed_plan(plan_file)
    objects = objects_of(emit(plan, ManifestSettings(engine=engine, gpu_sharing=sharing)))
    weights = {m.name: m.weights_gib for m in plan.llms}
    assert check_pods(objects, json.loads(plan_file.read_text()), engine, sharing, 80.0, uuids, weights) == 21
    if sharing == "dra-mps":
        # per node: one claim over GPUs 0-3 (rag-gen, embed, rerank) and one over 4-7 (gen, ver)
        claims = of_kind(objects, "ResourceClaim")
        assert sorted(c["metadata"]["annotations"]["scepsy.io/gpus"] for c in claims) == ["0,1,2,3"] * 3 + ["4,5,6,7"] * 3


def test_every_object_carries_the_common_labels():
    for case in CASES[:1] + CASES[-3:]:
        for obj in objects_of(regenerate.emit(case)):
            if obj["kind"] == "Kustomization":
                continue
            labels = obj["metadata"]["labels"]
            for key in ("name", "instance", "component", "part-of", "managed-by"):
                assert f"app.kubernetes.io/{key}" in labels, (obj["kind"], obj["metadata"]["name"], key)
            assert labels["app.kubernetes.io/managed-by"] == "scepsy"
