"""Peak memory of `simulate` against the simulated duration: flat (streamed statistics).

    python bench/simulation_memory.py [--durations-s 1e3,1e4,1e5] [--rate 1.0] [--tracemalloc]

Simulates instances/beam-4xa6000.yaml (its beam-search program, every workflow at `--rate`
requests/s, one whole A6000 per LLM) for each duration, each in a fresh process, and reports side by
side that process's peak resident set (resource.getrusage ru_maxrss), the calls simulated and, with
`--tracemalloc`, the peak of Python's heap during the run (slower: about 3x). The first row is a
10-second run, the cost of the interpreter, libraries and engine set-up. Keeping every call until
the run ends (about 0.4 KB each, what `record_calls` does) makes memory grow with the duration
instead.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSTANCE = ROOT / "instances" / "beam-4xa6000.yaml"


def child(duration_s: float, rate_rps: float, trace: bool) -> dict:
    """One simulation in this process: its peak RSS, calls, sketch buckets, times."""
    from scepsy.models.instance.allocation import Allocation, LlmAllocation
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.simulation.simulator import SimulationSettings, simulate

    instance = load_instance(INSTANCE)
    instance = instance.with_arrival_rates({w.name: rate_rps for w in instance.workflows})
    f, gpu = instance.cluster.fractions_per_gpu, instance.cluster.used_gpu_types()[0]
    allocation = Allocation(f, tuple(LlmAllocation(m.name, gpu, 1, f, 1) for m in instance.llms))
    if trace:
        tracemalloc.start()
    started = time.process_time()
    result = simulate(instance, allocation, SimulationSettings(duration_s=duration_s, seed=0))
    cpu_s = time.process_time() - started
    heap_peak = tracemalloc.get_traced_memory()[1] if trace else None
    workflow = result.workflows[0]
    return {
        "duration_s": duration_s,
        "calls": sum(m.calls for m in result.llms),
        "requests_measured": workflow.arrivals,
        "unfinished": workflow.unfinished,
        "sketch_buckets": len(workflow.latency_sketch.buckets),
        "latency_p99_s": workflow.latency_p99_s,
        "cpu_s": cpu_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,  # KiB on Linux
        "heap_peak_mib": None if heap_peak is None else heap_peak / 2**20,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--durations-s", default="1e3,1e4,1e5")
    parser.add_argument("--rate", type=float, default=1.0, help="requests/s of every workflow")
    parser.add_argument("--tracemalloc", action="store_true")
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child is not None:
        print(json.dumps(child(options.child, options.rate, options.tracemalloc)))
        return
    durations = [10.0] + [float(d) for d in options.durations_s.split(",")]
    print(f"{INSTANCE.name}, {options.rate:g} requests/s, one process per run\n")
    print("| duration_s | calls | measured requests | sketch buckets | p99_s | cpu_s | peak RSS_mib | heap peak_mib |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for duration in durations:
        command = [sys.executable, __file__, "--child", str(duration), "--rate", str(options.rate)]
        if options.tracemalloc:
            command.append("--tracemalloc")
        row = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        heap = "-" if row["heap_peak_mib"] is None else f"{row['heap_peak_mib']:.1f}"
        print(f"| {duration:g} | {row['calls']:,} | {row['requests_measured']:,} | {row['sketch_buckets']} | "
              f"{row['latency_p99_s']:.3f} | {row['cpu_s']:.1f} | {row['peak_rss_mib']:.0f} | {heap} |", flush=True)


if __name__ == "__main__":
    main()
