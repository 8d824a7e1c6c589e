"""The workflow simulator: programs, statistics, determinism, prediction agreement, autoscaling."""

from __future__ import annotations

import gc
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from scepsy.cli import app
from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.performance.alp import predict
from scepsy.models.simulation.autoscaler import Autoscaler, HpaSettings
from scepsy.models.errors import InputError
from scepsy.models.instance.instance import build_instance, load_instance
from scepsy.models.instance.workflow import BeamSearchProgram, RagProgram, StagesProgram
from scepsy.models.simulation.simulator import SimulationSettings, simulate

INSTANCES = Path(__file__).resolve().parent.parent / "instances"
SHORT = SimulationSettings(duration_s=120.0, seed=0)


def _whole(instance, replicas=1, tp=1):
    f = instance.cluster.fractions_per_gpu
    gpu = instance.cluster.used_gpu_types()[0]
    return Allocation(f, tuple(LlmAllocation(m.name, gpu, tp, f, replicas) for m in instance.llms))


def _with_program(instance, program, rate=1.0):
    workflow = replace(instance.workflows[0], program=program, arrival_rate=rate)
    return replace(instance, workflows=(workflow,))


def test_beam_search_reproduces_the_instance_statistics_and_varies_per_request():
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml").with_arrival_rates({"beam": 0.5})
    result = simulate(instance, _whole(instance), SimulationSettings(duration_s=600, seed=0))
    workflow = result.workflow("beam")
    for stage in instance.workflows[0].stages:
        measured = workflow.stage(stage.llm)
        assert measured.invocations == pytest.approx(stage.invocations, rel=0.12)
        assert measured.parallelism == pytest.approx(stage.parallelism, rel=0.12)
    assert workflow.spread["gen"].llm_time_s.cv > 0.4  # invocation counts vary strongly per request
    assert workflow.stage("gen").time_share + workflow.stage("ver").time_share == pytest.approx(1.0)


def test_beam_search_structure():
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml")
    # no duplicates: every generation is scored; one iteration per step, n calls each
    program = BeamSearchProgram(kind="beam_search", generator="gen", verifier="ver", beams=4, beam_width=2,
                                max_iterations=3, finish_probability=0.0, length_cv=0.0)
    result = simulate(_with_program(instance, program, 0.5), _whole(instance), SHORT)
    stats = result.workflow("beam")
    assert stats.stage("gen").invocations == pytest.approx(12.0)  # 4 beams x 3 iterations (limit)
    assert stats.stage("ver").invocations == pytest.approx(12.0)
    assert 3.5 < stats.stage("gen").parallelism <= 4.0


def test_rag_calls_once_each_or_k_parallel_reranks():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml").with_arrival_rates({"rag": 2.0})
    result = simulate(instance, _whole(instance), SHORT)
    for stage in result.workflow("rag").stages:
        assert stage.invocations == pytest.approx(1.0) and stage.parallelism == pytest.approx(1.0)
    program = instance.workflows[0].program
    assert program is not None
    unbatched = program.model_copy(update={"rerank_batched": False, "passages": 6})
    result = simulate(_with_program(instance, unbatched, 2.0), _whole(instance), SHORT)
    rerank = result.workflow("rag").stage("rerank")
    assert rerank.invocations == pytest.approx(6.0) and rerank.parallelism > 4.0


def test_default_stages_program_matches_n_and_p():
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml")
    stages = replace(instance.workflows[0], program=None, arrival_rate=1.0)
    result = simulate(replace(instance, workflows=(stages,)), _whole(instance), SHORT)
    for stage in stages.stages:
        measured = result.workflow("beam").stage(stage.llm)
        assert measured.invocations == pytest.approx(stage.invocations, rel=0.1)
        assert measured.parallelism == pytest.approx(stage.parallelism, rel=0.15)


