"""The Aggregate LLM Pipeline against hand-computed values."""

from __future__ import annotations

import math

import pytest

from scepsy.models.errors import ScepsyWarning
from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.performance.alp import predict
from scepsy.models.instance.instance import load_instance


def alloc(*choices):
    return Allocation(10, tuple(LlmAllocation(*c) for c in choices))


def test_single_workflow_by_hand(write_instance):
    instance = load_instance(write_instance())
    # gen: 1 replica tp1 f1.0 -> T = 20, rate 9 -> L = 1.25 + (4/5)*0.25 = 1.45, x 9/3
    # ver: 1 replica tp2 f0.5 -> T = 8, light 1.0 -> points (2,1.25) (4,1.5) (8,2.0); rate 6 -> 1.75, x 6/2
    prediction = predict(instance, alloc(("gen", "A6000", 1, 10, 1), ("ver", "A6000", 2, 5, 1)))
    gen, ver = prediction.llm("gen"), prediction.llm("ver")
    assert gen.latency_s == pytest.approx(1.45) and ver.latency_s == pytest.approx(1.75)
    assert gen.utilization == pytest.approx(9 / 20) and ver.utilization == pytest.approx(6 / 8)
    beam = prediction.workflow("beam")
    assert [s.latency_contribution_s for s in beam.stages] == pytest.approx([4.35, 5.25])
    assert beam.latency_s == pytest.approx(9.6)
    assert beam.max_throughput_rps == pytest.approx(8 / 6) and beam.bottleneck == "ver"
    assert ver.gpus == pytest.approx(1.0) and gen.gpus == pytest.approx(1.0)


def test_a_latency_scale_weighs_the_llms_calls_and_leaves_its_load(write_instance):
    """The controller's correction: ver measured 1.5 times slower than its profile adds half its
    contribution again to the workflow latency; rates, capacity and the other LLM are unchanged."""
    instance = load_instance(write_instance())
    allocation = alloc(("gen", "A6000", 1, 10, 1), ("ver", "A6000", 2, 5, 1))
    scaled = predict(instance.with_latency_scales({"ver": 1.5}), allocation)
    assert [s.latency_contribution_s for s in scaled.workflow("beam").stages] == pytest.approx([4.35, 5.25 * 1.5])
    assert scaled.llm("ver").utilization == pytest.approx(6 / 8) and scaled.llm("ver").latency_s == pytest.approx(1.75)
    assert scaled.workflow("beam").max_throughput_rps == pytest.approx(8 / 6)
    assert predict(instance.with_latency_scales({}), allocation) == predict(instance, allocation)


def test_replicas_divide_the_rate(write_instance):
    instance = load_instance(write_instance())
    prediction = predict(instance, alloc(("gen", "A6000", 1, 10, 3), ("ver", "A6000", 2, 5, 2)))
    assert prediction.llm("gen").per_replica_rate_rps == pytest.approx(3.0)
    assert prediction.llm("gen").latency_s == pytest.approx(1.25)  # clamped below 5 rps
    assert prediction.workflow("beam").max_throughput_rps == pytest.approx(min(3 * 20 / 9, 2 * 8 / 6))


def test_shared_llm_sums_the_load_of_its_workflows(write_instance):
    def two_workflows(doc):
        doc["workflows"].append(
            {"name": "chat", "arrival_rate": 2.0, "stages": [{"llm": "gen", "invocations": 1.5, "parallelism": 1.0}]}
        )

    instance = load_instance(write_instance(two_workflows))
    assert instance.offered_rate_rps("gen") == pytest.approx(1.0 * 9 + 2.0 * 1.5)
    prediction = predict(instance, alloc(("gen", "A6000", 1, 10, 1), ("ver", "A6000", 2, 5, 1)))
    gen = prediction.llm("gen")
    assert gen.per_replica_rate_rps == pytest.approx(12.0)
    expected = 1.5 + (2 / 10) * 0.5  # between (10, 1.5) and (20, 2.0)
    assert gen.latency_s == pytest.approx(expected)
    assert prediction.workflow("chat").latency_s == pytest.approx(expected * 1.5)
    # the generator's 20 rps less the 9 rps beam sends it leave chat 11 rps of calls, 7.33 req/s;
    # beam gets (20 - 3) / 9 of the generator; the verifier (tp 2 x 0.5: 8 rps / 6 calls) limits it further
    assert prediction.workflow("chat").max_throughput_rps == pytest.approx((20 - 9) / 1.5)
    assert prediction.workflow("chat").bottleneck == "gen"
    assert prediction.workflow("beam").max_throughput_rps == pytest.approx(min((20 - 3) / 9, 8 / 6))
    assert gen.utilization == pytest.approx(12 / 20)


