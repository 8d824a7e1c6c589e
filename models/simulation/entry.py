"""The workflow entry's hold on an LLM's calls (what `scepsy proxy --workflow-priority
--max-in-flight LLM=N` does in front of the routers, tracing/capture/proxy.py): at most `limit` of
the LLM's calls are outstanding at its router; the others wait at the entry and are sent, as calls
finish, oldest workflow request first (by `priority`, the workflow request's start, then arrival).

The engines then hold a bounded queue whatever the router passes on of the body, so a workflow's
next call is not queued behind every newer workflow's call after a burst: the calls waiting are
at the entry, where their order is the workflows' age (models/simulation/simulator.py).
"""

from __future__ import annotations

import heapq
import itertools

import simpy

from scepsy.models.performance.replica import Request, Router


class EntryGate:
    """One LLM's calls through the entry: `submit` returns an event that fires with the finished
    request, as the router's does."""

    def __init__(self, env: simpy.Environment, router: Router, limit: int):
        if limit < 1:
            raise ValueError(f"the entry's limit of {router.name}'s calls in flight must be >= 1, got {limit}")
        self.env = env
        self.router = router
        self.limit = limit
        self.outstanding = 0
        self.held = 0  # calls that ever waited at the entry
        self._pending: list[tuple[float, float, int, Request, simpy.Event]] = []
        self._order = itertools.count()

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def submit(self, request: Request) -> simpy.Event:
        done = self.env.event()
        if self.outstanding < self.limit:
            self._send(request, done)
        else:
            self.held += 1
            heapq.heappush(self._pending, (request.priority, self.env.now, next(self._order), request, done))
        return done

    def _send(self, request: Request, done: simpy.Event) -> None:
        self.outstanding += 1
        sent = self.router.route(request)
        sent.callbacks.append(lambda event: self._finished(event, done))

    def _finished(self, event: simpy.Event, done: simpy.Event) -> None:
        self.outstanding -= 1
        done.succeed(event.value)
        while self._pending and self.outstanding < self.limit:
            *_, request, waiting = heapq.heappop(self._pending)
            self._send(request, waiting)
