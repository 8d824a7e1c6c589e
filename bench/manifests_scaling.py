"""Benchmark: emit manifests for a synthetic placed plan on 1024 H100 GPUs (target: under 2 s).

Usage: python bench/manifests_scaling.py [--nodes 128] [--repeats 5] [--engine vllm] [--gpu-sharing hami]

Times what `scepsy manifests` does after startup: read the plan and the instance, build every
object, render the YAML files (not the disk writes). Prints the median and the spread of the
wall-clock time over the repeats, the median CPU time of the process, the load average, and the
number of objects and bytes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synthetic_cluster import GPUS_PER_NODE, write_synthetic  # noqa: E402

TARGET_S = 2.0


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128, help="8-GPU nodes (128 = 1024 GPUs)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--engine", default="vllm")
    parser.add_argument("--gpu-sharing", default="hami")
    args = parser.parse_args()

    from scepsy.k8s.manifests import ManifestSettings, emit
    from scepsy.k8s.plan_input import load_placed_plan

    settings = ManifestSettings(engine=args.engine, gpu_sharing=args.gpu_sharing)
    with tempfile.TemporaryDirectory() as tmp:
        plan_path = write_synthetic(Path(tmp), args.nodes)
        times, cpu_times, files = [], [], {}
        for _ in range(args.repeats):
            start, cpu_start = time.perf_counter(), time.process_time()
            files = emit(load_placed_plan(plan_path), settings)
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
    median = statistics.median(times)
    gpus = args.nodes * GPUS_PER_NODE
    size = sum(len(t) for t in files.values())
    print(f"gpus: {gpus}  files: {len(files)}  bytes: {size}  engine: {args.engine}  gpu_sharing: {args.gpu_sharing}")
    print(f"emit_s median: {median:.3f}  min: {min(times):.3f}  max: {max(times):.3f}  repeats: {args.repeats}")
    # the CPU time this process used: on a shared machine the wall clock also measures the other jobs
    print(f"cpu_s median: {statistics.median(cpu_times):.3f}  load_average_1min: {os.getloadavg()[0]:.1f}")
    print(f"target_s: {TARGET_S}  ratio_to_target: {median / TARGET_S:.2f}  {'PASS' if median < TARGET_S else 'FAIL'}")
    return 0 if median < TARGET_S else 1


if __name__ == "__main__":
    sys.exit(main())
