"""Acting and the live loop of `scepsy control`, against the Kubernetes API as the apply tests are:
the real kubernetes client talking to a loopback API double (tests/support/kube_api.py) that plays
the Deployment controller and the kubelet, and a loopback double of the Prometheus HTTP API for the
rates. Time is an injected clock: every test orders events (applied, ready, deleted, drained),
none bounds a wall-clock time. Two tests read the engines through a real Prometheus instead,
scraping real vLLM servers (tests/support/vllm_server.py: one per LLM, one unbound thread each, started once
for the module) and the workflow entry in front of them.

Faults, each with a test: Prometheus unreachable, slow, no series, NaN, stale (the loop holds and
never scales down); the API server refusing or not answering an apply (retried with backoff, the
plan that runs stays); a replica that never becomes ready (the change is abandoned, the replicas it
would have replaced keep serving); the controller restarted in the middle of a change (the new one
reads the running state from the cluster).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import signal
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import httpx
from pathlib import Path

import pytest

from support import prometheus_server
from support.kube_api import KubeApi, node_object
from support.prometheus_double import PrometheusDouble, vector
from support.prometheus_server import PrometheusServer

from scepsy.control.act import Actuation, ApplyFailed, AutoscalerConflict, KubeCluster, dry_run, read_cluster
from scepsy.control.gauges import DesiredGauges
from scepsy.control.live import LiveLoop, LiveSettings
from scepsy.control.policy import ControlSettings, Observation, make_context
from scepsy.control.observe import observation as live_observation, workflow_inputs
from scepsy.control.prometheus import (
    LlmSamples,
    PrometheusClient,
    PrometheusSettings,
    freshness_query,
    rate_query,
    read_workflows,
    workflow_freshness_query,
    workflow_latency_query,
    workflow_rate_query,
)
from scepsy.k8s.apply import connect
from scepsy.k8s.manifests import ManifestSettings, build_objects
from scepsy.k8s.plan_input import placed_plan
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import load_instance
from scepsy.models.plan.document import plan_document

from conftest import INSTANCES

INSTANCE_FILE = INSTANCES / "beam-4xa6000.yaml"
NAMESPACE = "scepsy"
SETTINGS = ManifestSettings(namespace=NAMESPACE)


def _plan(gen: list[tuple[int, int]], ver: list[tuple[int, int]], share: int = 5) -> tuple[Allocation, Placement]:
    """gen replicas (replica index, gpu) with `share` tenths of a GPU each; ver replicas whole GPUs."""
    allocation = Allocation(10, (LlmAllocation("gen", "A6000", 1, share, len(gen)), LlmAllocation("ver", "A6000", 1, 10, len(ver))))
    replicas = [ReplicaPlacement("gen", k, "a6000-0", (Shard(g, share),)) for k, g in gen]
    replicas += [ReplicaPlacement("ver", k, "a6000-0", (Shard(g, 10),)) for k, g in ver]
    return allocation, Placement(10, tuple(replicas))


@pytest.fixture(scope="module")
def instance():
    return load_instance(INSTANCE_FILE)


def _objects(instance, plan: tuple[Allocation, Placement]) -> list[dict]:
    allocation, placement = plan
    raw = plan_document(str(INSTANCE_FILE), allocation, placement)
    return build_objects(placed_plan("test", raw, instance, allocation, placement), SETTINGS)


@pytest.fixture()
def api(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the dynamic client caches discovery under ~/.kube
    with KubeApi(NAMESPACE) as double:
        yield double


def _cluster(api: KubeApi, tmp_path: Path, timeout_s: float = 10.0) -> KubeCluster:
    return KubeCluster(connect(api.kubeconfig(tmp_path)), NAMESPACE, timeout_s=timeout_s)


def _deploy(api: KubeApi, instance, plan, ready: bool = True) -> list[dict]:
    """What `scepsy deploy` of the plan left running: every object, every engine pod Ready."""
    objects = _objects(instance, plan)
    for node in instance.cluster.nodes:  # the cluster's Nodes, every GPU healthy
        api.put(node_object(node.name, capacity=node.gpus, allocatable=node.gpus))
    for obj in objects:
        api.put(obj)
    for name in api.objects("Deployment"):
        if ready and name.rsplit("-", 1)[-1].startswith("r"):
            api.ready(name)
    api.events.clear()
    return objects


def _writes(api: KubeApi) -> list[tuple]:
    return [e for e in api.events if e[0] in ("apply", "delete")]


# ---------------------------------------------------------------------------------------------
# Acting


def test_read_cluster_gives_the_placement_that_runs(api, tmp_path, instance):
    running = _plan([(0, 0), (1, 1)], [(0, 2)])
    _deploy(api, instance, running)
    api.ready("gen-r1", ready=False)
    state = read_cluster(_cluster(api, tmp_path))
    allocation, placement, odd = state.running(instance)
    assert (allocation, placement, odd) == (*running, ())
    assert state.ready("gen") == 1 and state.starting("gen") == 1 and state.ready("ver") == 1
    assert state.plan is not None and state.plan["placement"] == plan_document(None, *running)["placement"]


def test_scale_up_applies_only_the_new_replica_and_raises_the_entrys_hold_and_records_the_plan_last(api, tmp_path, instance):
    before = _plan([(0, 0)], [(0, 2)])
    after = _plan([(0, 0), (1, 1)], [(0, 2)])
    baseline = _deploy(api, instance, before)
    cluster = _cluster(api, tmp_path)
    actuation = Actuation(cluster, _objects(instance, after), 0.0, 900.0, baseline=baseline)
    assert actuation.step(0.0) == "waiting" and actuation.waiting_for == ("gen-r1",)
    # the new replica and, gen having two replicas now, its disruption budget; no gateway, Service or other replica
    added = [("apply", "Deployment", "gen-r1"), ("apply", "PodDisruptionBudget", "gen")]
    assert _writes(api) == added
    assert actuation.step(60.0) == "waiting"
    assert _writes(api) == added  # nothing re-sent while it starts
    api.ready("gen-r1")
    assert actuation.step(120.0) == "done"
    # the entry lets more of gen's calls through once the replica that takes them is Ready
    assert api.events == [*added, ("ready", "gen-r1"), ("apply", "Deployment", "scepsy-entry"), ("apply", "ConfigMap", "scepsy-plan")]
    assert set(api.objects("Deployment")) == {"gen-gateway", "ver-gateway", "gen-r0", "gen-r1", "ver-r0", "scepsy-entry"}


def test_a_replaced_replica_is_deleted_only_after_its_replacement_is_ready_and_then_drains(api, tmp_path, instance):
    before = _plan([(0, 0), (1, 1)], [(0, 2)])
    after = _plan([(0, 0), (2, 3)], [(0, 2)])  # gen-r1 on GPU 1 goes, gen-r2 on GPU 3 comes
    baseline = _deploy(api, instance, before)
    actuation = Actuation(_cluster(api, tmp_path), _objects(instance, after), 0.0, 900.0, baseline=baseline)
    assert actuation.step(0.0) == "waiting"
    assert "gen-r1" in api.objects("Deployment")  # still serving
    api.ready("gen-r2")
    assert actuation.step(30.0) == "done"
    assert api.events == [("apply", "Deployment", "gen-r2"), ("ready", "gen-r2"), ("delete", "Deployment", "gen-r1"),
                          ("apply", "ConfigMap", "scepsy-plan")]
    # the removed replica's pod drains (deletionTimestamp: the gateways drop it, its preStop hook waits for its requests)
    pod = api.pod("gen-r1")
    assert pod is not None and pod["metadata"]["deletionTimestamp"]
    api.drained("gen-r1")
    state = read_cluster(_cluster(api, tmp_path))
    assert state.running(instance)[:2] == after


def test_a_removal_whose_gpus_a_new_replica_needs_goes_first(api, tmp_path, instance):
    before = _plan([(0, 0)], [(0, 2)])
    after = _plan([(0, 0)], [(1, 1)])  # ver moves from GPU 2 to GPU 1: nothing blocks, the new one waits
    baseline = _deploy(api, instance, before)
    Actuation(_cluster(api, tmp_path), _objects(instance, after), 0.0, 900.0, baseline=baseline).step(0.0)
    assert _writes(api) == [("apply", "Deployment", "ver-r1")]
    api.events.clear()
    moved = _plan([(0, 0)], [(1, 2)])  # ver-r1 needs GPU 2, where ver-r0 runs: ver-r0 leaves first
    baseline = _objects(instance, before)
    api.store.pop(next(p for p in api.store if p.endswith("/deployments/ver-r1")))
    Actuation(_cluster(api, tmp_path), _objects(instance, moved), 0.0, 900.0, baseline=baseline).step(0.0)
    assert _writes(api) == [("apply", "Deployment", "ver-r1"), ("delete", "Deployment", "ver-r0")]


def test_a_swap_of_every_replica_of_an_llm_rolls_one_at_a_time(api, tmp_path, instance):
    """gen's two whole-GPU replicas are replaced by half-GPU ones on the same GPUs: each successor
    needs its predecessor's GPU. One predecessor goes while the other serves; the second goes only
    once the first successor is Ready, so gen always has a replica serving."""
    before = _plan([(0, 0), (1, 1)], [(0, 2)], share=10)
    after = _plan([(2, 0), (3, 1)], [(0, 2)], share=5)
    baseline = _deploy(api, instance, before)
    actuation = Actuation(_cluster(api, tmp_path), _objects(instance, after), 0.0, 900.0, baseline=baseline)
    assert actuation.step(0.0) == "waiting"
    deletes = lambda: [e[2] for e in _writes(api) if e[0] == "delete"]  # noqa: E731
    assert deletes() == ["gen-r0"] and "gen-r1" in api.objects("Deployment")
    assert actuation.step(60.0) == "waiting" and deletes() == ["gen-r0"]  # gen-r1 serves until gen-r2 does
    api.ready("gen-r2")
    assert actuation.step(120.0) == "waiting" and deletes() == ["gen-r0", "gen-r1"]
    api.ready("gen-r3")
    assert actuation.step(180.0) == "done"
    state = read_cluster(_cluster(api, tmp_path))
    assert state.running(instance)[:2] == after


def test_dry_run_prints_the_diff_and_changes_nothing(api, tmp_path, instance):
    before = _plan([(0, 0), (1, 1)], [(0, 2)])
    after = _plan([(0, 0)], [(0, 2), (1, 3)])
    baseline = _deploy(api, instance, before)
    found = dry_run(_cluster(api, tmp_path), _objects(instance, after), baseline)
    assert [f"{c.action} {c.ref}" for c in found] == ["create deployment/ver-r1", "update deployment/scepsy-entry",
                                                      "create poddisruptionbudget/ver", "delete deployment/gen-r1",
                                                      "update configmap/scepsy-plan"]
    created = found[0].diff()
    assert "+++ target/deployment/ver-r1" in created and "+  name: ver-r1" in created
    assert "--max-in-flight" in found[1].diff()  # the entry's hold follows the replicas
    assert "-  name: gen-r1" in found[3].diff()
    assert api.events == []


@pytest.mark.parametrize("kind", ["HorizontalPodAutoscaler", "ScaledObject"])
def test_refuses_when_another_autoscaler_targets_the_deployments(api, tmp_path, instance, kind):
    baseline = _deploy(api, instance, _plan([(0, 0)], [(0, 2)]))
    api_version = "autoscaling/v2" if kind == "HorizontalPodAutoscaler" else "keda.sh/v1alpha1"
    spec = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "gen-r0"}, "maxReplicas": 3}
    if kind == "ScaledObject":
        spec = {"scaleTargetRef": {"name": "gen-r0"}, "triggers": []}
    api.put({"apiVersion": api_version, "kind": kind, "metadata": {"name": "gen-scaler", "namespace": NAMESPACE}, "spec": spec})
    actuation = Actuation(_cluster(api, tmp_path), _objects(instance, _plan([(0, 0), (1, 1)], [(0, 2)])), 0.0, 900.0, baseline=baseline)
    with pytest.raises(AutoscalerConflict, match=f"{kind}/gen-scaler -> deployment/gen-r0"):
        actuation.step(0.0)
    assert _writes(api) == []


def test_a_replica_that_never_becomes_ready_is_abandoned_and_the_old_ones_keep_serving(api, tmp_path, instance):
    before = _plan([(0, 0), (1, 1)], [(0, 2)])
    after = _plan([(0, 0), (2, 3)], [(0, 2)])
    baseline = _deploy(api, instance, before)
    actuation = Actuation(_cluster(api, tmp_path), _objects(instance, after), 0.0, 600.0, baseline=baseline)
    assert actuation.step(0.0) == "waiting"
    api.ready("gen-r2", ready=False)  # its readiness probe keeps failing
    assert actuation.step(599.0) == "waiting"
    assert actuation.step(600.0) == "stuck"
    assert "gen-r2 not ready after 600 s" in (actuation.problem or "")
    assert _writes(api) == [("apply", "Deployment", "gen-r2"), ("delete", "Deployment", "gen-r2")]
    assert {"gen-r0", "gen-r1"} <= set(api.objects("Deployment"))  # never deleted


def test_an_apply_the_api_server_refuses_or_does_not_answer_fails_typed(api, tmp_path, instance):
    baseline = _deploy(api, instance, _plan([(0, 0)], [(0, 2)]))
    target = _objects(instance, _plan([(0, 0), (1, 1)], [(0, 2)]))
    api.refuse.add(("Deployment", "gen-r1"))
    with pytest.raises(ApplyFailed, match="refused Deployment/gen-r1"):
        Actuation(_cluster(api, tmp_path), target, 0.0, 900.0, baseline=baseline).step(0.0)
    api.refuse.clear()
    api.hang.set()
    with pytest.raises(ApplyFailed, match="gen-r1"):
        Actuation(_cluster(api, tmp_path, timeout_s=0.5), target, 0.0, 900.0, baseline=baseline).step(0.0)
    assert _writes(api) == []


# ---------------------------------------------------------------------------------------------
# The live loop


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def prometheus():
    double = PrometheusDouble()
    yield double
    double.close()


def _rates(prometheus: PrometheusDouble, gen: float | str, ver: float | str, at: float = 1000.0, age_s: float = 1.0) -> None:
    settings = PrometheusSettings(prometheus.url)
    prometheus.answers[rate_query(settings)] = [(200, vector([("gen", at, str(gen)), ("ver", at, str(ver))]))]
    prometheus.answers[freshness_query(settings)] = [(200, vector([("gen", at, str(at - age_s)), ("ver", at, str(at - age_s))]))]


def _loop(api, tmp_path, instance, prometheus, clock, said, act: str = "apply", client: PrometheusClient | None = None,
          **live) -> tuple[LiveLoop, io.StringIO]:
    log = io.StringIO()
    settings = ControlSettings(period_s=60.0, startup_s=60.0, stabilization_s=0.0, predictor="constant")
    allocation, _ = _plan([(0, 0)], [(0, 2)])
    context = make_context(instance, settings, slos_s={"beam": 60.0}, allocation=allocation, plan_time_limit_s=10.0)
    client = client or PrometheusClient(PrometheusSettings(prometheus.url, timeout_s=0.5, attempts=2, backoff_s=1.0), sleep=lambda s: None)
    loop = LiveLoop(context, _cluster(api, tmp_path), client, SETTINGS, LiveSettings(act=act, **live), log, said.append,
                    said.append, clock, str(INSTANCE_FILE), gauges=DesiredGauges())
    return loop, log


def _records(log: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in log.getvalue().splitlines()]


def test_the_loop_holds_on_missing_data_and_never_scales_down(api, tmp_path, instance, prometheus):
    """Over-provisioned for a tiny load: with rates it scales down; without (unreachable, slow, no
    series, NaN, stale) it holds, writes nothing, and says why on stderr and in the log."""
    _deploy(api, instance, _plan([(0, 0), (1, 1)], [(0, 2), (1, 3)]))
    said: list[str] = []
    clock = Clock()
    loop, log = _loop(api, tmp_path, instance, prometheus, clock, said)
    loop.start()
    faults = {
        "unreachable": lambda: prometheus.close(),
        "no series": lambda: _rates(prometheus, 0.01, 0.01) or prometheus.answers.pop(rate_query(PrometheusSettings(prometheus.url))),
        "nan": lambda: _rates(prometheus, "NaN", 0.01),
        "stale": lambda: _rates(prometheus, 0.01, 0.01, age_s=3600.0),
        "timeout": lambda: prometheus.hang.set(),
    }
    for reason in ("no series", "nan", "stale", "timeout", "unreachable"):
        faults[reason]()
        clock.now += 60.0
        record = loop.period()
        assert record["action"] == "hold", record
        assert any(reason in line for line in said), (reason, said)
        said.clear()
    assert _writes(api) == []
    records = _records(log)
    assert records[0]["event"] == "start" and records[0]["replicas"] == {"gen": 2, "ver": 2}
    assert [r["action"] for r in records[1:]] == ["hold"] * 5
    assert records[2]["missing"]["gen"].startswith("nan")


def test_the_loop_scales_down_on_good_data_and_logs_the_inputs(api, tmp_path, instance, prometheus):
    _deploy(api, instance, _plan([(0, 0), (1, 1)], [(0, 2), (1, 3)]))
    said: list[str] = []
    clock = Clock()
    loop, log = _loop(api, tmp_path, instance, prometheus, clock, said)
    _rates(prometheus, 0.05, 0.03)
    clock.now = 60.0
    record = loop.period()
    assert record["action"] == "replan" and record["reason"].startswith("scale down"), record
    assert record["inputs"]["llm_rates_rps"] == {"gen": 0.05, "ver": 0.03}
    act = record["act"]
    if act["phase"] == "waiting":  # new replicas start; the ones they replace serve meanwhile
        for name in act["waiting_for"]:
            api.ready(name)
        clock.now = 120.0
        record = loop.period()
        assert record["action"] == "acting" and record["act"]["phase"] == "done"
    assert api.events[-1] == ("apply", "ConfigMap", "scepsy-plan")
    assert [r["event"] for r in _records(log)] == ["start"] + ["period"] * loop.periods
    state = read_cluster(loop.cluster)
    assert state.running(instance)[0].units < _plan([(0, 0), (1, 1)], [(0, 2), (1, 3)])[0].units


def test_a_refused_apply_is_retried_with_backoff_and_the_plan_that_runs_stays(api, tmp_path, instance, prometheus):
    _deploy(api, instance, _plan([(0, 0)], [(0, 2)], share=1))
    said: list[str] = []
    clock = Clock()
    loop, log = _loop(api, tmp_path, instance, prometheus, clock, said, retry_s=30.0, max_retry_s=600.0)
    _rates(prometheus, 50.0, 30.0)  # far more than one tenth of a GPU serves: scale up
    api.refuse.update({("Deployment", f"gen-r{k}") for k in range(8)} | {("Deployment", f"ver-r{k}") for k in range(8)})
    clock.now = 60.0
    first = loop.period()
    assert first["action"] == "replan" and first["act"]["phase"] == "failed" and first["act"]["retry_at_s"] == 90.0
    assert any("could not apply" in line for line in said)
    clock.now = 80.0
    assert loop.period()["act"]["phase"] == "backoff"  # not before 90 s
    clock.now = 90.0
    second = loop.period()
    assert second["act"]["phase"] == "failed" and second["act"]["retry_at_s"] == 150.0  # 30 s, then 60 s
    assert _writes(api) == [] and {"gen-r0", "ver-r0"} <= set(api.objects("Deployment"))
    api.refuse.clear()
    clock.now = 150.0
    third = loop.period()
    assert third["act"]["phase"] == "waiting" and third["act"]["applied"]


def test_a_restarted_controller_reads_the_change_in_progress_from_the_cluster(api, tmp_path, instance, prometheus):
    """The first controller starts a scale-up and dies before the new replicas are Ready. The
    second reads the cluster: the old replica serves, the new ones start (they count, as starting),
    the plan ConfigMap still records the old plan; it keeps them, and once they are Ready it decides
    from them, never deleting what the first one started."""
    _deploy(api, instance, _plan([(0, 0)], [(0, 2)], share=1))
    said: list[str] = []
    clock = Clock()
    first, _ = _loop(api, tmp_path, instance, prometheus, clock, said)
    _rates(prometheus, 50.0, 30.0)  # far more than a tenth of a GPU serves: scale up
    clock.now = 60.0
    record = first.period()
    assert record["action"] == "replan" and record["act"]["phase"] == "waiting"
    added = record["act"]["waiting_for"]
    assert added and "gen-r0" not in added and "ver-r0" not in added
    del first  # the controller dies here: its memory is gone

    api.events.clear()
    clock.now = 120.0
    second, log = _loop(api, tmp_path, instance, prometheus, clock, said)
    start = second.start()
    assert start["plan_configmap_matches"] is False  # the change never completed
    assert sum(start["replicas"].values()) == 2 + len(added)
    assert sum(start["starting"].values()) == len(added) and start["ready"] == {"gen": 1, "ver": 1}
    assert start["left_out"] == [] and "reconcile" not in start
    for name in added:
        api.ready(name)
    clock.now = 180.0
    again = second.period()
    assert again["inputs"]["ready_replicas"] == start["replicas"]
    assert not [e for e in api.events if e[0] == "delete" and e[2] in added]


def test_a_restart_in_the_middle_of_a_change_of_shape_rolls_it_back(api, tmp_path, instance, prometheus):
    """gen-r1 (half a GPU) was being replaced by gen-r2 (a whole GPU) when the controller died: the
    new one keeps the shape most replicas have, removes gen-r2 once the others are Ready, and
    decides again from what serves."""
    _deploy(api, instance, _plan([(0, 0), (1, 1)], [(0, 2)]))
    half = _objects(instance, _plan([(0, 0), (1, 1)], [(0, 2)]))
    whole = _objects(instance, (Allocation(10, (LlmAllocation("gen", "A6000", 1, 10, 1), LlmAllocation("ver", "A6000", 1, 10, 1))),
                                Placement(10, (ReplicaPlacement("gen", 2, "a6000-0", (Shard(3, 10),)),
                                               ReplicaPlacement("ver", 0, "a6000-0", (Shard(2, 10),))))))
    api.put(next(o for o in whole if o["metadata"]["name"] == "gen-r2"))
    api.events.clear()
    said: list[str] = []
    clock = Clock()
    _rates(prometheus, 1.0, 0.7)
    loop, log = _loop(api, tmp_path, instance, prometheus, clock, said)
    start = loop.start()
    assert start["replicas"] == {"gen": 2, "ver": 1} and start["left_out"] == ["gen-r2"] and start["reconcile"] is True
    assert start["plan_configmap_matches"] is False
    assert any("interrupted" in line for line in said)
    clock.now = 60.0
    record = loop.period()
    assert record["action"] == "acting" and record["act"]["phase"] == "done"
    assert _writes(api) == [("delete", "Deployment", "gen-r2"), ("apply", "ConfigMap", "scepsy-plan")]
    assert {o["metadata"]["name"] for o in half if o["kind"] == "Deployment"} <= set(api.objects("Deployment"))
    clock.now = 120.0
    assert loop.period()["action"] in ("keep", "replan")  # the policy decides again


# ---------------------------------------------------------------------------------------------
# The API (what the CLI calls)


def _plan_file(tmp_path: Path, instance, plan: tuple[Allocation, Placement]) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan_document(str(INSTANCE_FILE), *plan)))
    return path


def test_api_control_dry_run_prints_the_diff_logs_each_period_and_writes_nothing(api, tmp_path, instance, prometheus):
    from scepsy import api as scepsy_api

    running = _plan([(0, 0)], [(0, 2)])
    _deploy(api, instance, running)
    _rates(prometheus, 90.0, 60.0)  # far more than the instance's rates: scale up
    shown: list[str] = []
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds

    log = tmp_path / "decisions.jsonl"
    run = scepsy_api.control(INSTANCE_FILE, _plan_file(tmp_path, instance, running), prometheus_url=prometheus.url,
                             kubeconfig=api.kubeconfig(tmp_path), act="dry-run", log=log, periods=2,
                             policy=scepsy_api.control_settings(predictor="constant"), show=shown.append, clock=clock, sleep=sleep)
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert run.periods == 2 and [r["event"] for r in records] == ["start", "period", "period"]
    assert [r["time_s"] for r in records[1:]] == [0.0, ControlSettings().period_s]  # one period every period_s of the injected clock
    assert records[1]["action"] == "replan" and records[1]["act"]["mode"] == "dry-run"
    creates = [c for c in records[1]["act"]["changes"] if c.startswith("create deployment/")]
    assert creates and f"dry run: {creates[0]}" in shown
    assert any(line.startswith("--- live/") and "+++ target/" in line for line in shown)  # the diffs
    assert _writes(api) == []  # nothing applied or deleted
    # nothing changed, so the next period decides the same from what runs
    assert records[2]["action"] == "replan" and records[2]["act"]["changes"] == records[1]["act"]["changes"]
    assert scepsy_api.control_run_document(run)["actions"] == {"replan": 2}


def test_api_control_refuses_beside_an_hpa_with_one_line(api, tmp_path, instance, prometheus):
    from scepsy import api as scepsy_api
    from scepsy.models.errors import InputError

    running = _plan([(0, 0)], [(0, 2)])
    _deploy(api, instance, running)
    spec = {"scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ver-r0"}, "maxReplicas": 3}
    api.put({"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler", "metadata": {"name": "ver", "namespace": NAMESPACE}, "spec": spec})
    with pytest.raises(InputError, match="HorizontalPodAutoscaler/ver -> deployment/ver-r0"):
        scepsy_api.control(INSTANCE_FILE, _plan_file(tmp_path, instance, running), prometheus_url=prometheus.url,
                           kubeconfig=api.kubeconfig(tmp_path), log=tmp_path / "log.jsonl", periods=1, sleep=lambda s: None)
    assert _writes(api) == []


def test_api_control_refuses_slos_it_cannot_derive(api, tmp_path, instance, prometheus):
    """The instance has no latency_slo_s; twice the predicted latency of an overloaded plan is no SLO."""
    from scepsy import api as scepsy_api
    from scepsy.models.errors import InputError

    overloaded = _plan([(0, 0)], [(0, 2)], share=1)
    with pytest.raises(InputError, match="latency_slo_s"):
        scepsy_api.control(INSTANCE_FILE, _plan_file(tmp_path, instance, overloaded), prometheus_url=prometheus.url,
                           kubeconfig=api.kubeconfig(tmp_path), log=tmp_path / "log.jsonl", periods=1, sleep=lambda s: None)


# Real vLLM servers (tests/support/vllm_server.py) behind a real Prometheus: one server per LLM of
# the plan, one unbound thread each, started once for the module and shared by the two tests below. The KV
# cache of 4,096 tokens is 32 blocks of which vLLM keeps one back, so a request may be 2,048 tokens
# long (the cache's 4,096 would not fit in the 31 blocks left).
BATCH = 2  # each server's batch slots (`--max-num-seqs`): a few long calls fill it and queue behind it
LOAD_PER_LLM = 3 * BATCH  # concurrent long calls of the loaded phase: a batch running, two queued
LONG_CALL = 1024  # tokens: a thousand engine steps per batch
WINDOW_S = 600.0  # the loop's rate window and staleness limit here: every scrape of a test
ENGINE_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


@pytest.fixture(scope="module")
def engines(vllm) -> dict:
    """LLM -> its real vLLM server (served under the LLM's name, as the manifests serve it)."""
    return {llm: vllm(llm, 1, cache_tokens=4096, max_model_len=2048, max_num_seqs=BATCH)[0] for llm in ("gen", "ver")}


def _chat(url: str, llm: str, text: str, max_tokens: int = 2, headers: dict | None = None, client: httpx.Client | None = None) -> None:
    """One chat completion of exactly `max_tokens` tokens (`ignore_eos`: the tiny Llama's text is random)."""
    body = {"model": llm, "messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "ignore_eos": True}
    response = (client or httpx).post(url + "/v1/chat/completions", json=body, headers=headers or {}, timeout=600.0)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == max_tokens


def _engine_metrics(server) -> dict[str, float]:
    """What the engine's own `GET /metrics` says: each sample name summed over its series, and each
    `vllm:request_success_total` also per `finished_reason` (`vllm:request_success_total{length}`)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(httpx.get(server.url + "/metrics", timeout=30.0).text):
        for sample in family.samples:
            assert sample.labels.get("model_name") in (None, server.name), sample
            keys = [sample.name]
            if "finished_reason" in sample.labels:
                keys.append(f"{sample.name}{{{sample.labels['finished_reason']}}}")
            for key in keys:
                out[key] = out.get(key, 0.0) + sample.value
    return out


def _scraped(server: PrometheusServer, metrics: tuple[str, ...]) -> dict[tuple[str, str], float]:
    """(metric, model_name) -> the value Prometheus holds now, summed over the other labels."""
    found = server.query('sum by (__name__, model_name) ({__name__=~"' + "|".join(metrics) + '"})')
    return {(s["metric"]["__name__"], s["metric"]["model_name"]): float(s["value"][1]) for s in found}


def _wait_scraped(server: PrometheusServer, engines: dict, metrics: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """Until Prometheus holds what each engine's /metrics says now, for each of `metrics`; returns it."""
    now: dict[str, dict[str, float]] = {}

    def same() -> bool:
        now.update({llm: _engine_metrics(engine) for llm, engine in engines.items()})
        return _scraped(server, metrics) == {(m, llm): now[llm][m] for llm in engines for m in metrics}

    server._poll(same, f"Prometheus to hold the engines' {', '.join(metrics)}")
    return now


@contextlib.contextmanager
def _frozen(engine):
    """The processes under the engine's API server stopped (SIGSTOP) and then continued: a stopped
    engine core schedules nothing, so its API server's /metrics keeps the gauges of the engine's
    last step while Prometheus scrapes them."""
    import psutil

    stopped = psutil.Process(engine.process.pid).children(recursive=True)
    try:
        for process in stopped:
            process.send_signal(signal.SIGSTOP)
        yield
    finally:
        for process in stopped:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGCONT)


def _stop_loaded(engine, server: PrometheusServer, stack: contextlib.ExitStack, calls: list[Future], call: Callable[[], Future]) -> None:
    """Stop the engine (`_frozen`, continued when `stack` closes) at a moment when it runs calls and
    queues more than a batch behind them. Each try first tops its long calls up to LOAD_PER_LLM
    outstanding (`call` sends one, `calls` keeps every one sent), then stops the engine and reads
    its own /metrics while it is stopped (a loaded API server may answer late, after the calls it
    saw have finished), and continues it unless they say so. More than a batch queued leaves calls
    queued should a batch finish on a step the API server had yet to record when the engine stopped."""

    def stopped_loaded() -> bool:
        calls.extend(call() for _ in range(LOAD_PER_LLM - sum(not c.done() for c in calls)))
        with contextlib.ExitStack() as attempt:
            attempt.enter_context(_frozen(engine))
            metrics = _engine_metrics(engine)
            if metrics["vllm:num_requests_running"] > 0 and metrics["vllm:num_requests_waiting"] > BATCH:
                stack.enter_context(attempt.pop_all())  # stays stopped
                return True
        return False

    server._poll(stopped_loaded, f"{engine.name} to run calls and queue more than a batch")


@pytest.mark.skipif(not prometheus_server.available(), reason="the Debian package prometheus is not installed (.ci/run installs it)")
def test_the_loop_reads_a_real_prometheus_scraping_real_vllm_servers(api, tmp_path, instance, prometheus, monkeypatch, engines):
    """The whole observe path with real parts: a real vLLM server per LLM exports its metrics, a
    real Prometheus scrapes them, and the loop reads through its HTTP API, for each LLM, every
    quantity of k8s/engines.py METRICS: the rate of finished requests
    (`vllm:request_success_total`), the mean call latency (`vllm:e2e_request_latency_seconds`),
    the queue (`vllm:num_requests_waiting`), the running batch (`vllm:num_requests_running`) and
    the KV-cache usage (`vllm:kv_cache_usage_perc`); the policy gets them (the decision log's
    inputs, the observation it decides on), each equal to what the engine's own /metrics says.

    Short calls finish first (6 to gen, 3 to ver: the rates and latencies); then each server gets
    more concurrent long calls than it has batch slots, and its engine core is stopped while it runs
    some and queues the rest, so that the gauges the loop reads are a loaded engine's and hold
    still until they are compared."""

    from scepsy.control import live

    observed: list[tuple[Observation, LlmSamples]] = []

    def recorded(*args, **kwargs) -> Observation:  # the observation the loop hands the policy, and its samples
        seen = live_observation(*args, **kwargs)
        observed.append((seen, args[2]))
        return seen

    monkeypatch.setattr(live, "observation", recorded)

    _deploy(api, instance, _plan([(0, 0)], [(0, 2)]))
    calls = {"gen": 6, "ver": 3}
    latency = ("vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count")
    with PrometheusServer(tmp_path / "prometheus", {llm: [e.host] for llm, e in engines.items()}) as server, \
            ThreadPoolExecutor(4 * LOAD_PER_LLM) as pool, httpx.Client(limits=httpx.Limits(max_connections=64)) as client:
        server.wait_for_targets(2)
        counted = ("vllm:request_success_total", *latency)
        before = _wait_scraped(server, engines, counted)  # the counters scraped before any call of this test
        for llm, count in calls.items():
            for i in range(count):
                _chat(engines[llm].url, llm, f"step {i}")
        after = _wait_scraped(server, engines, counted)
        loads: dict[str, list[Future]] = {llm: [] for llm in engines}
        with contextlib.ExitStack() as stopped:
            for llm, engine in engines.items():
                _stop_loaded(engine, server, stopped, loads[llm],
                             lambda llm=llm, engine=engine: pool.submit(_chat, engine.url, llm, "long", LONG_CALL, client=client))
            frozen = _wait_scraped(server, engines, (*ENGINE_GAUGES, *counted))
            said: list[str] = []
            loop, log = _loop(api, tmp_path, instance, prometheus, Clock(), said,
                              client=PrometheusClient(PrometheusSettings(server.url, window_s=WINDOW_S, max_age_s=WINDOW_S)))
            record = loop.period()
        for load in (load for calls in loads.values() for load in calls):  # the long calls finish once the engines run again
            load.result()
    for llm, count in calls.items():
        # real vLLM counts a call that stops at max_tokens as finished_reason="length"
        assert after[llm]["vllm:request_success_total{length}"] - before[llm]["vllm:request_success_total{length}"] == count
        assert after[llm]["vllm:request_success_total"] - before[llm]["vllm:request_success_total"] == count
        assert frozen[llm]["vllm:num_requests_running"] > 0 and frozen[llm]["vllm:num_requests_waiting"] > 0, frozen[llm]
        assert 0 < frozen[llm]["vllm:kv_cache_usage_perc"] <= 1, frozen[llm]
    assert record["missing"] == {} and said == []
    rates = record["inputs"]["llm_rates_rps"]
    assert record["inputs"]["ready_replicas"] == {"gen": 1, "ver": 1}
    [(seen, samples)] = observed
    assert seen.llm_rates_rps == rates
    assert seen.llm_latency_s is not None and sorted(seen.llm_latency_s) == ["gen", "ver"]
    # What the engines' own counters say over the scrapes Prometheus holds: from the first, taken
    # before any call of this test, to the last, of the stopped engine (the short calls and any long
    # one that finished before its engine stopped). Prometheus extrapolates each increase beyond
    # its first and last samples, by half a scrape interval or less at the start and by a scrape
    # interval or less at the end; over the three scrapes or more the test waits for (the first, one
    # after the short calls, one of the stopped engine) that is less than 80 % more, and for `_sum` and `_count`, scraped
    # together, a quarter apart at most.
    for llm in engines:
        finished = frozen[llm]["vllm:request_success_total"] - before[llm]["vllm:request_success_total"]
        assert finished / WINDOW_S * (1 - 1e-9) <= rates[llm] <= 1.8 * finished / WINDOW_S, (llm, finished, rates[llm])
        mean = (frozen[llm][latency[0]] - before[llm][latency[0]]) / (frozen[llm][latency[1]] - before[llm][latency[1]])
        read = seen.llm_latency_s[llm]
        assert read is not None and math.isfinite(read) and read > 0
        assert read == pytest.approx(mean, rel=0.25)
        waiting, running, kv = (frozen[llm][m] for m in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"))
        assert samples.waiting[llm] == waiting and samples.running[llm] == running and samples.kv_usage[llm] == kv
        assert seen.waiting_requests is not None and seen.waiting_requests[llm] == waiting
        assert seen.queue_per_replica is not None and seen.queue_per_replica[llm] == waiting  # one ready replica
        assert seen.kv_usage is not None and seen.kv_usage[llm] == kv


@pytest.mark.skipif(not prometheus_server.available(), reason="the Debian package prometheus is not installed (.ci/run installs it)")
def test_the_loop_reads_the_entrys_workflow_rate_through_a_real_prometheus(api, tmp_path, instance, prometheus, engines):
    """Real parts: `scepsy proxy` (the workflow entry) in front of real vLLM servers, a real
    Prometheus scraping the entry's and the engines' /metrics, workflow requests (a gen and a ver
    call under one X-Workflow-Id) sent through the entry; the loop's policy plans on the entry's
    workflow rate, and the mean latency of the finished ones is read, both through a selector."""
    from scepsy.tracing.capture.proxy import ProxyConfig, ServerThread, create_app as proxy_app

    _deploy(api, instance, _plan([(0, 0)], [(0, 2)]))
    with ServerThread(proxy_app(ProxyConfig({llm: e.url for llm, e in engines.items()}, workflow_done_s=0.001))) as entry:
        targets = {llm: [e.host] for llm, e in engines.items()} | {"entry": [entry.url.removeprefix("http://")]}
        with PrometheusServer(tmp_path / "prometheus", targets) as server:
            server.wait_for_targets(3)
            _wait_scraped(server, engines, ("vllm:request_success_total",))  # scraped before this test's calls

            def workflow_request(k: int) -> None:
                headers = {"X-Workflow-Id": f"request-{k}", "X-Workflow-Name": "beam"}
                for llm in ("gen", "ver"):
                    _chat(entry.url, llm, f"step {k}", headers=headers)

            def seen(total: float):  # arrived and finished (the entry observes a finished one at the scrape after it)
                return lambda found: {s["metric"]["__name__"]: float(s["value"][1]) for s in found} == {
                    "scepsy_entry_requests_total": total, "scepsy_entry_request_duration_seconds_count": total}

            query = '{__name__=~"scepsy_entry_requests_total|scepsy_entry_request_duration_seconds_count"}'
            workflow_request(0)  # the series start at the first workflow request: a rate needs a later increase
            server.wait_for(query, seen(1.0))
            for k in range(1, 5):
                workflow_request(k)
            server.wait_for(query, seen(5.0))
            _wait_scraped(server, engines, ("vllm:request_success_total",))  # the engines' counters of these calls too
            # the test helper names each scrape job engines-<target>: the selector keeps all three
            client = PrometheusClient(PrometheusSettings(server.url, window_s=600.0, max_age_s=600.0, selector='job=~"engines-.*"'))
            said: list[str] = []
            loop, log = _loop(api, tmp_path, instance, prometheus, Clock(), said, client=client)
            record = loop.period()
            flows = read_workflows(client, ["beam"])
    assert record["missing"] == {} and record["workflow_missing"] == {} and said == []
    assert record["inputs"]["rates_from"] == "workflow counters"
    assert record["inputs"]["workflow_rates_rps"]["beam"] > 0
    rates, latency = workflow_inputs(flows)
    assert rates is not None and latency is not None
    assert (rates["beam"] or 0) > 0 and 0 < (latency["beam"] or 0) < 60


def _entry(prometheus: PrometheusDouble, workflow_rps: float, latency_s: float, at: float = 1000.0) -> None:
    """The entry's metrics as Prometheus answers them: beam's arrival rate, fresh, and mean latency."""
    settings = PrometheusSettings(prometheus.url)
    prometheus.answers[workflow_rate_query(settings)] = [(200, vector([("beam", at, str(workflow_rps))], "workflow"))]
    prometheus.answers[workflow_freshness_query(settings)] = [(200, vector([("beam", at, str(at - 1.0))], "workflow"))]
    prometheus.answers[workflow_latency_query(settings)] = [(200, vector([("beam", at, str(latency_s))], "workflow"))]


@pytest.mark.parametrize("entry", [False, True], ids=["completions only", "entry scraped"])
def test_stalled_completions_under_a_backlog_still_give_the_policy_the_arrival_rate(api, tmp_path, instance, prometheus, entry):
    """Under a backlog the engines finish few requests (the completions stall) while workflow
    requests keep arriving at the entry: from completions alone the policy sees no demand to scale
    up for; with the entry's counter scraped it plans on the arrival rate and scales up."""
    running = _plan([(0, 0)], [(0, 2)])
    _deploy(api, instance, running)
    clock = Clock()
    loop, _ = _loop(api, tmp_path, instance, prometheus, clock, [])
    _rates(prometheus, 0.02, 0.01)  # a few completions: the engines are stuck on a backlog
    if entry:
        _entry(prometheus, 6.0, 500.0)  # twice the instance's rate: beyond what the running plan serves
    clock.now = 60.0
    record = loop.period()
    if not entry:
        assert record["inputs"]["rates_from"] == "per-LLM rates (NNLS)" and record["workflow_missing"]["beam"].startswith("no series")
        assert not record["reason"].startswith("scale up"), record
    else:
        assert record["inputs"]["rates_from"] == "workflow counters" and record["inputs"]["workflow_rates_rps"] == {"beam": 6.0}
        assert record["action"] == "replan" and record["reason"].startswith("scale up"), json.dumps(record)


def test_a_pending_replica_is_no_capacity_and_its_gpus_go_to_no_new_start(api, tmp_path, instance, prometheus):
    """A replica whose pod is Pending (the scheduler cannot place it) counts as starting, not as
    ready capacity; its share units are blocked (the fleet reserves them), and the period replaces
    it where it can run: every new replica goes on GPUs that no replica of the running placement,
    Pending or not, holds, and the stuck one is named."""
    from support.kube_api import path_of

    from scepsy.control.act import _gpus

    _deploy(api, instance, _plan([(0, 0)], [(0, 2)]), ready=False)
    api.ready("gen-r0")
    with api.lock:
        api.store[path_of("Pod", "ver-r0-pod", NAMESPACE)]["status"]["conditions"] = [
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."}]
    api.events.clear()
    clock = Clock()
    loop, _ = _loop(api, tmp_path, instance, prometheus, clock, [])
    _rates(prometheus, 50.0, 30.0)  # far more than the running plan serves: scale up
    clock.now = 60.0
    record = loop.period()
    assert record["inputs"]["ready_replicas"] == {"gen": 1, "ver": 0}
    assert record["inputs"]["starting_replicas"] == {"gen": 0, "ver": 1}
    assert record["action"] == "replan", json.dumps(record)
    assert record["reason"].startswith("scale up") or "move ver-r0 off GPUs the scheduler cannot give them" in record["reason"]
    assert record["fleet"]["blocked_units"] == {f"{instance.cluster.nodes[0].name}/2": instance.cluster.fractions_per_gpu}
    deployments = api.objects("Deployment")
    held = _gpus(deployments["gen-r0"]) | _gpus(deployments["ver-r0"])
    created = [e[2] for e in _writes(api) if e[:2] == ("apply", "Deployment") and e[2] not in ("gen-r0", "ver-r0")]
    assert created, _writes(api)
    for name in created:
        assert not _gpus(deployments[name]) & held, (name, _gpus(deployments[name]), held)


def test_cli_live_path_dry_run_and_its_errors(api, tmp_path, instance, prometheus):
    from typer.testing import CliRunner

    from scepsy.cli import app

    running = _plan([(0, 0)], [(0, 2)])
    _deploy(api, instance, running)
    _rates(prometheus, 90.0, 60.0)
    plan = _plan_file(tmp_path, instance, running)
    log = tmp_path / "decisions.jsonl"
    runner = CliRunner()
    result = runner.invoke(app, ["control", str(INSTANCE_FILE), "--plan", str(plan), "--prometheus-url", prometheus.url,
                                 "--kubeconfig", str(api.kubeconfig(tmp_path)), "--act", "dry-run", "--periods", "1",
                                 "--log", str(log), "--predictor", "constant", "--metrics-port", "0"])
    assert result.exit_code == 0, result.output
    assert "dry run: create deployment/" in result.output and "1 periods (1 replan)" in result.output
    assert [json.loads(line)["event"] for line in log.read_text().splitlines()] == ["start", "period"]
    assert _writes(api) == []

    missing = runner.invoke(app, ["control", str(INSTANCE_FILE), "--plan", str(plan)])
    assert missing.exit_code == 2 and "--prometheus-url" in missing.output and "Traceback" not in missing.output
    bad = runner.invoke(app, ["control", str(INSTANCE_FILE), "--plan", str(plan), "--prometheus-url", prometheus.url,
                              "--kubeconfig", str(api.kubeconfig(tmp_path)), "--act", "maybe", "--log", str(log)])
    assert bad.exit_code == 2 and "--act" in bad.output and "unknown mode 'maybe'" in bad.output
    knob = runner.invoke(app, ["control", str(INSTANCE_FILE), "--plan", str(plan), "--prometheus-url", prometheus.url,
                               "--kubeconfig", str(api.kubeconfig(tmp_path)), "--setting", "slo_margin=0", "--log", str(log)])
    assert knob.exit_code == 2 and "error: slo_margin: " in knob.output and "Traceback" not in knob.output


@pytest.mark.parametrize("act", ["apply", "dry-run", "gauges"])
def test_every_act_mode_serves_metrics_and_healthz_while_it_runs(api, tmp_path, instance, prometheus, act):
    """The server is up before the first period (a standby or a slow start answers its probes)
    and answers /healthz and /metrics while the loop runs; it is gone after."""
    from scepsy import api as scepsy_api

    _deploy(api, instance, _plan([(0, 0)], [(0, 2)]))
    _rates(prometheus, 2.0, 1.0)
    plan = _plan_file(tmp_path, instance, _plan([(0, 0)], [(0, 2)]))
    seen: dict[str, httpx.Response] = {}

    def say(line: str) -> None:
        if "serving /metrics and /healthz on " in line:
            base = line.rsplit(" ", 1)[1]
            seen["healthz"] = httpx.get(base + "/healthz")
            seen["metrics"] = httpx.get(base + "/metrics")
            seen["base"] = httpx.Response(200, text=base)

    run = scepsy_api.control(INSTANCE_FILE, plan, prometheus_url=prometheus.url, kubeconfig=api.kubeconfig(tmp_path), act=act,
                             log=tmp_path / "log.jsonl", metrics_port=0, periods=1,
                             policy=scepsy_api.control_settings(predictor="constant"), say=say)
    assert run.periods == 1
    assert (seen["healthz"].status_code, seen["healthz"].text) == (200, "ok\n")
    assert seen["metrics"].status_code == 200 and "scepsy_leader 1.0" in seen["metrics"].text
    with pytest.raises(httpx.HTTPError):
        httpx.get(seen["base"].text + "/healthz")


def test_gauges_publish_the_target_for_keda_and_write_nothing(api, tmp_path, instance, prometheus):
    running = _plan([(0, 0)], [(0, 2)], share=1)
    _deploy(api, instance, running)
    said: list[str] = []
    clock = Clock()
    loop, log = _loop(api, tmp_path, instance, prometheus, clock, said, act="gauges")
    _rates(prometheus, 50.0, 30.0)
    clock.now = 60.0
    record = loop.period()
    assert record["action"] == "replan" and record["act"]["mode"] == "gauges"
    assert loop.gauges is not None
    text = loop.gauges.exposition().decode()
    wanted = {line.split("deployment=\"")[1].split("\"")[0]: line.rsplit(" ", 1)[1]
              for line in text.splitlines() if line.startswith("scepsy_desired_replica{")}
    assert loop.state is not None
    target = {f"{r.llm}-r{r.replica}" for r in loop.state.placement.replicas}
    assert sum(record["act"]["published"].values()) == len(target)
    assert wanted == {name: "1.0" if name in target else "0.0" for name in target | {"gen-r0", "ver-r0"}}
    assert len(target) > 2  # a scale-up: KEDA starts the new Deployments
    assert 'scepsy_decisions_total{action="replan"} 1.0' in text
    assert 'scepsy_observation_missing{llm="gen"} 0.0' in text
    assert _writes(api) == []


def test_a_change_in_progress_deletes_nothing_while_rates_are_missing(api, tmp_path, instance, prometheus):
    """A replacement decided on good data: its new replica starts; then Prometheus gives NaN. The
    old replica is not deleted, even once the new one is Ready, until the rates are back."""
    _deploy(api, instance, _plan([(0, 0)], [(0, 2)], share=1))
    said: list[str] = []
    clock = Clock()
    loop, log = _loop(api, tmp_path, instance, prometheus, clock, said)
    loop.start()
    before = set(api.objects("Deployment"))
    target = _objects(instance, _plan([(0, 0)], [(1, 3)], share=1))  # ver-r0 on GPU 2 is replaced by ver-r1 on GPU 3
    loop.actuation = Actuation(loop.cluster, target, 0.0, 900.0, baseline=_objects(instance, _plan([(0, 0)], [(0, 2)], share=1)))
    _rates(prometheus, "NaN", 0.5)
    clock.now = 60.0
    first = loop.period()
    assert first["action"] == "acting" and first["act"]["phase"] == "waiting"
    for name in first["act"]["waiting_for"]:
        api.ready(name)
    clock.now = 120.0
    second = loop.period()
    assert second["action"] == "acting" and second["act"]["phase"] == "waiting" and "missing rates" in second["reason"]
    assert not [e for e in api.events if e[0] == "delete"] and before <= set(api.objects("Deployment"))
    _rates(prometheus, 0.5, 0.5)
    clock.now = 180.0
    third = loop.period()
    assert third["act"]["phase"] == "done"
    assert [e for e in api.events if e[0] == "delete"] == [("delete", "Deployment", "ver-r0")]
    assert api.events.index(("ready", "ver-r1")) < api.events.index(("delete", "Deployment", "ver-r0"))


def test_the_loop_abandons_a_replica_that_never_becomes_ready_and_says_so(api, tmp_path, instance, prometheus):
    _deploy(api, instance, _plan([(0, 0)], [(0, 2)], share=1))
    said: list[str] = []
    clock = Clock()
    loop, log = _loop(api, tmp_path, instance, prometheus, clock, said, ready_timeout_s=120.0)
    _rates(prometheus, 50.0, 30.0)
    clock.now = 60.0
    first = loop.period()
    assert first["action"] == "replan" and first["act"]["phase"] == "waiting"
    added = first["act"]["waiting_for"]
    for name in added:
        api.ready(name, ready=False)  # their readiness probes keep failing
    clock.now = 120.0
    assert loop.period()["act"]["phase"] == "waiting"
    clock.now = 180.0
    stuck = loop.period()
    assert stuck["action"] == "acting" and stuck["act"]["phase"] == "stuck" and "not ready after 120 s" in stuck["act"]["problem"]
    assert any("not ready after 120 s" in line for line in said)
    assert sorted(e[2] for e in api.events if e[0] == "delete") == sorted(added)  # only what it added
    assert {"gen-r0", "ver-r0"} <= set(api.objects("Deployment"))
    assert loop.state is not None and {c.llm: c.replicas for c in loop.state.allocation.llms} == {"gen": 1, "ver": 1}
    clock.now = 240.0
    assert loop.period()["action"] == "replan"  # the policy decides again from what serves


def _allowed(rules: dict, verb: str, group: str, resource: str, namespace: str | None) -> bool:
    """Whether RBAC rules (namespace -> rules; None: the ClusterRole's) allow a request."""
    return any(group in rule["apiGroups"] and resource in rule["resources"] and verb in rule["verbs"]
               for rule in rules.get(namespace, []))


def test_the_controllers_rbac_allows_every_call_of_the_live_apply(api, tmp_path, instance, prometheus):
    """A scale-down (new replicas, deletions, the plan ConfigMap) and a scale-up (created
    Deployments and disruption budgets) run against the API double, which records each request as
    RBAC sees it; the rules `scepsy manifests --controller` writes allow every one of them, and
    grant no verb beyond get, list, create, patch, update and delete."""
    from scepsy.k8s.controller import controller_rules

    big = _plan([(0, 0), (1, 1)], [(0, 2), (1, 3)])
    rules = controller_rules(_objects(instance, big), NAMESPACE)
    _deploy(api, instance, big)
    clock = Clock()
    loop, _ = _loop(api, tmp_path, instance, prometheus, clock, [])
    _rates(prometheus, 0.05, 0.03)
    for now in (60.0, 120.0, 180.0):
        clock.now = now
        record = loop.period()
        for name in (record.get("act") or {}).get("waiting_for", []):
            api.ready(name)
    _rates(prometheus, 50.0, 30.0)
    small = _plan([(0, 0)], [(0, 2)], share=1)
    with KubeApi(NAMESPACE) as second:
        _deploy(second, instance, small)
        up, _ = _loop(second, tmp_path, instance, prometheus, Clock(), [])
        up.clock = lambda: 60.0
        up.period()
        calls = set(api.requests) | set(second.requests)
    verbs = {verb for verb, *_ in calls}
    assert {"list", "get", "create", "patch", "delete"} <= verbs, verbs  # the runs exercised every kind of call
    refused = sorted(c for c in calls if not _allowed(rules, c[0], c[1], c[2], c[3]))
    assert refused == [], refused
    granted = {verb for where in rules.values() for rule in where for verb in rule["verbs"]}
    assert granted <= {"get", "list", "create", "patch", "update", "delete"}


def test_a_lost_gpu_is_read_from_the_node_and_planned_around(api, tmp_path, instance, prometheus):
    """Two of the node's four GPUs turn unhealthy (the device plugin's allocatable drops to 2):
    the loop says so, logs it, and whatever it starts for a rise in load lands on the two GPUs
    left (the ones the running replicas use)."""
    _deploy(api, instance, _plan([(0, 0)], [(0, 2)], share=1))
    api.put(node_object("a6000-0", capacity=4, allocatable=2))
    said: list[str] = []
    clock = Clock()
    loop, _ = _loop(api, tmp_path, instance, prometheus, clock, said)
    _rates(prometheus, 50.0, 30.0)
    clock.now = 60.0
    record = loop.period()
    assert record["fleet"] == {"lost_nodes": {}, "lost_gpus": {"a6000-0": [1, 3]}}
    assert "scepsy control: lost: GPU 1,3 of a6000-0" in said
    assert loop.context.instance.cluster.free_units("a6000-0", 1) == 0
    gpus = {g for d in api.objects("Deployment").values() if d["metadata"]["labels"].get("app.kubernetes.io/component") == "engine"
            for g in d["spec"]["template"]["metadata"]["annotations"]["scepsy.io/gpus"].split(",")}
    assert gpus <= {"0", "2"}, gpus
    clock.now = 120.0
    assert loop.period()["fleet"]["lost_gpus"] == {"a6000-0": [1, 3]}
    assert sum("lost:" in line for line in said) == 1  # said when it changes, not every period


def test_the_controllers_deployment_runs_from_its_configmap(api, tmp_path, instance, prometheus):
    """`scepsy manifests --controller`, deployed on the API double: the controller Deployment's own
    command line, with its ConfigMap's items where the pod mounts them, leads on the Lease (which
    holds no holder yet) and runs a period of the live apply."""
    from typer.testing import CliRunner

    from scepsy import api as scepsy_api
    from scepsy.cli import app
    from scepsy.k8s.apply import load_manifests
    from support.kube_api import PLURALS

    plan = Path(__file__).parent / "golden" / "plans" / "beam-4xa6000-optimal.json"  # a plan `scepsy plan` wrote
    out = tmp_path / "deploy"
    scepsy_api.manifests(plan, out, controller=scepsy_api.controller_settings("registry.example.com/scepsy:0.1.0", prometheus.url))
    objects = load_manifests(out)
    for node in instance.cluster.nodes:
        api.put(node_object(node.name, capacity=node.gpus, allocatable=node.gpus))
    for obj in objects:
        if obj["kind"] in PLURALS:  # the double serves no cluster-scoped RBAC
            api.put(obj)
    for name, deployment in api.objects("Deployment").items():
        if deployment["metadata"]["labels"]["app.kubernetes.io/component"] == "engine":
            api.ready(name)
    controller = api.objects("Deployment")["scepsy-controller"]["spec"]["template"]["spec"]
    data = api.objects("ConfigMap")["scepsy-controller"]["data"]
    mount = tmp_path / "mount"
    for item in controller["volumes"][0]["configMap"]["items"]:
        (mount / item["path"]).parent.mkdir(parents=True, exist_ok=True)
        (mount / item["path"]).write_text(data[item["key"]])
    args = [str(a).replace("/etc/scepsy/controller", str(mount)).replace("$(POD_NAME)", "pod-a") for a in controller["containers"][0]["args"]]
    args[args.index("--metrics-port") + 1] = "0"
    args[args.index("--log") + 1] = str(tmp_path / "control.jsonl")
    _rates(prometheus, 2.0, 1.0)
    result = CliRunner().invoke(app, [*args, "--kubeconfig", str(api.kubeconfig(tmp_path)), "--periods", "1"])
    assert result.exit_code == 0, result.output
    assert "pod-a leads" in result.output
    assert api.objects("Lease")["scepsy-controller"]["spec"]["holderIdentity"] == "pod-a"
    assert [json.loads(line)["event"] for line in (tmp_path / "control.jsonl").read_text().splitlines()] == ["start", "period"]
