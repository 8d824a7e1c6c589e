"""Discrete-event model (SimPy) of one engine replica with continuous batching, and a router.

`ReplicaSim` runs the scheduler of a vLLM-like engine, one iteration after another, each timed by
the engine model (models/performance/engine.py):

1. running sequences first, in admission order: each decoding sequence takes one token of the
   iteration's budget (`max_num_batched_tokens`), each partially prefilled one its next chunk;
2. then waiting requests in the order of the scheduling policy, while a sequence slot
   (`max_num_seqs`), budget and KV cache for the scheduled tokens remain (chunked prefill: a long
   prompt spans iterations);
3. if decoding sequences need more KV than is free, a running sequence is preempted (vLLM's
   recompute preemption: its KV is dropped and it waits again with its generated tokens appended
   to the prompt).

Scheduling policies, as vLLM's v1 engine implements them (`--scheduling-policy`; read in
vllm-project/vllm@00024d314514: vllm/v1/core/sched/request_queue.py `FCFSRequestQueue`,
`PriorityRequestQueue`, vllm/v1/core/sched/scheduler.py `Scheduler.schedule`, the preemption in
its loop over running requests):
- `fcfs`: the waiting queue is served in arrival order; the preempted sequence is the most recently
  admitted one (`self.running.pop()`) and it waits at the head of the queue;
- `priority`: the waiting queue is served by (priority, arrival time), lowest first (a heap); the
  preempted sequence is the running one with the largest (priority, arrival time) and it re-enters
  the heap under its own key. vLLM takes that largest key over every running sequence, undoing
  its schedule if it was already scheduled in the iteration; the model takes it over the running
  sequences not yet scheduled in the iteration (the same sequence unless a lower-priority one was
  admitted earlier than the one that needs the memory). A waiting request never preempts a running
  one (vLLM v1 has no such path; SGLang does, above a priority difference, unless
  `--disable-priority-preemption`).
The workflow simulator gives every call of a workflow request that request's arrival time as its
priority (models/simulation/simulator.py), so that the engine serves older workflows first.

A request finishes when its last token is produced (the first token comes with the iteration that
completes its prompt; a request with completion_tokens <= 1 finishes there). Encoder requests are
prefill-only and atomic (all their sequences in one iteration, as an embedding server batches).

Prefix caching: a request may name the cache entry its prompt starts with (`prefix_key`,
`prefix_tokens`) and the entry to store its own prompt+output under when it finishes
(`store_key`). Entries live in the replica's free KV blocks (LRU, evicted when running sequences
need the space); a hit skips the prefill of the cached tokens. `cached_tokens` forces a hit of
that many tokens (trace replay, where the cache state is not simulated).

`Router` spreads requests over an LLM's replicas: least outstanding requests, with SGLang-style
prefix-cache affinity by default; it supports adding replicas and draining them (autoscaling).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator

import numpy as np
import simpy

from scepsy.models.performance.engine import Engine, IterationWork, causal_attention


@dataclass(eq=False)
class Request:
    """One LLM call. Token counts are fixed at creation; the rest is filled in by the replica."""

    prompt_tokens: int
    completion_tokens: int = 1
    sequences: int = 1  # independent sequences in one request (reranker pairs); encoders only
    prefix_key: Hashable | None = None
    prefix_tokens: int = 0
    store_key: Hashable | None = None
    cached_tokens: int = 0
    priority: float = 0.0  # lower is served first under the `priority` policy (vLLM's convention)
    tag: object = None  # caller's annotation (llm name, workflow request id, ...)
    # runtime state
    arrival_s: float = 0.0
    start_s: float | None = None  # first scheduled
    first_token_s: float | None = None
    finish_s: float | None = None
    hit_tokens: int = 0
    preemptions: int = 0
    done: simpy.Event | None = field(default=None, repr=False)
    _prompt: int = 0  # prompt to compute (grows on preemption)
    _computed: int = 0  # prompt tokens whose KV exists
    _generated: int = 0
    _recomputed: int = 0  # generated tokens folded into _prompt by preemptions

    @property
    def latency_s(self) -> float | None:
        return None if self.finish_s is None else self.finish_s - self.arrival_s

    @property
    def context_tokens(self) -> int:
        """Tokens whose KV the sequence holds (the newest generated token's KV is written when it
        is fed back in the next iteration)."""
        if not self._prompt_done:
            return self._computed
        return self._computed + max(self._generated - 1 - self._recomputed, 0)

    @property
    def _prompt_done(self) -> bool:
        return self._computed >= self._prompt


SCHEDULING_POLICIES = ("fcfs", "priority")
# The unit of a workflow request's start as the entry tags it (`priority` in whole seconds since the
# epoch: an integer that fits the 32-bit fields of gateways that parse the body until 2038)
PRIORITY_UNIT_S = 1.0


class FcfsQueue:
    """vLLM's FCFS waiting queue: arrival order; a preempted request goes back to the head."""

    def __init__(self) -> None:
        self._items: deque[Request] = deque()

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._items)

    def push(self, request: Request) -> None:
        self._items.append(request)

    def push_preempted(self, request: Request) -> None:
        self._items.appendleft(request)

    def peek(self) -> Request:
        return self._items[0]

    def pop(self) -> Request:
        return self._items.popleft()

    def remove(self, request: Request) -> None:
        """Take out a request that will not run (its client left)."""
        self._items.remove(request)

    @staticmethod
    def victim(candidates: list[Request]) -> Request:
        return candidates[-1]  # the most recently admitted