def test_same_seed_same_result_other_seed_other_result():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml").with_arrival_rates({"rag": 3.0})
    a = simulate(instance, _whole(instance), SHORT).to_json()
    b = simulate(instance, _whole(instance), SHORT).to_json()
    c = simulate(instance, _whole(instance), replace(SHORT, seed=1)).to_json()
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert a != c


def test_light_load_throughput_and_utilisation():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml").with_arrival_rates({"rag": 4.0})
    result = simulate(instance, _whole(instance), SHORT)
    workflow = result.workflow("rag")
    assert workflow.throughput_rps == pytest.approx(4.0, rel=0.15)
    assert workflow.unfinished == 0 and workflow.completed > 350
    for llm in result.llms:
        assert 0.0 <= llm.utilization <= 1.0
    assert result.gpus_mean == pytest.approx(3.0)


def test_prediction_agrees_with_simulation_on_the_planned_allocation():
    """The Aggregate LLM Pipeline against the simulator, on the shipped plan at half its capacity."""
    from scepsy.planner.allocation.planning import make_plan

    instance = load_instance(INSTANCES / "beam-4xa6000.yaml")
    plan = make_plan(instance)
    half = instance.scaled(0.5 * plan.prediction.workflow("beam").max_throughput_rps / 3.0)
    predicted = predict(half, plan.allocation).workflow("beam").latency_s
    simulated = simulate(half, plan.allocation, SimulationSettings(duration_s=200, seed=0)).workflow("beam")
    assert simulated.latency_mean_s == pytest.approx(predicted, rel=0.15)


def test_overload_shows_in_throughput_and_latency():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml").with_arrival_rates({"rag": 40.0})
    f = instance.cluster.fractions_per_gpu
    small = Allocation(f, tuple(LlmAllocation(m.name, "A6000", 1, 5, 1) for m in instance.llms))
    workflow = simulate(instance, small, SimulationSettings(duration_s=60, seed=0)).workflow("rag")
    assert workflow.throughput_rps < 0.5 * 40.0
    assert workflow.latency_mean_s > 10 * 1.5


def test_timestamps_replace_poisson_arrivals():
    instance = load_instance(INSTANCES / "rag-4xa6000.yaml")
    times = [0.5 * k for k in range(200)]
    result = simulate(instance, _whole(instance), SimulationSettings(duration_s=60, warmup_s=0), arrivals={"rag": times})
    workflow = result.workflow("rag")
    assert workflow.arrivals == 120 and workflow.offered_rate_rps == pytest.approx(2.0)


def test_the_shipped_azure_trace_gives_arrivals():
    """`azure:conv` replays the shipped trace's timestamps (seconds from its first request); an
    unknown trace name is an input error naming `arrivals`."""
    from scepsy.models.simulation.arrivals import load_arrivals

    times = load_arrivals("azure:conv", ["rag"])["rag"]
    assert len(times) == 19_366 and times[0] == 0.0 and times == sorted(times)
    assert 3000 < times[-1] < 3700  # about one hour
    with pytest.raises(InputError, match="arrivals: unknown Azure trace"):
        load_arrivals("azure:chat", ["rag"])


def test_calls_are_recorded_for_profile_synthesis():
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml").with_arrival_rates({"beam": 0.5})
    result = simulate(instance, _whole(instance), SimulationSettings(duration_s=40, seed=0), record_calls=True)
    assert result.calls and {c["llm"] for c in result.calls} == {"gen", "ver"}
    assert any(c["cached_tokens"] > 0 for c in result.calls)
    assert all(c["completion_tokens"] == 1 for c in result.calls if c["llm"] == "ver")
    linked = [c for c in result.calls if c["prefix_call"] is not None]
    assert linked and all(c["prefix_call"] < c["call"] and c["prefix_tokens"] > 0 for c in linked)


