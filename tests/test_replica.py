"""The replica simulation: continuous batching, KV accounting, preemption, prefix cache, routing."""

from __future__ import annotations

import random

import pytest
import simpy
from hypothesis import given, settings, strategies as st

from scepsy.models.catalog import catalog
from scepsy.models.performance.engine import Engine
from scepsy.models.performance.replica import ReplicaSim, Request, Router


def _run(engine, requests, gaps, fast_forward=True):
    env = simpy.Environment()
    replica = ReplicaSim(env, engine, fast_forward=fast_forward)

    def source():
        for request, gap in zip(requests, gaps):
            yield env.timeout(gap)
            replica.submit(request)

    env.process(source())
    env.run()
    return replica


def _requests(seed, n, max_prompt=900, max_completion=300):
    rng = random.Random(seed)
    shapes = [(rng.randint(1, max_prompt), rng.randint(1, max_completion)) for _ in range(n)]
    gaps = [rng.expovariate(15.0) for _ in range(n)]
    return shapes, gaps


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000), fraction=st.sampled_from([0.1, 0.3, 1.0]))
def test_fast_forward_changes_nothing_and_kv_is_returned(seed, fraction):
    engine = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), fraction=fraction)
    shapes, gaps = _requests(seed, 60)
    slow = _run(engine, [Request(p, c) for p, c in shapes], gaps, fast_forward=False)
    fast_requests = [Request(p, c) for p, c in shapes]
    fast = _run(engine, fast_requests, gaps)
    assert fast.completed == slow.completed == 60
    assert fast.busy_s == pytest.approx(slow.busy_s, rel=1e-9)
    assert fast.used == 0 and not fast.running and not fast.waiting
    for request in fast_requests:
        assert request.first_token_s is not None and request.finish_s is not None
        assert request.first_token_s <= request.finish_s
        assert request._generated == request.completion_tokens


def test_tight_kv_preempts_and_still_finishes_everything():
    # 1B model on 7% of an A6000: about 1 GiB of KV, i.e. ~30k tokens for 40 long requests
    engine = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), fraction=0.07)
    assert 0 < engine.kv_capacity_tokens < 40 * 2000
    requests = [Request(1000, 900) for _ in range(40)]
    replica = _run(engine, requests, [0.0] * 40)
    assert replica.completed == 40 and replica.used == 0
    assert replica.preemptions > 0
    assert max(r.preemptions for r in requests) > 0


def test_a_request_larger_than_the_kv_cache_is_refused():
    engine = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), fraction=0.07)
    env = simpy.Environment()
    replica = ReplicaSim(env, engine)
    with pytest.raises(ValueError, match="exceeds the replica's KV cache"):
        replica.submit(Request(engine.kv_capacity_tokens, 10))


def test_prefix_cache_hits_skip_prefill():
    engine = Engine(catalog.model("llama-3.1-8b"), catalog.gpu("A6000"))
    env = simpy.Environment()
    replica = ReplicaSim(env, engine)
    first = Request(3000, 50, store_key="a")
    second = Request(3200, 50, prefix_key="a", prefix_tokens=3050, store_key="b")
    cold = Request(3200, 50)

    def run():
        yield replica.submit(first)
        yield replica.submit(second)
        yield replica.submit(cold)

    env.process(run())
    env.run()
    assert second.hit_tokens == 3049 and cold.hit_tokens == 0
    assert second.first_token_s is not None and cold.first_token_s is not None
    assert (second.first_token_s - second.arrival_s) < 0.5 * (cold.first_token_s - cold.arrival_s)


def test_encoder_batches_whole_requests():
    engine = Engine(catalog.model("e5-base-v2"), catalog.gpu("A6000"), fraction=0.2)
    requests = [Request(64, 0) for _ in range(100)]
    replica = _run(engine, requests, [0.0] * 100)
    assert replica.completed == 100
    assert replica.iterations < 10  # 2048-token budget holds 32 requests per iteration


def test_least_outstanding_routing_and_cache_affinity():
    env = simpy.Environment()
    engine = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"))
    router = Router("gen", policy="least_outstanding")
    for name in ("r0", "r1"):
        router.add(ReplicaSim(env, engine, name))
    router.route(Request(100, 100))
    router.route(Request(100, 100))
    assert [r.outstanding for r in router.replicas] == [1, 1]

    env = simpy.Environment()
    aware = Router("gen")
    for name in ("r0", "r1"):
        aware.add(ReplicaSim(env, engine, name))
    aware.route(Request(100, 100, store_key="x"))  # to r0
    aware.route(Request(100, 100))  # least outstanding: r1
    aware.route(Request(200, 10, prefix_key="x"))  # affinity: r0 although it is not less loaded
    assert [r.outstanding for r in aware.replicas] == [2, 1]
    with pytest.raises(ValueError):
        Router("gen", policy="random")


def test_draining_replica_retires_when_empty():
    env = simpy.Environment()
    engine = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"))
    router = Router("gen")
    a, b = ReplicaSim(env, engine, "a"), ReplicaSim(env, engine, "b")
    router.add(a)
    router.add(b)
    router.route(Request(100, 200))
    router.drain(a)
    assert router.active == [b]
    env.run()
    assert a.retired_s is not None and a.completed == 1 and b.retired_s is None
