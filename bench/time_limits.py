"""Time limits that bound the whole `scepsy plan` command, on huge instances.

    python bench/time_limits.py [--time-limit-s 5] [--placement-time-limit-s 5] [--quick] [--json out.json]

Each instance is the shipped beam search (instances/beam-4xa6000.yaml: nodes of 4 A6000 with NVLink
pairs) scaled up: 10^4, 10^5 and 10^6 GPUs (the node entry's `count`), and 10^4 LLMs (copies of its
generator, one stage each, on 10^4 GPUs). For each, side by side in one run:

* `load_s`: loading the instance in this process (reading the YAML, expanding the nodes, loading
  each profile file once), without a limit;
* `wall_s`: `scepsy plan INSTANCE --json` with both time limits, as a subprocess, from its start to
  its exit (starting the interpreter and importing the planner, 0.5 to 2 s on 2 busy cores, before
  the command's clock starts, included);
* `over_s`: wall_s minus the limit that applied: time_limit_s when the command stopped with the
  time limit message while planning (exit 3 naming --time-limit-s), else the whole command's bound
  time_limit_s + placement_time_limit_s (docs/model.md, "Time limits"). Target: well under 1 s on an
  idle machine, and the exit code either 0 (a plan) or 3 with the time-limit message.

`--quick` leaves out the 10^6-GPU instance.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scepsy.models.instance.instance import load_instance  # noqa: E402

BEAM = ROOT / "instances" / "beam-4xa6000.yaml"


def beam_raw() -> dict:
    raw = yaml.safe_load(BEAM.read_text())
    for llm in raw["llms"]:
        llm["profile"] = str((BEAM.parent / llm["profile"]).resolve())
    return raw


def gpus_instance(gpus: int) -> dict:
    raw = beam_raw()
    raw["cluster"]["nodes"][0]["count"] = gpus // 4
    return raw


def llms_instance(llms: int, gpus: int) -> dict:
    raw = beam_raw()
    generator = raw["llms"][0]
    raw["llms"] = [dict(generator, name=f"gen{i}") for i in range(llms)]
    workflow = raw["workflows"][0]
    workflow.pop("program")
    workflow["arrival_rate"] = 0.1
    workflow["stages"] = [{"llm": f"gen{i}", "invocations": 1.0, "parallelism": 1.0} for i in range(llms)]
    raw["cluster"]["nodes"][0]["count"] = gpus // 4
    return raw


def measure(path: Path, time_limit_s: float, placement_time_limit_s: float) -> dict:
    start = time.perf_counter()
    instance = load_instance(path)
    load_s = time.perf_counter() - start
    gpus, llms = instance.cluster.gpu_count(), len(instance.llms)
    del instance
    argv = [sys.executable, "-m", "scepsy", "plan", str(path), "--json", "--time-limit-s", str(time_limit_s),
            "--placement-time-limit-s", str(placement_time_limit_s)]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
    wall_s = time.perf_counter() - start
    message = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
    planning_ran_out = done.returncode == 3 and "raise --time-limit-s" in message
    limit_s = time_limit_s if planning_ran_out else time_limit_s + placement_time_limit_s
    return {
        "instance": path.stem, "gpus": gpus, "llms": llms, "load_s": round(load_s, 3), "exit_code": done.returncode,
        "wall_s": round(wall_s, 3), "limit_s": limit_s, "over_s": round(wall_s - limit_s, 3), "message": message[:160],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--time-limit-s", type=float, default=5.0)
    parser.add_argument("--placement-time-limit-s", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="leave out 10^6 GPUs")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    instances = {"gpus-1e4": gpus_instance(10**4), "gpus-1e5": gpus_instance(10**5)}
    if not args.quick:
        instances["gpus-1e6"] = gpus_instance(10**6)
    instances["llms-1e4"] = llms_instance(10**4, 10**4)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for name, raw in instances.items():
            path = Path(folder) / f"{name}.yaml"
            path.write_text(yaml.safe_dump(raw, sort_keys=False))
            rows.append(measure(path, args.time_limit_s, args.placement_time_limit_s))
            row = rows[-1]
            print(f"{row['instance']:>9}  gpus {row['gpus']:>9,}  llms {row['llms']:>6,}  load_s {row['load_s']:7.3f}  "
                  f"exit {row['exit_code']}  wall_s {row['wall_s']:7.3f}  limit_s {row['limit_s']:5g}  over_s {row['over_s']:+7.3f}"
                  f"  {row['message'][:90]}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