def test_shared_llm_limits_are_consistent_with_the_load_they_take(write_instance):
    """At its limit, each workflow alone raises the shared LLM to its capacity."""
    def two_workflows(doc):
        doc["workflows"].append(
            {"name": "chat", "arrival_rate": 2.0, "stages": [{"llm": "gen", "invocations": 1.5, "parallelism": 1.0}]}
        )

    instance = load_instance(write_instance(two_workflows))
    allocation = alloc(("gen", "A6000", 1, 10, 1), ("ver", "A6000", 2, 10, 1))
    limit = predict(instance, allocation).workflow("chat").max_throughput_rps
    at_limit = predict(instance.with_arrival_rates({"chat": limit}), allocation)
    assert at_limit.llm("gen").utilization == pytest.approx(1.0)
    assert at_limit.workflow("chat").max_throughput_rps == pytest.approx(limit)


def test_overload_is_flagged(write_instance):
    instance = load_instance(write_instance(lambda d: d["workflows"][0].update(arrival_rate=3.0)))
    prediction = predict(instance, alloc(("gen", "A6000", 1, 10, 1), ("ver", "A6000", 2, 5, 1)))
    assert prediction.llm("gen").overloaded  # 27 rps > 20 rps capacity
    assert math.isinf(prediction.workflow("beam").latency_s)
    assert not prediction.feasible


def test_latency_metric_selects_the_column(write_instance):
    with pytest.warns(ScepsyWarning, match="scepsy aggregate"):
        instance = load_instance(write_instance(lambda d: d.update(latency_metric="p99")))
    prediction = predict(instance, alloc(("gen", "A6000", 1, 10, 1), ("ver", "A6000", 2, 5, 1)))
    assert prediction.llm("gen").latency_s == pytest.approx(2 * 1.45)


def test_tail_metric_from_the_traced_latency_ratios(write_instance):
    """With latency_ratios, p99 is the traced ratio times the mean pipeline latency (the spread of
    the control flow), not the sum of per-call p99s; without them, the sum as before."""
    allocation = alloc(("gen", "A6000", 1, 10, 1), ("ver", "A6000", 2, 5, 1))
    mean = predict(load_instance(write_instance()), allocation).workflow("beam").latency_s

    def p99(ratios):
        return lambda d: (d.update(latency_metric="p99"), d["workflows"][0].update(latency_ratios=ratios) if ratios else None)

    with_ratio = load_instance(write_instance(p99({"p90": 1.4, "p99": 2.5})))
    assert with_ratio.call_latency_metric == "mean"
    assert predict(with_ratio, allocation).workflow("beam").latency_s == pytest.approx(2.5 * mean)
    with pytest.warns(ScepsyWarning, match="latency_ratios"):
        summed = load_instance(write_instance(p99(None)))
    assert summed.call_latency_metric == "p99"
    assert predict(summed, allocation).llm("gen").latency_s == pytest.approx(2 * 1.45)


def test_max_throughput_plan_is_consistent_with_shared_limits(write_instance):
    """At the largest load factor, every workflow's limit covers its own rate, and the shared
    generator leaves no more: the binding workflow's limit is its rate (bisection tolerance)."""
    from scepsy.planner.allocation.planning import make_plan

    def shared(doc):
        doc["objective"] = "max_throughput"
        doc["workflows"].append(
            {"name": "chat", "arrival_rate": 2.0, "stages": [{"llm": "gen", "invocations": 1.5, "parallelism": 1.0}]}
        )

    plan = make_plan(load_instance(write_instance(shared)))
    limits = {w.name: w.max_throughput_rps / w.arrival_rate_rps for w in plan.prediction.workflows}
    assert all(v >= 1 - 1e-9 for v in limits.values()), limits
    assert min(limits.values()) <= 1 + 2e-3, limits


def test_the_margin_is_applied_to_the_throughput_limit(write_instance):
    def margin(doc):
        doc["max_utilization"] = 0.75

    instance = load_instance(write_instance(margin))
    prediction = predict(instance, alloc(("gen", "A6000", 1, 10, 1), ("ver", "A6000", 2, 5, 1)))
    # ver: 8 rps of capacity, 6 calls per request, at most 75% of it planned
    assert prediction.workflow("beam").max_throughput_rps == pytest.approx(0.75 * 8 / 6)
    assert prediction.llm("ver").headroom == pytest.approx(1 - 6 / 8)
    assert prediction.llm("ver").usable_capacity_rps == pytest.approx(6.0)


