"""How much of each LLM's busy time a request waits on: its critical-path share (docs/model.md,
section 3).

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

from typing import Iterable, Mapping


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
