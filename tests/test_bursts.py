"""Recovery after a burst (planner/studies/bursts.py) and the engines' priority scheduling it rests
on (models/performance/replica.py): engines left first come first served lock into a collapsed
state after a burst, engines that serve older workflow requests first return to the steady state."""

from __future__ import annotations

import simpy

from scepsy.models.catalog import catalog
from scepsy.models.instance.instance import load_instance
from scepsy.models.performance.engine import Engine
from scepsy.models.performance.replica import ReplicaSim, Request
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.studies.bursts import SERVED_SHARE, Burst, burst_arrivals, recovery

from conftest import REPO

# a short version of the standard burst: 150% of the claim for two minutes, 80% around it
SHORT_BURST = Burst(start_s=30.0, length_s=120.0, settle_s=120.0, window_s=120.0)


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
    """Beam search on one A6000 shared by its generator and verifier: after two minutes at 150% of
    the plan's claim, FCFS engines serve about two thirds of the load they served before, with
    latencies in minutes (the verifier's prefixes evicted before their turn); engines that serve
    older workflow requests first are back to the reference run."""
    instance = load_instance(REPO / "instances" / "beam-4xa6000.yaml").with_arrival_rates({"beam": 2.0}).with_objective("min_gpus")
    plan = make_plan(instance)
    assert sum(m.share * m.replicas for m in plan.allocation.llms) == plan.allocation.fractions_per_gpu  # one GPU
    rates = {w.name: w.max_throughput_rps for w in plan.prediction.workflows}
    (fcfs,) = recovery(instance, plan.allocation, rates, SHORT_BURST, scheduling="fcfs")
    (priority,) = recovery(instance, plan.allocation, rates, SHORT_BURST, scheduling="priority")
    assert not fcfs.recovered and fcfs.recovery_s is None
    assert fcfs.served_share < 0.8 and fcfs.latency_mean_s > 10 * fcfs.reference_latency_mean_s
    assert priority.recovered and priority.served_share >= SERVED_SHARE
    assert priority.recovery_s is not None and priority.recovery_s <= SHORT_BURST.settle_s
    # the steady state does not pay for it: the reference runs are alike
    assert abs(priority.reference_latency_mean_s / fcfs.reference_latency_mean_s - 1) < 0.1