def test_a_plan_states_one_capacity_per_workflow_with_its_margin(tmp_path):
    """The max_throughput plan's load, its workflows' max_throughput_rps, the plan document, predict
    on that document and whatif's column are one number: the load at which the bottleneck reaches
    max_utilization of its capacity; every LLM keeps at least 1 - max_utilization of it free."""
    import json

    from typer.testing import CliRunner

    from scepsy import api
    from scepsy.cli.app import app
    from conftest import INSTANCES

    path = INSTANCES / "beam-4xa6000.yaml"
    plan = api.plan(path, objective="max_throughput", time_limit_s=600, placement_time_limit_s=600)
    instance = load_instance(path)
    assert instance.max_utilization == 0.9
    claimed = plan.prediction.workflow("beam").max_throughput_rps
    planned = instance.workflows[0].arrival_rate * dict(plan.extras)["load_factor"]
    assert planned <= claimed <= planned * (1 + 2e-3)  # the bisection's tolerance
    assert min(p.headroom for p in plan.prediction.llms) == pytest.approx(0.1, abs=2e-3)
    document = api.plan_document(plan, include_wall_time=False)
    assert document["workflows"][0]["max_throughput_rps"] == pytest.approx(claimed, rel=1e-8)
    assert [m["headroom"] for m in document["llms"]] == pytest.approx([p.headroom for p in plan.prediction.llms])
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(document))
    assert api.predict(path, saved).workflow("beam").max_throughput_rps == pytest.approx(claimed, rel=1e-8)
    # the same allocation's limit is what whatif reports for it (its plan at the instance's rate)
    at_rate = api.plan(path, time_limit_s=600, placement_time_limit_s=600)
    study = api.whatif(path, rates="3", time_limit_s=600)
    assert study.frame["workflow_max_throughput_rps"].iloc[0] == pytest.approx(
        at_rate.prediction.workflow("beam").max_throughput_rps, rel=1e-8)
    shown = CliRunner().invoke(app, ["plan", str(path), "--objective", "max_throughput"], env={"COLUMNS": "250"})
    assert shown.exit_code == 0 and "headroom_%" in shown.output and "max_utilization 0.9" in shown.output


def test_a_tail_metric_without_latency_ratios_warns_once_in_plan_predict_and_whatif(tmp_path):
    """latency_metric p99 without ratios: one warning line naming the workflow's field and the fix
    (scepsy aggregate), the same in plan, predict and whatif; the shipped instances carry the ratios
    of the traced runs their stages come from, so asking them for p99 warns nothing."""
    import subprocess
    import sys

    import yaml

    from conftest import INSTANCES

    def scepsy(*args):
        return subprocess.run([sys.executable, "-m", "scepsy", *map(str, args)], capture_output=True, text=True)

    shipped = INSTANCES / "rag-4xa6000.yaml"
    doc = yaml.safe_load(shipped.read_text())
    assert all(w["latency_ratios"]["p99"] > w["latency_ratios"]["p90"] > 1 for w in doc["workflows"])
    for metric, ratios in (("p99", True), ("p99", False), ("p90", False)):
        changed = dict(doc, latency_metric=metric)
        changed["workflows"] = [dict(w) for w in doc["workflows"]]
        if not ratios:
            del changed["workflows"][0]["latency_ratios"]
        for llm in changed["llms"]:
            llm["profile"] = str(INSTANCES / llm["profile"])
        path = tmp_path / f"{metric}-{ratios}.yaml"
        path.write_text(yaml.safe_dump(changed, sort_keys=False))
        plan = tmp_path / "plan.json"
        runs = [scepsy("plan", path, "--out", plan), scepsy("predict", path, "--allocation", plan),
                scepsy("whatif", path, "--rates", "4,8")]
        for run in runs:
            assert run.returncode == 0, run.stderr
            warned = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
            if ratios:
                assert warned == [], run.stderr
            else:
                assert len(warned) == 1, run.stderr
                assert f"workflows[0] (rag).latency_ratios: latency_metric is {metric}" in warned[0]
                assert "fix: run scepsy aggregate" in warned[0]
