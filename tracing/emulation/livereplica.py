"""A replica of the engine model running in real time: the scheduler of the engine emulator.

`LiveReplica` runs the continuous-batching scheduler of models/performance/replica.py (`ReplicaSim`: chunked
prefill, token budget, KV-cache admission, recompute preemption, prefix cache) on a SimPy clock
that follows the asyncio loop's monotonic clock. Each scheduler iteration lasts what the engine
model (models/performance/engine.py) says for the batch it actually runs; when it ends, every sequence in it
that produced a token gets that token at once (streams send it right away). So the emulator's
timing is the engine model's, not a second copy of it.

Clock. Virtual (modelled) time `v` and loop time `t` are tied by

    v = (t - t0) * speedup

A single timer (`loop.call_at`) wakes the driver when the next iteration is due; the driver then
runs every simulation event with `v_event <= v(now)`. An iteration is never processed early, and
one processed late (the timer fired late, the machine was busy) does not shift the next one: the
next iteration is scheduled from the modelled end of the previous one, not from when the driver
got to it, so lateness does not accumulate (it is measured: `lag_s_max`, `lag_s_mean`). A request
that arrives at loop time `t` enters the scheduler at `v(t)`: the clock is advanced to that
instant first, so a request arriving mid-iteration waits for the iteration's end, as in a real
engine.

Prefix cache. With `prefix_caching`, a finished sequence's prompt and output stay cached
(`ReplicaSim`'s LRU cache in the free KV blocks). Which cached entry a new prompt extends is found
here, as vLLM does: prompts are split into blocks of `block_tokens` units, each block's hash
chains the previous one's, and the longest run of leading blocks seen before in a cached entry is
the hit (whole blocks only; the scheduler grants it if the entry is still cached).
"""

from __future__ import annotations

import asyncio
import itertools
import math
from dataclasses import dataclass, field
from typing import Hashable, Sequence

import simpy

from scepsy.models.performance.engine import Engine
from scepsy.models.performance.replica import ReplicaSim, Request

BLOCK_TOKENS = 16  # vLLM's default KV block size


@dataclass(eq=False)
class LiveSequence:
    """One sequence the replica runs (a completion choice, or one encoder input); the handler of
    the HTTP request reads `generated` and `finished` whenever `notify` is set."""

    notify: asyncio.Event
    completion_tokens: int
    units: Sequence[str] = ()  # prompt units + output units, for the prefix cache
    stream: bool = True  # notify on every token (else only when finished)
    request: Request | None = None
    generated: int = 0
    finished: bool = False
    aborted: bool = False
    first_token_at_s: float | None = None  # loop time of the first token
    finished_at_s: float | None = None

    @property
    def cached_tokens(self) -> int:
        return self.request.hit_tokens if self.request is not None else 0


def _generated(request: Request) -> int:
    """Tokens a decoder request has produced so far. `ReplicaSim` keeps the count in the
    request's `_generated` field (its own bookkeeping); this is the one place that reads it."""
    return request._generated


class _Replica(ReplicaSim):
    """`ReplicaSim` that reports every iteration's outcome and can drop requests a client left.

    `_apply(plan)` is where `ReplicaSim` lands the results of an iteration; it is extended (not
    changed) to hand the produced tokens to the live sequences and to remove aborted requests at
    the iteration boundary, where the KV accounting is consistent.
    """

    def __init__(self, env: simpy.Environment, engine: Engine, on_iteration, name: str):
        super().__init__(env, engine, name=name, fast_forward=False)
        self._on_iteration = on_iteration
        self._aborted: list[Request] = []

    def _apply(self, plan):
        super()._apply(plan)
        self._on_iteration(plan)
        if self._aborted:
            self._drop_aborted()

    def abort(self, request: Request) -> None:
        if request in self.waiting:  # not in the iteration in flight: drop it now
            self.waiting.remove(request)
        elif request in self.running:
            self._aborted.append(request)

    def _drop_aborted(self) -> None:
        for request in self._aborted:
            if request in self.running:
                self.running.remove(request)
                self._release(request)
            elif request in self.waiting:  # preempted since the abort
                self.waiting.remove(request)
        self._aborted.clear()


class _PrefixIndex:
    """Block hashes of cached sequences -> (store key, tokens covered up to that block)."""

    def __init__(self, block_tokens: int):
        self.block_tokens = block_tokens
        self.blocks: dict[int, tuple[Hashable, int]] = {}

    def _hashes(self, units: Sequence[str], limit: int):
        previous = 0
        for start in range(0, limit - self.block_tokens + 1, self.block_tokens):
            previous = hash((previous, tuple(units[start:start + self.block_tokens])))
            yield previous, start + self.block_tokens

    def lookup(self, units: Sequence[str], cached: dict) -> tuple[Hashable | None, int]:
        """(store key, hit tokens) of the longest cached prefix of `units`; (None, 0) if none."""
        best: tuple[Hashable | None, int] = (None, 0)
        for block, covered in self._hashes(units, len(units)):
            entry = self.blocks.get(block)
            if entry is None or entry[0] not in cached:
                break
            best = (entry[0], covered)
        return best

    def add(self, key: Hashable, units: Sequence[str], tokens: int) -> None:
        for block, covered in self._hashes(units, min(tokens, len(units))):
            self.blocks[block] = (key, covered)

    def prune(self, cached: dict) -> None:
        self.blocks = {block: entry for block, entry in self.blocks.items() if entry[0] in cached}


