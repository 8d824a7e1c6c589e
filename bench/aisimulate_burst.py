#!/usr/bin/env python3
"""Burst collapse of closed-loop agentic workflows, and its cure, in NVIDIA aisimulate.

A workflow request makes 6 scoring calls one after another (each call is sent
when the previous one completes); the calls of one workflow share a
1,536-token prefix, each adds 128 tokens of its own and generates 4 tokens.
One Qwen3-8B replica on one H200 runs aisimulate's vLLM scheduler mock with
prefix caching on and AIConfigurator (op-level) kernel timings.

Steps:
1. sustainable rate: the highest Poisson workflow rate whose run from an empty
   start serves >= 97% of arrivals in [150 s, 300 s] without a growing latency;
2. at BASE_FRACTION of it, with and without BURST_FRACTION of it for
   BURST_LEN_S seconds from BURST_START_S, for each policy:
   fcfs                default vLLM scheduling;
   priority            every call carries priority = its workflow's arrival time
                       in ms (vLLM --scheduling-policy priority semantics);
   admission           at most CAP workflows in flight, the rest wait at the
                       entry in arrival order; CAP = sustainable rate x mean
                       workflow latency at that rate (Little's law);
   priority+admission  both.
3. prints a markdown table: served workflows/s and mean workflow latency in the
   POST_WINDOW_S seconds after the burst, the same window without the burst,
   the scoring calls served per second, the prefix-cache hit rate in that
   window, and whether the burst run recovered: within the 5-minute window
   (>= 97% of the no-burst rate, mean latency within 25% of it), else the
   minute after the burst from which every minute's mean workflow latency is
   within 25% of the no-burst run's, else "no" (RECOVERY_HORIZON_S of arrivals).

How the workload reaches aisimulate: a legacy agentic-Mooncake trace (one JSON
row per call; a call names the call it waits for in ``wait_for``; a root row
carries its arrival ``timestamp``), replayed with ``load: trace_timestamps``.
Entry admission is expressed in the same trace: a workflow's first call waits
for (a) a 1-token "arrival timer" request stamped with the workflow's arrival
time and (b) the last call of the workflow CAP places earlier. That is CAP
FIFO chains rather than one shared pool of CAP slots: equal to the pool when
workflows finish in arrival order, never looser than it.

Usage: python bench/aisimulate_burst.py [--sustainable-rps R --workflow-latency-s W] [--cap N]
           [--policies fcfs,priority,admission,priority+admission] [--burst-lens-s 15,30,60,120]
           [--workdir DIR [--reuse]]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

MODEL = "Qwen/Qwen3-8B"
HARDWARE = "h200_sxm"
BACKEND = "vllm"
CALLS_PER_WORKFLOW = 6
TRACE_BLOCK_TOKENS = 64
PREFIX_BLOCKS = 24  # 1,536 tokens shared by the calls of one workflow
SUFFIX_BLOCKS = 2  # 128 tokens of each call's own
OUTPUT_TOKENS = 4
CALL_INPUT_TOKENS = (PREFIX_BLOCKS + SUFFIX_BLOCKS) * TRACE_BLOCK_TOKENS

SEARCH_HORIZON_S = 300.0
SEARCH_WINDOW_S = (150.0, 300.0)
BASE_FRACTION = 0.75
BURST_FRACTION = 1.5
BURST_START_S = 60.0
BURST_LEN_S = 120.0
POST_WINDOW_S = 300.0
RECOVERY_HORIZON_S = 600.0  # arrivals go on this long after the burst, to see recovery
MINUTE_S = 60.0
SEED = 7
REUSE_RUNS = False  # --reuse: read a workdir's earlier runs instead of simulating again

POLICIES = ("fcfs", "priority", "admission", "priority+admission")


@dataclass(frozen=True)
class WindowStats:
    served_rps: float
    arrived_rps: float
    mean_latency_s: float
    prefix_hit_rate: float
    completed_workflows: int
    served_calls_per_s: float


def poisson_arrivals_s(segments: list[tuple[float, float, float]], seed: int) -> list[float]:
    """Poisson arrivals over piecewise-constant rates: (start_s, end_s, rate_rps)."""
    rng = random.Random(seed)
    arrivals: list[float] = []
    for start_s, end_s, rate_rps in segments:
        t = start_s
        while True:
            t += rng.expovariate(rate_rps)
            if t >= end_s:
                break
            arrivals.append(t)
    return arrivals


def call_row(workflow: int, call: int, priority: int | None) -> dict:
    prefix = [1_000_000 + workflow * 64 + block for block in range(PREFIX_BLOCKS)]
    own = [90_000_000 + (workflow * CALLS_PER_WORKFLOW + call) * SUFFIX_BLOCKS + block for block in range(SUFFIX_BLOCKS)]
    row = {
        "request_id": f"w{workflow}-c{call}",
        "session_id": f"w{workflow}",
        "input_length": CALL_INPUT_TOKENS,
        "output_length": OUTPUT_TOKENS,
        "hash_ids": prefix + own,
    }
    if priority is not None:
        row["priority"] = priority
    return row


def write_trace(path: Path, arrivals_s: list[float], policy: str, cap: int) -> None:
    """One row per call; closed loop through wait_for; admission through a timer and a chain."""
    use_priority = policy.startswith("priority")
    use_admission = policy.endswith("admission")
    with path.open("w") as out:
        for workflow, arrival_s in enumerate(arrivals_s):
            arrival_ms = round(arrival_s * 1000.0, 3)
            priority = int(arrival_ms) if use_priority else None
            for call in range(CALLS_PER_WORKFLOW):
                row = call_row(workflow, call, priority)
                if call > 0:
                    row["wait_for"] = [f"w{workflow}-c{call - 1}"]
                elif not use_admission:
                    row["timestamp"] = arrival_ms
                else:
                    timer = {
                        "request_id": f"w{workflow}-arrival",
                        "session_id": f"t{workflow}",
                        "input_length": 1,
                        "output_length": 1,
                        "hash_ids": [2_000_000_000 + workflow],
                        "timestamp": arrival_ms,
                    }
                    if priority is not None:
                        timer["priority"] = priority
                    out.write(json.dumps(timer) + "\n")
                    row["wait_for"] = [f"w{workflow}-arrival"]
                    if workflow >= cap:
                        row["wait_for"].append(f"w{workflow - cap}-c{CALLS_PER_WORKFLOW - 1}")
                out.write(json.dumps(row) + "\n")


def engine_config(trace: Path) -> str:
    return f"""traffic:
  source: {{type: trace, paths: [{trace}], format: agentic_mooncake, block_size: {TRACE_BLOCK_TOKENS}}}
  load: {{type: trace_timestamps}}
