"""Recovery after a burst: the highest load from which a workflow returns to its steady state.

A plan claims `max_throughput_rps` (T_w), its bottleneck LLM kept within max_utilization u of its
capacity. Production load is not steady: the standard burst offers `height` x T_w for `length_s`,
then a steady load lambda. While the burst overloads an LLM, the excess queues; afterwards the LLM
drains it with what the steady load leaves free. With engines that serve older workflow requests
first (models/performance/replica.py `priority`) an overloaded LLM keeps serving at its capacity,
since the workflows in service keep their prefixes cached; engines left first come first served
lose it and may never drain (planner/studies/bursts.py measures both). For workflow w and each LLM
m it calls, with T_wm the rate m takes for w within max_utilization (alp.py; T_w = min_m T_wm):

    B_wm = length_s * max(height * T_w - T_wm, 0)      backlog the burst leaves on m, requests
    R_w  = min(T_w, min_m (T_wm - B_wm / settle_s))    recovery limit, req/s

R_w is the highest steady load after which every backlog drains within `settle_s`, at the rate
the plan lets each LLM take (max_utilization of its capacity: the steep end of a latency curve is
no rate to drain at), no more than the claim. The standard burst gives R_w = 0.8 T_w wherever the
bottleneck limits w. The simulator checks it: on every shipped instance, with priority engines, a
workflow at R_w is back at its steady latency within `settle_s` (bench/burst_recovery.py,
docs/evidence.md); at 95% of a claim beam search takes 7 minutes, at 100% longer than the run.

Engines left first come first served (no workflow entry in front of them: `scepsy manifests
--no-entry`) keep that capacity only for workflows whose calls do not continue earlier calls'
prompts (RAG, ensembles): R_w holds for them as it is. A workflow whose calls do (beam search's
chains, or one with no program, whose prompts scepsy does not know) loses its cached prefixes
once a backlog's prefixes outgrow its KV cache, and then may lock below its claim, which the
plan's profiles cannot tell in advance: measured, beam search on one A6000 locks after two minutes
at 200% of its claim (tests/test_bursts.py), and a real vLLM whose prefix cache holds a tenth of
the burst's backlog serves 17% of its load after it (docs/evidence.md, "The burst on a real
vLLM"), where priority engines recover. scepsy claims no recovery there: `recovery_limit_fcfs_rps`
below is 0.

Routers that drop `priority` from a request body (the SGLang model gateway's chat route) leave
the engines first come first served; the workflow entry then holds each LLM's calls beyond its
entry limit and lets them on oldest workflow request first (`entry_limit` below).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Burst:
    """A burst as shares of a workflow's claimed throughput, and the recovery it must allow."""

    base_load: float = 0.8  # before and after the burst, share of the claim
    height: float = 1.5  # during the burst, share of the claim
    start_s: float = 60.0
    length_s: float = 120.0
    settle_s: float = 300.0  # a recovered workflow is back in steady state this long after the burst ...
    window_s: float = 300.0  # ... as measured over this long

    @property
    def end_s(self) -> float:
        return self.start_s + self.length_s

    @property
    def duration_s(self) -> float:
        return self.end_s + self.settle_s + self.window_s


STANDARD_BURST = Burst()


def recovery_limit_rps(claim_rps: float, stage_limits_rps: list[float], burst: Burst = STANDARD_BURST) -> float:
    """R_w: the highest steady rate from which the workflow recovers after `burst` (module doc),
    from its claim T_w and, per LLM it calls, T_wm, the rate that LLM takes for it within
    max_utilization."""
    limit = claim_rps
    for stage_rps in stage_limits_rps:
        backlog = burst.length_s * max(burst.height * claim_rps - stage_rps, 0.0)
        limit = min(limit, stage_rps - backlog / burst.settle_s)
    return max(limit, 0.0)


def recovery_limit_fcfs_rps(recovery_rps: float, continues_prompts: bool) -> float:
    """The recovery limit of a workflow on engines left first come first served, from its recovery
    limit with the workflow entry (module doc): the same where its calls do not continue earlier
    prompts, none (0) where they do."""
    return 0.0 if continues_prompts else recovery_rps


# The entry's hold (`scepsy proxy --max-in-flight`, models/simulation/entry.py): an LLM's calls in
# flight past the entry, at most ENTRY_LIMIT_FACTOR x those Little's law gives with the LLM at the
# most the plan lets it take (max_utilization x its capacity, at the mean call latency there),
# whatever the workflows' mix. With engines left first come first served, on beam search over one
# A6000, 1.5, 2 and 3 times all recover from the standard burst (99% served, latency within 5%);
# the steady state does not change (within 0.5%).
ENTRY_LIMIT_FACTOR = 2.0


def entry_limit(usable_rps: float, latency_s: float) -> int | None:
    """The entry limit of an LLM taking `usable_rps` (all replicas, requests/s) at a mean call
    latency of `latency_s` (None where that is not finite: no calls in flight to size by)."""
    in_flight = usable_rps * latency_s
    if not math.isfinite(in_flight):
        return None
    return max(1, math.ceil(ENTRY_LIMIT_FACTOR * in_flight))
