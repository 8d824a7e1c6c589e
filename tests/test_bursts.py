"""Recovery after a burst (planner/studies/bursts.py) and the engines' priority scheduling it rests
on (models/performance/replica.py): engines left first come first served lock into a collapsed
state after a burst, engines that serve older workflow requests first return to the steady state."""

from __future__ import annotations

import pytest
import simpy

from scepsy.models.catalog import catalog
from scepsy.models.instance.instance import load_instance
from scepsy.models.performance.engine import Engine
from scepsy.models.performance.replica import ReplicaSim, Request
from scepsy.planner.allocation.planning import make_plan
from scepsy.models.performance.alp import predict
from scepsy.models.performance.recovery import STANDARD_BURST, Burst, recovery_limit_rps
from scepsy.planner.studies.bursts import LATENCY_SHARE, SERVED_SHARE, burst_arrivals, plan_burst, recovery

from conftest import REPO

# a short version of the standard burst: 150% of the claim for two minutes, 80% around it
SHORT_BURST = Burst(start_s=30.0, length_s=120.0, settle_s=120.0, window_s=120.0)
# the same at twice the claim: what locks engines left first come first served on one A6000
TALL_BURST = Burst(height=2.0, start_s=30.0, length_s=120.0, settle_s=120.0, window_s=120.0)


def _engine(fraction: float = 1.0) -> Engine:
    return Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), fraction=fraction)


def _admitted_order(policy: str, requests: list[Request]) -> list[Request]:
    """The order in which one replica admits `requests` submitted together behind a long one."""
    env = simpy.Environment()
    replica = ReplicaSim(env, _engine(), policy=policy)
    replica.submit(Request(4000, 1))  # holds the first iteration's budget: the rest wait together
    for request in requests:
        replica.submit(request)
    env.run()
    return sorted(requests, key=lambda r: (r.start_s or 0.0, requests.index(r)))


def test_the_priority_queue_admits_lower_priority_values_first_and_fcfs_keeps_arrival_order():
    requests = [Request(3000, 1, priority=p) for p in (5.0, 1.0, 3.0, 2.0)]
    assert [r.priority for r in _admitted_order("priority", requests)] == [1.0, 2.0, 3.0, 5.0]
    requests = [Request(3000, 1, priority=p) for p in (5.0, 1.0, 3.0, 2.0)]
    assert [r.priority for r in _admitted_order("fcfs", requests)] == [5.0, 1.0, 3.0, 2.0]


def test_priority_preemption_takes_the_newest_workflow_and_everything_finishes():
    # tight KV (as vLLM's priority policy: the victim is the largest (priority, arrival)): every
    # request of the oldest workflows finishes before the newest are preempted for the last time
    engine = _engine(fraction=0.07)
    env = simpy.Environment()
    replica = ReplicaSim(env, engine, policy="priority")
    requests = [Request(1000, 900, priority=float(k)) for k in range(40)]
    for request in requests:
        replica.submit(request)
    env.run()
    assert replica.completed == 40 and replica.used == 0 and replica.preemptions > 0
    assert requests[0].preemptions == 0
    assert max(r.preemptions for r in requests) == max(r.preemptions for r in requests[20:])


def test_a_bursts_arrivals_add_to_the_same_base_draw():
    calm = burst_arrivals(2.0, SHORT_BURST, 3, "beam", with_burst=False)
    burst = burst_arrivals(2.0, SHORT_BURST, 3, "beam")
    assert set(calm) < set(burst)
    extra = sorted(set(burst) - set(calm))
    assert SHORT_BURST.start_s <= extra[0] and extra[-1] < SHORT_BURST.end_s
    rng_rate = len(extra) / SHORT_BURST.length_s
    assert 0.6 < rng_rate < 1.8  # (1.5 - 0.8) x 2 req/s, Poisson over 120 s
    assert burst_arrivals(2.0, SHORT_BURST, 3, "beam") == burst  # deterministic


def test_a_burst_locks_fcfs_engines_and_priority_scheduling_recovers():
    """Beam search on one A6000 shared by its generator and verifier: after two minutes at 200% of
    the plan's claim, FCFS engines serve less than they did before, with latencies in minutes
    (each next call waits behind newer workflows' calls until its prefix is evicted, and the
    verifier recomputes it); engines that serve older workflow requests first are back to the
    reference run."""
    instance = load_instance(REPO / "instances" / "beam-4xa6000.yaml").with_arrival_rates({"beam": 2.0}).with_objective("min_gpus")
    plan = make_plan(instance)
    assert sum(m.share * m.replicas for m in plan.allocation.llms) == plan.allocation.fractions_per_gpu  # one GPU
    rates = {w.name: w.max_throughput_rps for w in plan.prediction.workflows}
    (fcfs,) = recovery(instance, plan.allocation, rates, TALL_BURST, scheduling="fcfs")
    (priority,) = recovery(instance, plan.allocation, rates, TALL_BURST, scheduling="priority")
    assert not fcfs.recovered and fcfs.recovery_s is None
    assert fcfs.served_share < 0.95 and fcfs.latency_mean_s > 10 * fcfs.reference_latency_mean_s
    assert priority.recovered and priority.served_share >= SERVED_SHARE
    assert priority.recovery_s is not None and priority.recovery_s <= TALL_BURST.settle_s
    # the steady state does not pay for it: the reference runs are alike
    assert abs(priority.reference_latency_mean_s / fcfs.reference_latency_mean_s - 1) < 0.1