@dataclass
class ReplicaStats:
    """Counters of the live replica (modelled seconds unless named otherwise)."""

    iterations: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    cached_tokens: int = 0
    finished_sequences: int = 0
    aborted_sequences: int = 0
    lag_s_max: float = 0.0  # wall-clock lateness of iteration ends, s
    lag_s_sum: float = 0.0
    lag_samples: int = 0

    @property
    def lag_s_mean(self) -> float:
        return self.lag_s_sum / self.lag_samples if self.lag_samples else 0.0


@dataclass
class LiveReplica:
    """The engine model's replica in real time (see the module doc). Create it inside the running
    event loop; `submit` from request handlers on that loop."""

    engine: Engine
    speedup: float = 1.0
    prefix_caching: bool = True
    block_tokens: int = BLOCK_TOKENS
    name: str = "emulator"
    stats: ReplicaStats = field(default_factory=ReplicaStats)

    def __post_init__(self) -> None:
        if not self.speedup > 0:
            raise ValueError(f"speedup must be positive, got {self.speedup}")
        self.loop = asyncio.get_running_loop()
        self.t0 = self.loop.time()
        self.env = simpy.Environment()
        self.replica = _Replica(self.env, self.engine, self._on_iteration, self.name)
        self.index = _PrefixIndex(self.block_tokens)
        self._keys = itertools.count(1)
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = math.inf
        self._finished_since_prune = 0
        self.closed = False

    # -- clock ----------------------------------------------------------------------------------

    def virtual_now(self) -> float:
        """Modelled seconds since the replica started."""
        return (self.loop.time() - self.t0) * self.speedup

    def loop_time(self, virtual_s: float) -> float:
        return self.t0 + virtual_s / self.speedup

    def _catch_up(self) -> None:
        """Run every simulation event due by now; leave the simulation clock at now."""
        now = self.virtual_now()
        while self.env.peek() <= now:
            self.env.step()
        if now > self.env.now:
            self.env.run(until=now)

    def _arm(self) -> None:
        """Set the timer for the next due simulation event (if it moved)."""
        due = self.env.peek()
        if due == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = due
        if due != math.inf and not self.closed:
            self._timer = self.loop.call_at(self.loop_time(due), self._tick)

    def _tick(self) -> None:
        lag = self.loop.time() - self.loop_time(self._timer_at)
        if lag >= 0:  # a timer may fire a little early (millisecond timers); then nothing is due yet
            stats = self.stats
            stats.lag_s_max = max(stats.lag_s_max, lag)
            stats.lag_s_sum += lag
            stats.lag_samples += 1
        self._timer, self._timer_at = None, math.inf
        self._catch_up()
        self._arm()

    def close(self) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    # -- requests -------------------------------------------------------------------------------

    def submit(self, sequence: LiveSequence, prompt_tokens: int, prompt_units: Sequence[str] = ()) -> LiveSequence:
        """Enter one sequence into the scheduler now. Decoders: `prompt_tokens` prompt,
        `sequence.completion_tokens` to generate; encoders: `prompt_tokens` in one pass."""
        self._catch_up()
        encoder = self.engine.model.encoder
        prefix_key, prefix_tokens, store_key = None, 0, None
        if self.prefix_caching and not encoder:
            prefix_key, prefix_tokens = self.index.lookup(prompt_units, self.replica.cache)
            store_key = next(self._keys)
        request = Request(
            prompt_tokens=prompt_tokens,
            completion_tokens=0 if encoder else sequence.completion_tokens,
            prefix_key=prefix_key,
            prefix_tokens=prefix_tokens,
            store_key=store_key,
            tag=sequence,
        )
        sequence.request = request
        self.replica.submit(request)
        self.stats.prompt_tokens += prompt_tokens
        self._catch_up()  # the scheduler admits it at this instant if it can
        self._arm()
        return sequence

    def abort(self, sequence: LiveSequence) -> None:
        """The client left: stop working on the sequence (at the end of the iteration in flight)."""
        if sequence.finished or sequence.aborted or sequence.request is None:
            return
        sequence.aborted = True
        self.stats.aborted_sequences += 1
        if not self.engine.model.encoder:
            self.replica.abort(sequence.request)

    def _on_iteration(self, plan) -> None:
        self.stats.iterations += 1
        now = self.loop.time()
        encoder = self.engine.model.encoder
        for request, _ in plan:
            sequence: LiveSequence = request.tag
            if sequence.aborted:
                continue
            generated = 0 if encoder else _generated(request)
            if generated > sequence.generated:
                if sequence.generated == 0:
                    sequence.first_token_at_s = now
                    self.stats.cached_tokens += request.hit_tokens
                self.stats.generation_tokens += generated - sequence.generated
                sequence.generated = generated
                if sequence.stream:
                    sequence.notify.set()
            if request.finish_s is not None and not sequence.finished:
                if sequence.first_token_at_s is None:
                    sequence.first_token_at_s = now
                sequence.finished, sequence.finished_at_s = True, now
                self.stats.finished_sequences += 1
                sequence.notify.set()
                self._remember(request, sequence)

    def _remember(self, request: Request, sequence: LiveSequence) -> None:
        if request.store_key is None:
            return
        tokens = request.prompt_tokens + max(sequence.generated - 1, 0)
        self.index.add(request.store_key, sequence.units, tokens)
        self._finished_since_prune += 1
        if self._finished_since_prune >= 512:
            self.index.prune(self.replica.cache)
            self._finished_since_prune = 0

    # -- state ----------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        return len(self.replica.running)

    @property
    def waiting(self) -> int:
        return len(self.replica.waiting)

    @property
    def kv_usage(self) -> float:
        capacity = self.replica.capacity
        return 0.0 if self.engine.model.encoder or capacity <= 0 else self.replica.used / capacity

    @property
    def busy_s(self) -> float:
        """Modelled seconds the replica has spent in iterations."""
        return self.replica.busy_s