engine:
  model: {MODEL}
  hardware: {HARDWARE}
  backend: {BACKEND}
  mode: aggregated
  workers:
    aggregated:
      parallelism: {{tensor: 1, replicas: 1}}
      kv_cache: {{prefix_caching: true}}
"""


def run_aisimulate(workdir: Path, name: str, arrivals_s: list[float], policy: str, cap: int) -> list[dict]:
    run_dir = workdir / name
    run_dir.mkdir(parents=True, exist_ok=True)
    trace = run_dir / "trace.jsonl"
    write_trace(trace, arrivals_s, policy, cap)
    config = run_dir / "config.yaml"
    config.write_text(engine_config(trace))
    command = [
        sys.executable, "-m", "aisimulate", "predict", "-c", str(config), "--format", "json",
        "--output-dir", str(run_dir / "out"), "--overwrite", "--capture-per-request",
    ]
    started = time.monotonic()
    requests_file = run_dir / "out" / "requests.jsonl"
    if REUSE_RUNS and requests_file.exists():
        return [json.loads(line) for line in requests_file.open()]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"aisimulate failed for {name}: {result.stderr[-2000:]}")
    records = [json.loads(line) for line in (run_dir / "out" / "requests.jsonl").open()]
    print(f"  {name}: {len(arrivals_s)} workflows, {len(records)} calls, {time.monotonic() - started:.0f} s wall", file=sys.stderr)
    return records


def workflow_completions_s(records: list[dict]) -> dict[int, float]:
    """Workflow index -> completion time of its last call (only fully completed workflows)."""
    done_calls: dict[int, list[float]] = {}
    for record in records:
        session = record.get("session_id") or ""
        if not session.startswith("w") or record.get("terminal_status") != "completed":
            continue
        done_calls.setdefault(int(session[1:]), []).append(record["terminal_time_ms"] / 1000.0)
    return {wf: max(times) for wf, times in done_calls.items() if len(times) == CALLS_PER_WORKFLOW}


def window_stats(records: list[dict], arrivals_s: list[float], window: tuple[float, float]) -> WindowStats:
    start_s, end_s = window
    completions = workflow_completions_s(records)
    in_window = [wf for wf, done_s in completions.items() if start_s <= done_s < end_s]
    latencies = [completions[wf] - arrivals_s[wf] for wf in in_window]
    reused = total = 0
    calls_done = sum(
        1 for record in records
        if record.get("input_length") == CALL_INPUT_TOKENS and record.get("terminal_status") == "completed"
        and start_s <= record["terminal_time_ms"] / 1000.0 < end_s
    )
    for record in records:
        if record.get("input_length") != CALL_INPUT_TOKENS or not record.get("admission_history"):
            continue
        if start_s <= record["admission_history"][0]["at_ms"] / 1000.0 < end_s:
            reused += record.get("first_admission_reused_input_tokens") or 0
            total += CALL_INPUT_TOKENS
    length_s = end_s - start_s
    return WindowStats(
        served_rps=len(in_window) / length_s,
        arrived_rps=sum(start_s <= a < end_s for a in arrivals_s) / length_s,
        mean_latency_s=sum(latencies) / len(latencies) if latencies else math.inf,
        prefix_hit_rate=reused / total if total else 0.0,
        completed_workflows=len(in_window),
        served_calls_per_s=calls_done / length_s,
    )


def minutes_to_recover(records: list[dict], arrivals_s: list[float], calm_latency_s: float, start_s: float,
                       minutes: int) -> int | None:
    """First whole minute after `start_s` from which, in every minute, the workflows completed had a
    mean latency within 25% of the no-burst run's (over the post-burst window); None if never.
    Latency rather than the served count: a served count per minute carries ~3.5% Poisson noise."""
    good = [window_stats(records, arrivals_s, (start_s + m * MINUTE_S, start_s + (m + 1) * MINUTE_S)).mean_latency_s
            <= 1.25 * calm_latency_s for m in range(minutes)]
    for m in range(minutes):
        if all(good[m:]):
            return m
    return None


def sustainable(workdir: Path, rate_rps: float) -> tuple[bool, float]:
    arrivals_s = poisson_arrivals_s([(0.0, SEARCH_HORIZON_S, rate_rps)], SEED)
    records = run_aisimulate(workdir, f"search-{rate_rps:g}", arrivals_s, "fcfs", 0)
    stats = window_stats(records, arrivals_s, SEARCH_WINDOW_S)
    early = window_stats(records, arrivals_s, (60.0, 120.0))
    late = window_stats(records, arrivals_s, (SEARCH_HORIZON_S - 60.0, SEARCH_HORIZON_S))
    ok = stats.served_rps >= 0.97 * stats.arrived_rps and late.mean_latency_s <= 2.0 * early.mean_latency_s
    print(f"  rate {rate_rps:g}/s: served {stats.served_rps:.2f} of {stats.arrived_rps:.2f}/s, "
          f"latency {early.mean_latency_s:.2f} -> {late.mean_latency_s:.2f} s: {'sustained' if ok else 'not sustained'}",
          file=sys.stderr)
    return ok, stats.mean_latency_s


def find_sustainable_rps(workdir: Path, low: float, high: float, step: float) -> tuple[float, float]:
    """Bisection on a grid of `step` workflows/s; returns (rate, mean workflow latency at it)."""
    ok, latency_s = sustainable(workdir, low)
    if not ok:
        sys.exit(f"even {low}/s is not sustained")
    best = (low, latency_s)
    while high - low > step:
        mid = round((low + high) / 2 / step) * step
        if mid in (low, high):
            break
        ok, latency_s = sustainable(workdir, mid)
        if ok:
            low, best = mid, (mid, latency_s)
        else:
            high = mid
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sustainable-rps", type=float, help="skip the search and use this rate")
    parser.add_argument("--workflow-latency-s", type=float, help="mean workflow latency at that rate (for the cap)")
    parser.add_argument("--cap", type=int, help="in-flight workflow cap (default: Little's law)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--burst-lens-s", default=f"{BURST_LEN_S:g}", help="comma-separated burst lengths")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--reuse", action="store_true", help="reuse the runs already in --workdir")
    args = parser.parse_args()
    global REUSE_RUNS
    REUSE_RUNS = args.reuse
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="aisim_burst_"))
    started = time.monotonic()

    if args.sustainable_rps is None:
        print("searching the sustainable rate (FCFS, no burst, empty start)", file=sys.stderr)
        sustainable_rps, latency_s = find_sustainable_rps(workdir, 4.0, 40.0, 0.5)
    else:
        sustainable_rps = args.sustainable_rps
        latency_s = args.workflow_latency_s if args.workflow_latency_s else sustainable(workdir, sustainable_rps)[1]
    cap = args.cap or max(1, math.ceil(sustainable_rps * latency_s))
    base_rps, burst_rps = BASE_FRACTION * sustainable_rps, BURST_FRACTION * sustainable_rps
    burst_lens_s = [float(x) for x in args.burst_lens_s.split(",")]
    policies = args.policies.split(",")
    print(f"sustainable {sustainable_rps:g}/s, latency {latency_s:.2f} s there, cap {cap}", file=sys.stderr)

    rows = []
    for policy in policies:
        # The no-burst run is one long run; each burst is compared with it over the same clock window.
        longest_end_s = BURST_START_S + max(burst_lens_s)
        calm_horizon_s = longest_end_s + RECOVERY_HORIZON_S
        calm_arrivals = poisson_arrivals_s([(0.0, calm_horizon_s, base_rps)], SEED)
        calm_records = run_aisimulate(workdir, f"{policy}-noburst", calm_arrivals, policy, cap)
        for burst_len_s in burst_lens_s:
            burst_end_s = BURST_START_S + burst_len_s
            horizon_s = burst_end_s + RECOVERY_HORIZON_S
            window = (burst_end_s, burst_end_s + POST_WINDOW_S)
            segments = [(0.0, BURST_START_S, base_rps), (BURST_START_S, burst_end_s, burst_rps), (burst_end_s, horizon_s, base_rps)]
            arrivals_s = poisson_arrivals_s(segments, SEED)
            records = run_aisimulate(workdir, f"{policy}-burst{burst_len_s:g}", arrivals_s, policy, cap)
            burst = window_stats(records, arrivals_s, window)
            calm = window_stats(calm_records, calm_arrivals, window)
            recovery_min = minutes_to_recover(records, arrivals_s, calm.mean_latency_s, burst_end_s,
                                              int(RECOVERY_HORIZON_S // MINUTE_S))
            rows.append((burst_len_s, policy, burst, calm, recovery_min))

    print(f"\naisimulate {_version()} | {MODEL} on one {HARDWARE}, {BACKEND} mock, prefix caching on | "
          f"{CALLS_PER_WORKFLOW} chained calls/workflow, {PREFIX_BLOCKS * TRACE_BLOCK_TOKENS}-token shared prefix, "
          f"{SUFFIX_BLOCKS * TRACE_BLOCK_TOKENS} own tokens, {OUTPUT_TOKENS} output tokens")
    print(f"sustainable rate {sustainable_rps:g} workflows/s (mean workflow latency {latency_s:.2f} s); "
          f"load {base_rps:.2f}/s ({BASE_FRACTION:.0%}), burst {burst_rps:.2f}/s ({BURST_FRACTION:.0%}) "
          f"from {BURST_START_S:g} s; admission cap {cap} workflows in flight; "
          f"window: the {POST_WINDOW_S:g} s after the burst\n")
    print("| scenario | policy | served after burst, wf/s (% of no-burst) | no-burst, wf/s | scoring calls/s after burst / no-burst "
          "| mean latency after burst / no-burst, s | prefix hit rate after burst / no-burst | recovered |")
    print("|---|---|---|---|---|---|---|---|")
    for burst_len_s, policy, burst, calm, recovery_min in rows:
        within_window = burst.served_rps >= 0.97 * calm.served_rps and burst.mean_latency_s <= 1.25 * calm.mean_latency_s
        if within_window:
            verdict = "yes, within the 5-min window"
        elif recovery_min is None:
            verdict = f"**no**: not within {RECOVERY_HORIZON_S / MINUTE_S:g} min"
        else:
            verdict = f"not within 5 min; steady again {recovery_min} min after the burst"
        print(f"| {burst_len_s:g} s at {BURST_FRACTION:.0%}, then {BASE_FRACTION:.0%} | {policy} | "
              f"{burst.served_rps:.2f} ({burst.served_rps / calm.served_rps:.0%}) | {calm.served_rps:.2f} | "
              f"{burst.served_calls_per_s:.1f} / {calm.served_calls_per_s:.1f} | "
              f"{burst.mean_latency_s:.2f} / {calm.mean_latency_s:.2f} | "
              f"{burst.prefix_hit_rate:.2f} / {calm.prefix_hit_rate:.2f} | {verdict} |")
    ceiling = (CALLS_PER_WORKFLOW - 1) / CALLS_PER_WORKFLOW * PREFIX_BLOCKS / (PREFIX_BLOCKS + SUFFIX_BLOCKS)
    print(f"\nprefix hit rate = reused prompt tokens / prompt tokens of the scoring calls admitted in the window "
          f"(ceiling {ceiling:.2f}: a workflow's first call always misses); recovered: "
          f"'5-min window' = served >= 97% of the no-burst rate and mean latency within 25% of it over the window; "
          f"'N min after' = from minute N after the burst's end on, every minute's completed workflows have a mean "
          f"latency within 25% of the no-burst window's. "
          f"wall time {time.monotonic() - started:.0f} s")


def _version() -> str:
    from importlib.metadata import version

    return version("aisimulate")


if __name__ == "__main__":
    main()
