"""The paper's workflow statistic (section 4): per LLM m of a workflow, the invocations n and the
request-level parallelism p, from the intervals of its calls. Computed here once, for traces
(tracing/statistics/stats.py, which documents the definitions) and for the simulator
(models/simulation/simulator.py), so that the quantity the planner rests on cannot drift.

For one request r with the calls of m at intervals [s_i, e_i]:
    N_rm = number of calls,  D_rm = sum_i (e_i - s_i),  U_rm = |union_i [s_i, e_i]|
Over the R requests of the workflow (requests that never call m count in R):
    n = sum_r N_rm / R,      p = sum_r D_rm / sum_r U_rm   (pooled)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence


def union_length(intervals: Iterable[tuple[float, float]]) -> float:
    """Measure of the union of closed intervals, s."""
    total, current_start, current_end = 0.0, 0.0, None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


@dataclass(frozen=True)
class RequestUse:
    """One request's use of one LLM: N calls, D call time and U busy time, s."""

    calls: int
    call_time_s: float
    busy_s: float


def request_use(intervals: Sequence[tuple[float, float]]) -> RequestUse:
    return RequestUse(len(intervals), sum(end - start for start, end in intervals), union_length(intervals))


@dataclass
class InvocationStatistic:
    """n and p of one LLM, accumulated request by request."""

    requests: int = 0
    calls: int = 0
    call_time_s: float = 0.0
    busy_s: float = 0.0

    def add(self, use: RequestUse) -> None:
        self.requests += 1
        self.calls += use.calls
        self.call_time_s += use.call_time_s
        self.busy_s += use.busy_s

    @property
    def invocations(self) -> float:
        """n: calls per request (NaN without requests)."""
        return self.calls / self.requests if self.requests else math.nan

    def parallelism(self, without_calls: float = math.nan) -> float:
        """p: pooled parallelism; `without_calls` when no call took any time."""
        return self.call_time_s / self.busy_s if self.busy_s > 0 else without_calls