def test_the_recovery_limit_is_the_load_whose_drain_empties_the_bursts_backlog_in_time():
    # an LLM taking 10 req/s for the workflow, claim 9: 2 min at 13.5 req/s leaves 420 requests,
    # drained at 10 - R within 300 s for R <= 8.6 req/s
    assert recovery_limit_rps(9.0, [10.0]) == pytest.approx(8.6)
    assert recovery_limit_rps(9.0, [10.0, 30.0]) == pytest.approx(8.6)  # an LLM the burst does not overload
    assert recovery_limit_rps(4.0, [10.0]) == 4.0  # never above the claim
    assert recovery_limit_rps(9.0, [10.0], Burst(length_s=600.0)) == pytest.approx(3.0)
    assert recovery_limit_rps(9.0, [10.0], Burst(length_s=900.0)) == 0.0  # a burst too long: no load recovers in time
    assert recovery_limit_rps(9.0, [10.0], Burst(settle_s=600.0)) == pytest.approx(9.0)  # 420 / (10 - 9) <= 600 s
    # the bottleneck itself: the claim less the burst's excess over it spread over the settle time
    assert recovery_limit_rps(10.0, [10.0]) == pytest.approx(10.0 * (1 - 120 * 0.5 / 300))


def test_every_plan_prints_a_recovery_limit_below_its_claim():
    instance = load_instance(REPO / "instances" / "combined-8xh100.yaml")
    plan = make_plan(instance)
    for w in predict(instance, plan.allocation).workflows:
        assert 0 < w.recovery_limit_rps < w.max_throughput_rps
        expected = w.max_throughput_rps * (1 - STANDARD_BURST.length_s * (STANDARD_BURST.height - 1) / STANDARD_BURST.settle_s)
        assert w.recovery_limit_rps == pytest.approx(expected, rel=1e-6)


# the 4-GPU instances (a minute or two each on two cores); the larger ones (four to ten minutes each)
# are measured by bench/burst_recovery.py --all (docs/evidence.md section 10)
BURST_CHECKED = ("beam-4xa6000", "ensemble-4xa6000", "rag-4xa6000")
EVERY_RUN = "beam-4xa6000"  # the untagged-share run's instance (docs/evidence.md section 10)


@pytest.mark.slow
@pytest.mark.exhaustive  # the test run has the one-A6000 burst above
@pytest.mark.parametrize("name", BURST_CHECKED)
def test_the_shipped_plans_recover_from_their_recovery_limit_after_the_standard_burst(name):
    """Each shipped instance's own plan (BURST_CHECKED), every workflow at the recovery limit the plan prints, after
    two minutes at 150% of its claim: every workflow served and at its steady latency again within
    five minutes (the table of docs/evidence.md section 10, engines with priority scheduling)."""
    instance = load_instance(REPO / "instances" / f"{name}.yaml")
    plan = make_plan(instance)
    burst = plan_burst(plan.prediction)
    assert 0 < burst.base_load < 1
    found = recovery(instance, plan.allocation, {w.name: w.max_throughput_rps for w in plan.prediction.workflows}, burst)
    assert {r.workflow for r in found} == {w.name for w in instance.workflows}
    for result in found:
        assert result.recovered, result
        assert result.recovery_s is not None and result.recovery_s <= burst.settle_s, result


@pytest.mark.slow
@pytest.mark.exhaustive  # the standard burst run twice more (about a minute): with the matrix
def test_untagged_workflow_requests_are_neither_starved_nor_ahead_after_the_standard_burst():
    """One in five workflow requests sends no workflow id: the entry gives their calls that continue
    an earlier call's prompt that call's start (their conversation's) and any other call its own
    arrival. After the standard burst from the plan's recovery limit the row recovers, and the
    untagged requests' mean latency is within 25% of the tagged ones' (docs/evidence.md)."""
    instance = load_instance(REPO / "instances" / f"{EVERY_RUN}.yaml")
    plan = make_plan(instance)
    burst = plan_burst(plan.prediction)
    (found,) = recovery(instance, plan.allocation, {w.name: w.max_throughput_rps for w in plan.prediction.workflows}, burst,
                        untagged_share=0.2)
    assert found.recovered, found
    assert found.tagged_latency_mean_s is not None and found.untagged_latency_mean_s is not None
    assert abs(found.untagged_latency_mean_s / found.tagged_latency_mean_s - 1) <= LATENCY_SHARE, found


@pytest.mark.parametrize(("threshold", "preempts"), [(10.0, True), (60.0, False), (None, False)])
def test_sglangs_priority_preemption_takes_the_kv_of_running_calls_tagged_more_than_the_threshold_later(threshold, preempts):
    """Three calls tagged 100 hold 90% of a replica's KV cache; a call tagged 50 that does not fit
    arrives. SGLang's preemption with threshold 10 preempts one of them and serves it at once; with
    threshold 60 (a difference of 50 is not more) or vLLM's scheduler (None) it waits for them."""
    env = simpy.Environment()
    replica = ReplicaSim(env, _engine(0.15), policy="priority", preemption_threshold=threshold)
    capacity = replica.capacity
    newer = [Request(capacity * 3 // 10, 500, priority=100.0) for _ in range(3)]
    for request in newer:
        replica.submit(request)
    older = Request(capacity // 5, 10, priority=50.0)

    def arrive_once_they_decode():
        while len(replica.running) < 3 or not all(r._prompt_done for r in replica.running):
            yield env.timeout(0.05)
        replica.submit(older)

    env.process(arrive_once_they_decode())
    env.run()
    assert (replica.preemptions == 1) is preempts and sum(r.preemptions for r in newer) == replica.preemptions
    finishes = [r.finish_s for r in newer]
    assert older.finish_s is not None and None not in finishes
    assert (older.finish_s < min(f for f in finishes if f is not None)) is preempts