def test_autoscaler_scales_up_under_load_within_the_cluster():
    from scepsy.planner.studies.baselines import hpa_deployment

    instance = load_instance(INSTANCES / "rag-8xa6000.yaml").with_arrival_rates({"rag": 25.0})
    deployment = hpa_deployment(instance, HpaSettings(startup_s=20, sync_period_s=10))
    result = simulate(instance, deployment.allocation, SimulationSettings(duration_s=240, seed=0),
                      controller=deployment.controller)
    generator = result.llm("rag-gen")
    assert generator.replicas_mean > 1.5
    assert result.gpus_mean <= 8.0 + 1e-9
    assert isinstance(deployment.controller, Autoscaler)
    assert any(kind == "up" for _, llm, kind, _ in deployment.controller.events if llm == "rag-gen")


def test_program_must_call_the_workflows_llms(tmp_path):
    raw = yaml.safe_load((INSTANCES / "beam-4xa6000.yaml").read_text())
    raw["workflows"][0]["program"]["verifier"] = "judge"
    with pytest.raises(InputError, match=r"program\.verifier"):
        build_instance(raw, "beam.yaml", INSTANCES)
    raw["workflows"][0]["program"] = {"kind": "tree_of_thought"}
    with pytest.raises(InputError, match="program"):
        build_instance(raw, "beam.yaml", INSTANCES)
    del raw["workflows"][0]["program"]
    assert build_instance(raw, "beam.yaml", INSTANCES).workflows[0].program is None


def test_unknown_model_is_an_input_error():
    raw = yaml.safe_load((INSTANCES / "rag-4xa6000.yaml").read_text())
    raw["llms"][2]["model"] = "acme/secret-model"
    instance = build_instance(raw, "rag.yaml", INSTANCES)
    with pytest.raises(InputError, match="not in the engine catalog"):
        simulate(instance, _whole(instance), SHORT)