class PriorityQueue:
    """vLLM's priority waiting queue: a heap on (priority, arrival time); a preempted request
    re-enters under its own key (ties: submission order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, float, int, Request]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in self._heap)

    def push(self, request: Request) -> None:
        heapq.heappush(self._heap, (request.priority, request.arrival_s, next(self._order), request))

    push_preempted = push

    def peek(self) -> Request:
        return self._heap[0][3]

    def pop(self) -> Request:
        return heapq.heappop(self._heap)[3]

    def remove(self, request: Request) -> None:
        """Take out a request that will not run (its client left)."""
        self._heap = [entry for entry in self._heap if entry[3] is not request]
        heapq.heapify(self._heap)

    @staticmethod
    def victim(candidates: list[Request]) -> Request:
        return max(reversed(candidates), key=lambda r: (r.priority, r.arrival_s))  # ties: the newest


def waiting_queue(policy: str) -> FcfsQueue | PriorityQueue:
    if policy not in SCHEDULING_POLICIES:
        raise ValueError(f"unknown scheduling policy {policy!r}; use one of {SCHEDULING_POLICIES}")
    return PriorityQueue() if policy == "priority" else FcfsQueue()


class ReplicaSim:
    """One engine replica as a SimPy process (see module doc)."""

    def __init__(
        self,
        env: simpy.Environment,
        engine: Engine,
        name: str = "replica",
        on_finish: Callable | None = None,
        fast_forward: bool = True,
        policy: str = "fcfs",
        start: bool = True,
    ):
        self.env = env
        self.fast_forward = fast_forward  # run pure-decode stretches as one event (same timing)
        self.engine = engine
        self.name = name
        self.on_finish = on_finish
        self.encoder = engine.model.encoder
        self.capacity = engine.kv_capacity_tokens
        self.policy = policy
        self.waiting = waiting_queue(policy)
        self.running: list[Request] = []
        self.cache: OrderedDict[Hashable, int] = OrderedDict()
        self.cached_total = 0
        self.used = 0  # KV tokens held by running sequences
        self.busy_s = 0.0
        self.iterations = 0
        self.tokens = 0
        self.completed = 0
        self.latency_sum_s = 0.0  # of the completed requests, from arrival at the replica (an engine's e2e histogram's sum)
        self.preemptions = 0
        self.batch_token_s = 0.0  # integral of running sequences over busy time
        self.accepting = True
        self.started_s = env.now
        self.retired_s: float | None = None
        self.log: list[tuple[str, Request, int]] | None = None  # ("admit", request, hit) / ("preempt", request, 0)
        self._wake = env.event()
        if start:
            env.process(self._loop())

    # -- interface ----------------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        return len(self.waiting) + len(self.running)

    def submit(self, request: Request) -> simpy.Event:
        if not self.encoder and request.prompt_tokens + request.completion_tokens > self.capacity:
            raise ValueError(
                f"{self.name}: a request of {request.prompt_tokens}+{request.completion_tokens} tokens exceeds "
                f"the replica's KV cache of {self.capacity} tokens"
            )
        request.arrival_s = self.env.now
        request.done = self.env.event()
        request._prompt = request.prompt_tokens
        self.waiting.push(request)
        if not self._wake.triggered:
            self._wake.succeed()
        return request.done

    def step(self) -> list[tuple[Request, int]]:
        """One scheduler iteration at the current simulated time, without advancing it: schedule,
        then land the results (a replica made with `start=False` is driven this way, step by step,
        as the differential test against vLLM's scheduler does). Returns the iteration's plan:
        (request, prompt tokens computed; 0 for a decode)."""
        work, plan = self._schedule_encoder() if self.encoder else self._schedule_decoder()
        self.iterations += 1
        self.tokens += work.tokens
        self._apply(plan)
        return plan

    def utilization(self, since_s: float = 0.0) -> float:
        elapsed = self.env.now - max(since_s, self.started_s)
        return self.busy_s / elapsed if elapsed > 0 else 0.0

    # -- cache ----------------------------------------------------------------------------------

    def _evict(self) -> None:
        while self.cache and self.cached_total > self.capacity - self.used:
            _, tokens = self.cache.popitem(last=False)
            self.cached_total -= tokens

    def _lookup(self, request: Request) -> int:
        if request.cached_tokens:
            return min(request.cached_tokens, request._prompt - 1)
        if request.prefix_key is None or request.prefix_key not in self.cache:
            return 0
        self.cache.move_to_end(request.prefix_key)
        return max(min(request.prefix_tokens, self.cache[request.prefix_key], request._prompt - 1), 0)

    def _store(self, request: Request) -> None:
        if request.store_key is None or self.encoder:
            return
        tokens = request._prompt + max(request._generated - 1, 0)
        old = self.cache.pop(request.store_key, 0)
        self.cached_total += tokens - old
        self.cache[request.store_key] = tokens
        self._evict()

    # -- scheduling -----------------------------------------------------------------------------

    def _preempt_for(self, needed: int, protected: int) -> None:
        """Free KV by recompute-preempting the newest running sequences beyond index `protected`."""
        while self.used + needed > self.capacity and len(self.running) > protected + 1:
            victim = self.waiting.victim(self.running[protected + 1:])
            self.running.remove(victim)
            self.used -= victim.context_tokens
            victim._prompt = victim.prompt_tokens + victim._generated  # recompute prompt and outputs
            victim._recomputed = victim._generated
            victim._computed = 0
            victim.preemptions += 1
            self.preemptions += 1
            if self.log is not None:
                self.log.append(("preempt", victim, 0))
            self.waiting.push_preempted(victim)

    def _schedule_decoder(self) -> tuple[IterationWork, list[tuple[Request, int]]]:
        s = self.engine.settings
        budget = s.max_num_batched_tokens
        plan: list[tuple[Request, int]] = []  # (request, prompt tokens computed now; 0 = decode)
        decode_n = decode_ctx = 0
        pre_tokens = pre_past = finishing = 0
        pre_attn = 0.0
        self._evict()
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            if request._prompt_done:
                if self.used + 1 > self.capacity:
                    self._preempt_for(1, index)
                    if self.used + 1 > self.capacity:
                        break
                decode_n += 1
                decode_ctx += request.context_tokens
                self.used += 1
                budget -= 1
                plan.append((request, 0))
            else:
                chunk = min(request._prompt - request._computed, budget)
                if self.used + chunk > self.capacity:
                    self._preempt_for(chunk, index)
                    chunk = min(chunk, self.capacity - self.used)
                    if chunk <= 0:
                        break
                pre_tokens += chunk
                pre_past += request._computed
                pre_attn += causal_attention(chunk, request._computed)
                finishing += request._computed + chunk >= request._prompt
                self.used += chunk
                budget -= chunk
                plan.append((request, chunk))
            index += 1
        while self.waiting and budget > 0 and len(self.running) < s.max_num_seqs:
            request = self.waiting.peek()
            hit = self._lookup(request)
            chunk = min(request._prompt - hit, budget)
            if self.used + hit + chunk > self.capacity:
                self._evict()
                if self.used + hit + chunk > self.capacity:
                    if self.running or plan:
                        break
                    # alone and still too large: run it in the budget the memory allows
                    chunk = max(self.capacity - self.used - hit, 1)
            self.waiting.pop()
            request.hit_tokens = hit
            if self.log is not None:
                self.log.append(("admit", request, hit))
            request._computed = hit
            if request.start_s is None:
                request.start_s = self.env.now
            self.running.append(request)
            pre_tokens += chunk
            pre_past += hit
            pre_attn += causal_attention(chunk, hit)
            finishing += hit + chunk >= request._prompt
            self.used += hit + chunk
            budget -= chunk
            plan.append((request, chunk))
            self._evict()
        work = IterationWork(
            prefill_tokens=pre_tokens,
            prefill_attention=pre_attn,
            prefill_past_tokens=pre_past,
            prefills_finishing=int(finishing),
            decode_sequences=decode_n,
            decode_context=decode_ctx,
        )
        return work, plan

    def _schedule_encoder(self) -> tuple[IterationWork, list[tuple[Request, int]]]:
        s = self.engine.settings
        budget = s.max_num_batched_tokens
        plan: list[tuple[Request, int]] = []
        tokens = sequences = 0
        attention = 0.0
        while self.waiting and len(plan) < s.max_num_seqs:
            request = self.waiting.peek()
            if plan and request.prompt_tokens > budget:
                break
            self.waiting.pop()
            request.start_s = self.env.now
            per_seq = request.prompt_tokens / max(request.sequences, 1)
            tokens += request.prompt_tokens
            sequences += request.sequences
            attention += request.sequences * per_seq * per_seq
            budget -= request.prompt_tokens
            plan.append((request, request.prompt_tokens))
        work = IterationWork(prefill_tokens=tokens, prefill_attention=attention, prefills_finishing=sequences)
        return work, plan

    def _apply(self, plan: list[tuple[Request, int]]) -> None:
        now = self.env.now
        finished: list[Request] = []
        for request, chunk in plan:
            if self.encoder:
                request.first_token_s = now
                finished.append(request)
                continue
            if chunk == 0:
                request._generated += 1
            else:
                request._computed += chunk
                if request._prompt_done:
                    request._generated += 1
                    if request.first_token_s is None:
                        request.first_token_s = now
            if request._prompt_done and request._generated >= max(request.completion_tokens, 1):
                finished.append(request)
        for request in finished:
            request.finish_s = now
            if not self.encoder:
                self.running.remove(request)
                self.used -= request.context_tokens
                self._store(request)
            self.completed += 1
            self.latency_sum_s += now - request.arrival_s
            assert request.done is not None  # set when the request was submitted
            request.done.succeed(request)
            if self.on_finish is not None:
                self.on_finish(self, request)

    def _decode_run_length(self) -> int:
        """Iterations that will be pure decode of the current running set: no waiting request, no
        prefill in progress, enough free KV, and none finishing before the last of them."""
        if not self.fast_forward or self.encoder or self.waiting or not self.running:
            return 0
        steps = min(r.completion_tokens - r._generated for r in self.running)
        if steps < 2 or any(not r._prompt_done for r in self.running):
            return 0
        if len(self.running) > self.engine.settings.max_num_batched_tokens:
            return 0
        if self.used + steps * len(self.running) > self.capacity:
            return 0
        return steps

    def _advance_decodes(self, steps: int) -> None:
        for request in self.running:
            request._generated += steps
        self.used += steps * len(self.running)
        self.iterations += steps
        self.tokens += steps * len(self.running)

    def _decode_run(self, steps: int):
        """Fast-forward `steps` decode iterations as one event; an arrival cuts the run short at the
        end of the iteration in progress (the scheduler then admits it, as it would)."""
        batch = len(self.running)
        context = sum(r.context_tokens for r in self.running)
        times = self.engine.decode_run_times_s(batch, context, steps)
        start = self.env.now
        ends, total = [], 0.0
        for t in times:
            total += t
            ends.append(total)
        self._wake = self.env.event()
        yield self.env.timeout(total) | self._wake
        elapsed = self.env.now - start
        if elapsed < total - 1e-12:
            done = next(i for i, end in enumerate(ends) if end > elapsed + 1e-12) + 1  # finish this one
            yield self.env.timeout(ends[done - 1] - elapsed)
        else:
            done = steps
        self.busy_s += ends[done - 1]
        self.batch_token_s += ends[done - 1] * batch
        self._advance_decodes(done - 1)
        self._evict()
        # the last iteration goes through _apply so that finishing requests are completed
        last_plan = [(r, 0) for r in self.running]
        self.used += batch
        self.iterations += 1
        self.tokens += batch
        self._apply(last_plan)

    def _loop(self):
        while True:
            if not self.waiting and not self.running:
                if not self.accepting:  # drained: the replica is gone
                    self.retired_s = self.env.now
                    return
                self._wake = self.env.event()
                yield self._wake
                continue
            steps = self._decode_run_length()
            if steps:
                yield from self._decode_run(steps)
                continue
            work, plan = self._schedule_encoder() if self.encoder else self._schedule_decoder()
            if not plan:  # cannot happen with a positive KV capacity; guard against a live-lock
                raise RuntimeError(f"{self.name}: no request fits the KV cache ({self.capacity} tokens)")
            duration = self.engine.iteration_time_s(work)
            self.busy_s += duration
            self.iterations += 1
            self.tokens += work.tokens
            self.batch_token_s += duration * len(plan)
            yield self.env.timeout(duration)
            self._apply(plan)


def unit_gaps(rng: random.Random, count: int) -> np.ndarray:
    """Exponential gaps scaled so that the realised rate over the run is exactly the nominal one."""
    gaps = np.array([rng.expovariate(1.0) for _ in range(count)])
    gaps *= (count - 1) / gaps[1:].sum()
    return gaps


def run_poisson(engine: Engine, requests: list[Request], gaps: np.ndarray, rate: float,
                warmup_fraction: float) -> tuple[float, float]:
    """Submit `requests` to one replica as arrivals at `rate` (unit-mean `gaps` / rate) and run until
    the last arrival plus the time an overloaded replica is given to drain (3 windows, at least 60 s;
    its latencies then only mark the rate unstable). The requests record their finish times. Returns
    the measurement window: the arrival of the first request past `warmup_fraction`, the last
    arrival (profile synthesis, models/profiles/synthesize.py; load shapes, fraction_shape.py)."""
    env = simpy.Environment()
    replica = ReplicaSim(env, engine)
    arrivals = np.cumsum(np.asarray(gaps) / rate)
    warm = int(len(requests) * warmup_fraction)
    window = (float(arrivals[warm]), float(arrivals[-1]))

    def source():
        for request, at in zip(requests, arrivals):
            yield env.timeout(at - env.now)
            replica.submit(request)

    env.process(source())
    env.run(until=window[1] + max(3 * (window[1] - window[0]), 60.0))
    return window


def _relay(done: simpy.Event) -> Callable[[simpy.Event], None]:
    """A callback that fires `done` with the value of the event it is called with."""

    def fire(event: simpy.Event) -> None:
        done.succeed(event.value)

    return fire


class Router:
    """Routes an LLM's calls over its replicas, as SGLang's router does (the paper's deployment).

    `least_outstanding`: the replica with the fewest outstanding requests (ties: lowest index).
    `cache_aware` (default): the same, except that a call whose prompt starts with an earlier
    call's prompt+output (`prefix_key`) goes to the replica that earlier call was sent to, unless
    the replicas' loads are imbalanced: max - min outstanding > `balance_abs_threshold` (SGLang's
    default 32). The router remembers where it sent each `store_key` (its own view, as SGLang's
    approximate radix tree; the replica may have evicted the entry since). A call that arrives
    while no replica serves, after one has, waits at the router until the next replica joins.
    """

    POLICIES = ("cache_aware", "least_outstanding")

    def __init__(self, name: str, policy: str = "cache_aware", balance_abs_threshold: int = 32):
        if policy not in self.POLICIES:
            raise ValueError(f"unknown routing policy {policy!r}; use one of {self.POLICIES}")
        self.name = name
        self.policy = policy
        self.balance_abs_threshold = balance_abs_threshold
        self.replicas: list[ReplicaSim] = []
        self.retired: list[ReplicaSim] = []
        self.parked: list[tuple[Request, simpy.Event]] = []  # calls that arrived while no replica served
        self._owner: dict[Hashable, ReplicaSim] = {}

    def add(self, replica: ReplicaSim) -> None:
        self.replicas.append(replica)
        parked, self.parked = self.parked, []
        for request, done in parked:
            self.route(request).callbacks.append(_relay(done))

    @property
    def active(self) -> list[ReplicaSim]:
        return [r for r in self.replicas if r.accepting]

    def drain(self, replica: ReplicaSim) -> None:
        """Stop routing to `replica`; it finishes what it holds and is then retired."""
        replica.accepting = False
        self.replicas.remove(replica)
        self.retired.append(replica)
        if not replica._wake.triggered:
            replica._wake.succeed()

    def choose(self, request: Request) -> ReplicaSim:
        candidates = self.active
        if not candidates:
            raise RuntimeError(f"llm {self.name} has no replica to serve the request")
        loads = [r.outstanding for r in candidates]
        best = candidates[min(range(len(candidates)), key=lambda i: (loads[i], i))]
        if self.policy == "cache_aware" and request.prefix_key is not None:
            owner = self._owner.get(request.prefix_key)
            if owner is not None and owner.accepting and max(loads) - min(loads) <= self.balance_abs_threshold:
                best = owner
        return best

    def forget(self, store_key: Hashable) -> None:
        """Drop a stored prompt's owner once no call can extend it (its workflow request has
        finished), so that the router's memory does not grow with the run."""
        self._owner.pop(store_key, None)

    def route(self, request: Request) -> simpy.Event:
        if not self.active and self.retired:
            # between an LLM's last replica and its successor (a staged swap on a full cluster):
            # the call waits at the router, as at a gateway, until a replica joins
            done = self.retired[-1].env.event()
            self.parked.append((request, done))
            return done
        replica = self.choose(request)
        if request.store_key is not None:
            self._owner[request.store_key] = replica
        return replica.submit(request)
