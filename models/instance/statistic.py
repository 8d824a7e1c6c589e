"""The paper's workflow statistic (section 4): per LLM m of a workflow, the invocations n and the
request-level parallelism p, from the intervals of its calls. Computed here once, for traces
(tracing/statistics/stats.py, which documents the definitions) and for the simulator
(models/simulation/simulator.py), so that the quantity the planner rests on cannot drift.

For one request r with the calls of m at intervals [s_i, e_i]:
    N_rm = number of calls,  D_rm = sum_i (e_i - s_i),  U_rm = |union_i [s_i, e_i]|
Over the R requests of the workflow (requests that never call m count in R):
    n = sum_r N_rm / R,      p = sum_r D_rm / sum_r U_rm   (pooled)

The critical-path share f, from the intervals of all the LLMs of a request:

For one workflow request, each LLM m is busy on the union of its call intervals (U_rm long). The
request's LLM time, the union over all its LLMs, is split among the LLMs running at each moment:
a stretch during which k of the request's LLMs run counts 1/k for each of them. So

    C_rm  = integral over m's busy time of 1 / (number of the request's LLMs busy then), s
    f_wm  = sum_r C_rm / sum_r U_rm                       critical-path share of m in w (0 < f <= 1)

and sum_m C_rm is the request's LLM time. When a request's LLMs never run at the same time (serial
stages, fan-out within one LLM; overlaps of under 5% of a segment count as tracing jitter),
C_rm = U_rm and f = 1, so L_w = sum_m f_wm * n_wm / p_wm * L_m is
the plain pipeline. A fan-out across LLMs (a judge ensemble whose judges answer side by side)
counts the time the judges overlap once, not once per judge. Splitting the overlap evenly, rather
than crediting it all to whichever judge finished last, keeps every branch's weight positive, so
the planner cannot make a branch that was not the slowest in the traces arbitrarily slow for free.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence


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


def merged_segments(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The connected pieces of a union of closed intervals, in time order."""
    pieces: list[list[float]] = []
    for start, end in sorted(intervals):
        if pieces and start <= pieces[-1][1]:
            pieces[-1][1] = max(pieces[-1][1], end)
        else:
            pieces.append([start, end])
    return [(a, b) for a, b in pieces]


def critical_time_s(spans: Mapping[str, Iterable[tuple[float, float]]]) -> dict[str, float]:
    """C_rm for every LLM of one request, from its calls' (start, end) intervals per LLM."""
    segments = {llm: merged_segments(intervals) for llm, intervals in spans.items()}
    credit = {llm: 0.0 for llm in spans}
    if sum(len(s) for s in segments.values()) <= 1 or _disjoint(segments):
        # no two LLMs at once (the serial case): each LLM's own busy time, summed as U_rm is
        return {llm: sum(end - start for start, end in pieces) for llm, pieces in segments.items()}
    segments = _without_jitter(segments)
    events = sorted({t for pieces in segments.values() for piece in pieces for t in piece})
    for a, b in zip(events, events[1:]):
        busy = [llm for llm, pieces in segments.items() if any(start <= a and b <= end for start, end in pieces)]
        for llm in busy:
            credit[llm] += (b - a) / len(busy)
    return credit


# Traced calls of a serial request can overlap by a hair: the proxy stamps a call's end after the
# last byte has gone out, and the workflow may already send its next call. Overlaps shorter than
# this share of the shorter of two segments are such jitter, not LLMs running side by side.
JITTER_SHARE = 0.05


def _without_jitter(segments: Mapping[str, list[tuple[float, float]]]) -> dict[str, list[tuple[float, float]]]:
    """Segments whose end overlaps another LLM's next segment only by jitter end where it starts."""
    starts = [(start, end, llm) for llm, pieces in segments.items() for start, end in pieces]
    out: dict[str, list[tuple[float, float]]] = {}
    for llm, pieces in segments.items():
        trimmed = []
        for start, end in pieces:
            for other_start, other_end, other in starts:
                overlap = end - other_start
                if other != llm and start < other_start and 0 < overlap <= JITTER_SHARE * min(end - start, other_end - other_start):
                    end = other_start
            trimmed.append((start, end))
        out[llm] = trimmed
    return out


def _disjoint(segments: Mapping[str, list[tuple[float, float]]]) -> bool:
    """No two LLMs' segments overlap (beyond tracing jitter)."""
    pieces = sorted(piece for llm_pieces in segments.values() for piece in llm_pieces)
    for first, second in zip(pieces, pieces[1:]):
        overlap = min(first[1], second[1]) - second[0]
        if overlap > JITTER_SHARE * min(first[1] - first[0], second[1] - second[0]):
            return False
    return True
