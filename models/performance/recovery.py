"""Recovery after a burst: the highest load from which a workflow returns to its steady state.

A plan claims `max_throughput_rps` (T_w), its bottleneck LLM kept within max_utilization u of its
capacity. Production load is not steady: the standard burst offers `height` x T_w for `length_s`,
then a steady load lambda. While the burst overloads an LLM, the excess queues; afterwards the LLM
drains it with the capacity the load leaves free. With engines that serve older workflow requests
first (models/performance/replica.py `priority`) an overloaded LLM keeps its capacity, since the
workflows in service keep their prefixes cached; engines left first come first served lose it and
may never drain (planner/studies/bursts.py measures both). For workflow w and each LLM m it calls:

    C_wm = (d_m T_m - sum_{w' != w} lambda_w' n_w'm) / n_wm     what m can take for w at u = 1, req/s
    B_wm = length_s * max(height * T_w - C_wm, 0)               backlog the burst leaves, requests
    R_w  = min(T_w, min_m (C_wm - B_wm / settle_s))             recovery limit, req/s

R_w is the highest steady load after which the backlog drains within `settle_s`, the window in
which a recovered workflow serves its load again at its steady latency (no more than the claim).
It is the fluid bound: it assumes the LLM drains at its profiled capacity (the priority cure); the
simulator checks it (bench/burst_recovery.py, docs/evidence.md).
"""

from __future__ import annotations

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


def recovery_limit_rps(claim_rps: float, capacities_rps: list[float], burst: Burst = STANDARD_BURST) -> float:
    """R_w: the highest steady rate from which the workflow recovers after `burst` (module doc),
    from its claim T_w and, per LLM it calls, C_wm, the rate that LLM can take for it at u = 1."""
    limit = claim_rps
    for capacity_rps in capacities_rps:
        backlog = burst.length_s * max(burst.height * claim_rps - capacity_rps, 0.0)
        limit = min(limit, capacity_rps - backlog / burst.settle_s)
    return max(limit, 0.0)