def test_cli_simulate_json_and_table(tmp_path):
    runner = CliRunner()
    plan = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(INSTANCES / "rag-4xa6000.yaml"), "--json", "--out", str(plan)]).exit_code == 0
    calls = tmp_path / "calls.jsonl"
    result = runner.invoke(app, ["simulate", str(INSTANCES / "rag-4xa6000.yaml"), "--plan", str(plan), "--rate", "2",
                                 "--duration-s", "30", "--json", "--calls-out", str(calls)])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    workflow = data["workflows"][0]
    assert workflow["name"] == "rag" and workflow["predicted_latency_s"] > 0 and data["llms"]
    assert calls.read_text().count("\n") > 100
    table = runner.invoke(app, ["simulate", str(INSTANCES / "rag-4xa6000.yaml"), "--plan", str(plan),
                                "--rates", "1,2", "--duration-s", "20"])
    assert table.exit_code == 0 and table.output.count("Simulated workflows") == 2
    bad = runner.invoke(app, ["simulate", str(INSTANCES / "rag-4xa6000.yaml"), "--rates", "1,x"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output


def _exact_from_calls(result, workflow: str, llms):
    """The workflow statistics recomputed exactly from every recorded call (warmup_s=0: every request
    is measured; in the beam program a request starts with its first calls and ends with its last)."""
    requests: dict[int, list[dict]] = {}
    for call in result.calls:
        if call["workflow"] == workflow:
            requests.setdefault(call["request"], []).append(call)
    latencies = np.array([max(c["end_s"] for c in cs) - min(c["start_s"] for c in cs) for cs in requests.values()])

    def union(intervals):
        total, reach = 0.0, -np.inf
        for start, end in sorted(intervals):
            total += max(end - max(start, reach), 0.0)
            reach = max(reach, end)
        return total

    busy = {m: np.array([union([(c["start_s"], c["end_s"]) for c in cs if c["llm"] == m]) for cs in requests.values()])
            for m in llms}
    total = np.sum(list(busy.values()), axis=0)  # per request, over the LLMs
    exact = {"latencies": latencies, "busy": busy, "requests": len(requests)}
    for m in llms:
        own = [c for cs in requests.values() for c in cs if c["llm"] == m]
        exact[m] = {
            "n": len(own) / len(requests),
            "p": sum(c["end_s"] - c["start_s"] for c in own) / busy[m].sum(),
            "share": float(np.mean(busy[m][total > 0] / total[total > 0])),
        }
    return exact


def test_streamed_statistics_equal_the_exact_ones_from_every_call():
    """Means, n, p, time shares and per-request spread accumulated as requests finish equal the same
    quantities computed from every recorded call; percentiles are within the sketch's 0.1%."""
    instance = load_instance(INSTANCES / "beam-4xa6000.yaml").with_arrival_rates({"beam": 1.0})
    result = simulate(instance, _whole(instance), SimulationSettings(duration_s=120, warmup_s=0, seed=3), record_calls=True)
    stats = result.workflow("beam")
    llms = [s.llm for s in stats.stages]
    exact = _exact_from_calls(result, "beam", llms)
    assert stats.unfinished == 0 and stats.completed == exact["requests"] > 50
    rounding = 2e-6  # recorded times are rounded to the microsecond
    assert stats.latency_mean_s == pytest.approx(exact["latencies"].mean(), abs=rounding)
    for q in (50, 90, 99):
        assert getattr(stats, f"latency_p{q}_s") == pytest.approx(np.percentile(exact["latencies"], q), rel=1e-3, abs=rounding)
    for m in llms:
        assert stats.stage(m).invocations == exact[m]["n"]
        assert stats.stage(m).parallelism == pytest.approx(exact[m]["p"], rel=1e-5)
        assert stats.stage(m).time_share == pytest.approx(exact[m]["share"], rel=1e-5)
        spread = stats.spread[m].llm_time_s
        assert spread.count == exact["requests"]
        assert spread.mean == pytest.approx(exact["busy"][m].mean(), abs=rounding)
        assert spread.std == pytest.approx(exact["busy"][m].std(), abs=rounding)
    for llm in result.llms:  # every call of the run, warm-up and unfinished requests included
        calls = [c for c in result.calls if c["llm"] == llm.name]
        assert llm.calls == len(calls)
        assert llm.prefix_hit_rate == pytest.approx(sum(c["cached_tokens"] for c in calls) / sum(c["prompt_tokens"] for c in calls))


def test_memory_does_not_grow_with_the_duration():
    """At the end of the arrivals, a run of 10T holds no more request or call objects than one of T:
    those of the requests in flight (a request's calls are not kept to the end), and its
    latency sketch stays within the bucket bound of its latencies' range."""
    from scepsy.models.performance.replica import Request
    from scepsy.models.simulation.simulator import _WorkflowRequest

    instance = load_instance(INSTANCES / "beam-4xa6000.yaml").with_arrival_rates({"beam": 0.5})

    def held(duration_s: float):
        counts: dict[str, int] = {}

        def probe(fraction: float) -> None:
            if fraction >= 1.0 and not counts:  # arrivals have ended; the drain has not started
                gc.collect()
                objects = gc.get_objects()
                counts["requests"] = sum(type(o) is _WorkflowRequest for o in objects)
                counts["calls"] = sum(type(o) is Request for o in objects)

        result = simulate(instance, _whole(instance), SimulationSettings(duration_s=duration_s, seed=0), progress=probe)
        return counts, result.workflow("beam")

    (short, short_stats), (long, long_stats) = held(100.0), held(1000.0)
    assert long_stats.arrivals >= 9 * short_stats.arrivals >= 9 * 40
    for counts in (short, long):
        assert counts["requests"] <= 10 and counts["calls"] <= 10 * 40  # a few requests in flight
    for stats in (short_stats, long_stats):
        sketch = stats.latency_sketch
        gamma = (1 + sketch.alpha) / (1 - sketch.alpha)
        assert len(sketch.buckets) <= math.log(sketch.maximum / sketch.minimum) / math.log(gamma) + 2
