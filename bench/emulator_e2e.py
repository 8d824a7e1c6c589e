"""At scale without GPUs: the workflows on emulated replicas, measured and planned by scepsy.

Every engine is a `scepsy emulate` process (an OpenAI-compatible server timed by the engine model,
docs/tracing.md "Engine emulator"), every step a `scepsy` command, exactly as a user would run them:

1. five emulated replicas: the beam search's generator `gen` (Llama-3.1-8B) and verifier `ver`
   (the Llama-3.1-8B PRM), each on half an RTX A6000, and RAG's embedder `emb` (e5-base-v2),
   reranker `rerank` (bge-reranker-base) and generator `rag-gen` (Llama-3.2-1B) on small shares;
2. `scepsy proxy` in front of all five; the beam-search and RAG workflows (LangGraph + openai)
   traced through it, one request at a time;
3. `scepsy aggregate`: n and p per workflow and LLM;
4. `scepsy profiles synthesize` for `gen` and `ver` from the traced calls: the engine model in
   simulation (independent Poisson calls of the traced lengths, no prefix cache);
5. `scepsy profile` (the replay profiler, `--rates auto`: light load, doubling to saturation,
   bisecting) of `gen` and `ver`, twice:
   - *fidelity*: the traced calls as independent calls (workflow ids removed), Poisson arrivals,
     against two more emulators of the same replicas without prefix caching -- the workload of
     the simulation, so the two profiles should agree: this is the emulator against the engine
     model, seen through scepsy's own measurement path;
   - *workflow*: the traced calls with their dependencies (the paper's replay), uniform workflow
     arrivals, against the workflow's own emulators (prefix caching on, as vLLM): the profile a
     user would plan with; it differs from the simulated one where fan-outs and shared prefixes
     matter, and the report says by how much;
6. an instance built from the measured profiles and stages, planned by `scepsy plan` (one A6000,
   halves), and the beam search run open loop at `load` x the pipeline's max throughput through
   the proxy: measured mean latency against the Aggregate LLM Pipeline's prediction.

With `--speedup S` the emulators run S times faster than modelled time: measured rates are
divided by S and latencies multiplied by S before any comparison (the CSVs under `measured/` are
in modelled units). HTTP and workflow overheads are wall time, so a large S inflates them by S.

    python bench/emulator_e2e.py [--out-dir out/emulator] [--speedup 1] [--trace-requests 12] \\
                                 [--run-requests 40] [--load 0.5] [--duration-s 15]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import yaml

from scepsy.models.catalog import catalog
from scepsy.models.performance.engine import Engine
from scepsy.models.instance.profile import STABLE_THROUGHPUT_RATIO, read_profile_frame, write_profile
import paths  # noqa: F401, E402 - examples/ and tests/support/ on the import path
from support.ports import free_port
from examples.workflows import BeamSearch, Rag, run_closed_loop, run_open_loop

GPU = "A6000"
# the HTTP and JSON work per call is wall time the simulation does not have (x speedup): at light
# load the measured latency is the modelled one plus that, on a machine not loaded by other jobs
TARGET_LIGHT_LOAD_ERROR = 0.15
FRACTIONS_PER_GPU = 2
SCEPSY = [sys.executable, "-m", "scepsy"]


@dataclass(frozen=True)
class Replica:
    name: str  # the replica's key here
    llm: str  # the name it serves (the proxy's upstream name, the `model` field of its calls)
    model: str
    gpu: str
    fraction: float
    prefix_caching: bool = True


REPLICAS = (
    Replica("gen", "gen", "llama-3.1-8b", GPU, 0.5),
    Replica("ver", "ver", "llama-3.1-8b-prm", GPU, 0.5),
    Replica("emb", "emb", "e5-base-v2", GPU, 0.1),
    Replica("rerank", "rerank", "bge-reranker-base", GPU, 0.1),
    Replica("rag-gen", "rag-gen", "llama-3.2-1b", GPU, 0.2),
    # the fidelity check's replicas: the same as gen and ver, without prefix caching (as simulated)
    Replica("gen-nc", "gen", "llama-3.1-8b", GPU, 0.5, prefix_caching=False),
    Replica("ver-nc", "ver", "llama-3.1-8b-prm", GPU, 0.5, prefix_caching=False),
)
WORKFLOW_REPLICAS = ("gen", "ver", "emb", "rerank", "rag-gen")
PROFILED = ("gen", "ver")


@dataclass(frozen=True)
class Settings:
    out_dir: Path = Path("out/emulator")
    speedup: float = 2.0
    trace_requests: int = 12
    rag_requests: int = 6
    run_requests: int = 40
    load: float = 0.5
    duration_s: float = 10.0  # wall seconds per profile point
    beam_width: int = 2
    expansions: int = 2
    max_steps: int = 3
    gen_max_tokens: int = 48
    seed: int = 0
    arrivals: str = "uniform"


@contextmanager
def _server(command: list[str], ready_url: str, log: Path, timeout_s: float = 60.0):
    """A `scepsy` server process; SIGINT at the end (the proxy then flushes its store)."""
    with log.open("wb") as output:
        process = subprocess.Popen(command, stdout=output, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if process.poll() is not None:
                    raise RuntimeError(f"{' '.join(command)} exited with {process.returncode}; see {log}")
                try:
                    if httpx.get(ready_url, timeout=1.0).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{' '.join(command)} did not start; see {log}")
                time.sleep(0.1)
            yield process
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


def _scepsy(arguments: list[str], log) -> dict:
    """Run a scepsy command; its --json output parsed (empty when it prints none)."""
    log("$ scepsy " + " ".join(arguments))
    done = subprocess.run(SCEPSY + arguments, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scepsy {' '.join(arguments)} failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout) if "--json" in arguments else {}


def _to_modelled(rows: pd.DataFrame, speedup: float) -> pd.DataFrame:
    """Profile rows measured on emulators running `speedup` times fast, in modelled units."""
    rows = rows.copy()
    for column in ("arrival_rate", "throughput"):
        rows[column] = rows[column] / speedup
    for column in ("latency_mean", "latency_p50", "latency_p90", "latency_p99"):
        rows[column] = rows[column] * speedup
    return rows


def _stable(rows: pd.DataFrame) -> pd.DataFrame:
    rows = rows.sort_values("arrival_rate")
    return rows[rows["throughput"] >= STABLE_THROUGHPUT_RATIO * rows["arrival_rate"]]


def compare_profiles(measured: pd.DataFrame, simulated: pd.DataFrame) -> dict:
    """Measured (replay of the emulator) against simulated (synthesis) profile of one replica:
    at each stable measured rate within the simulated stable range, the simulated mean latency
    interpolated there; capacities are the largest stable rates."""
    m, s = _stable(measured), _stable(simulated)
    points = []
    for _, row in m.iterrows():
        rate = float(row["arrival_rate"])
        if rate > float(s["arrival_rate"].max()):
            continue
        sim = float(np.interp(rate, s["arrival_rate"], s["latency_mean"]))
        points.append({"arrival_rate_rps": rate, "measured_latency_s": float(row["latency_mean"]),
                       "simulated_latency_s": sim, "error": (float(row["latency_mean"]) - sim) / sim})
    errors = [abs(p["error"]) for p in points]
    return {
        "points": points,
        "light_load_error": points[0]["error"] if points else math.nan,
        "mean_abs_error": statistics.mean(errors) if errors else math.nan,
        "max_abs_error": max(errors) if errors else math.nan,
        "measured_capacity_rps": float(m["arrival_rate"].max()) if len(m) else 0.0,
        "simulated_capacity_rps": float(s["arrival_rate"].max()) if len(s) else 0.0,
        "measured_saturated_rate_rps": float(measured.sort_values("arrival_rate")["arrival_rate"].iloc[-1]),
    }


def _independent(export: Path, out: Path) -> None:
    """The exported calls with their workflow ids removed: each replays as a request of its own."""
    lines = []
    for line in export.read_text().splitlines():
        call = json.loads(line)
        call["workflow_id"], call["workflow"] = None, None
        lines.append(json.dumps(call, sort_keys=True))
    out.write_text("\n".join(lines) + "\n")


def _instance(stages: list[dict], rate: float, profiles: dict[str, Path]) -> dict:
    cards = {r.name: catalog.model(r.model) for r in REPLICAS}
    return {
        "cluster": {
            "fractions_per_gpu": FRACTIONS_PER_GPU,
            "gpu_types": {GPU: {"memory_gib": catalog.gpu(GPU).memory_gib}},
            "nodes": [{"name": "emulated", "gpu_type": GPU, "gpus": 1}],
        },
        "llms": [
            {"name": llm, "model": cards[llm].hf_id, "weights_gib": round(cards[llm].weights_gib, 3), "min_kv_gib": 1.0,
             "tp_degrees": [1], "profile": str(path.resolve())}
            for llm, path in sorted(profiles.items())
        ],
        "workflows": [{"name": "beam", "arrival_rate": rate, "stages": stages}],
        "objective": "min_latency",
        "latency_metric": "mean",
        "max_utilization": 1.0,
    }


def _beam(proxy_url: str, s: Settings) -> BeamSearch:
    return BeamSearch(proxy_url, beam_width=s.beam_width, expansions=s.expansions, max_steps=s.max_steps,
                      gen_max_tokens=s.gen_max_tokens)


def run(s: Settings, log=print) -> dict:
    out = s.out_dir
    (out / "measured").mkdir(parents=True, exist_ok=True)
    (out / "simulated").mkdir(parents=True, exist_ok=True)
    for name in ("traces.db", "run.db"):
        for suffix in ("", "-wal", "-shm"):
            (out / f"{name}{suffix}").unlink(missing_ok=True)
    timings, t0 = {}, time.perf_counter()
    ports = {r.name: free_port() for r in REPLICAS}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    with ExitStack() as stack:
        for r in REPLICAS:
            command = SCEPSY + ["emulate", "--model", r.model, "--gpu", r.gpu, "--fraction", str(r.fraction),
                                "--served-model-name", r.llm, "--port", str(ports[r.name]), "--speedup", str(s.speedup)]
            command += [] if r.prefix_caching else ["--no-prefix-caching"]
            stack.enter_context(_server(command, urls[r.name] + "/health", out / f"emulate-{r.name}.log"))
        timings["emulators_start_s"] = time.perf_counter() - t0
        upstreams = [f"--upstream={name}={urls[name]}" for name in WORKFLOW_REPLICAS]

        def proxy(store: Path):
            port = free_port()
            command = SCEPSY + ["proxy", *upstreams, "--port", str(port), "--store", str(store)]
            return _server(command, f"http://127.0.0.1:{port}/v1/models", out / f"proxy-{store.stem}.log"), f"http://127.0.0.1:{port}"

        # 1-2. trace both workflows through the proxy, one request at a time
        t = time.perf_counter()
        server, proxy_url = proxy(out / "traces.db")
        with server:
            traced = run_closed_loop(_beam(proxy_url, s), s.trace_requests, seed=s.seed)
            rag = run_closed_loop(Rag(proxy_url, generator="rag-gen"), s.rag_requests, seed=s.seed)
        timings["trace_s"] = time.perf_counter() - t
        failed = [r.error for r in traced + rag if r.error]
        if failed:
            raise RuntimeError(f"traced requests failed: {failed[0]}")
        log(f"traced {len(traced)} beam-search and {len(rag)} RAG requests; beam mean latency "
            f"{statistics.mean(r.latency_s for r in traced) * s.speedup:.3f} s (modelled)")

        # 3. statistics
        stats = _scepsy(["aggregate", str(out / "traces.db"), "--out", str(out / "stats.yaml"), "--json"], log)
        workflows = {w["name"]: w for w in stats["workflows"]}
        stages = workflows["beam"]["stages"]
        log(f"beam stages: {stages}; rag stages: {workflows['rag']['stages']}")

        # 4-5. simulated profiles, and the replay profiles of the emulators (independent and workflow calls)
        t = time.perf_counter()
        _scepsy(["traces", "export", str(out / "traces.db"), "--out", str(out / "calls.jsonl")], log)
        _independent(out / "calls.jsonl", out / "independent.jsonl")
        shapes = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
        comparisons, measured_paths = {}, {}

        def replay(llm: str, traces: Path, endpoint: str, arrivals: str, label: str) -> tuple[Path, int]:
            replica = next(r for r in REPLICAS if r.name == llm)
            wall = out / "measured" / f"{llm}-{label}-wall.csv"
            wall.unlink(missing_ok=True)
            points = _scepsy(["profile", "--traces", str(traces), "--llm", llm, "--endpoint", endpoint, "--gpu-type", GPU,
                              "--fraction", str(replica.fraction), "--rates", "auto", "--duration-s", str(s.duration_s),
                              "--seed", str(s.seed), "--arrivals", arrivals, "--out", str(wall), "--json"], log)["points"]
            modelled = out / "measured" / f"{llm}-{label}.csv"
            write_profile(_to_modelled(read_profile_frame(wall), s.speedup), modelled)
            return modelled, len(points)

        for llm in PROFILED:
            replica = next(r for r in REPLICAS if r.name == llm)
            simulated = out / "simulated" / f"{llm}.csv"
            simulated.unlink(missing_ok=True)
            _scepsy(["profiles", "synthesize", "--model", replica.model, "--gpu", GPU, "--fractions", str(replica.fraction),
                     "--requests", str(out / "calls.jsonl"), "--llm", llm, "--requests-per-point", "1024",
                     "--out", str(simulated), "--json"], log)
            independent, independent_points = replay(llm, out / "independent.jsonl", urls[f"{llm}-nc"], "poisson", "independent")
            workflow, workflow_points = replay(llm, out / "traces.db", urls[llm], s.arrivals, "workflow")
            measured_paths[llm] = workflow
            mine = [c for c in shapes if c["llm"] == llm]
            prompt = statistics.mean(c["prompt_tokens"] for c in mine)
            completion = statistics.mean(c["completion_tokens"] for c in mine)
            engine = Engine(catalog.model(replica.model), catalog.gpu(GPU), 1, replica.fraction)
            comparisons[llm] = {
                "mean_prompt_tokens": prompt,
                "mean_completion_tokens": completion,
                "engine_model_alone_s": engine.request_time_s(round(prompt), round(completion)),
                "independent": {**compare_profiles(read_profile_frame(independent), read_profile_frame(simulated)),
                                "sweep_points": independent_points},
                "workflow": {**compare_profiles(read_profile_frame(workflow), read_profile_frame(simulated)),
                             "sweep_points": workflow_points},
            }
            for label in ("independent", "workflow"):
                c = comparisons[llm][label]
                log(f"{llm} {label}: light-load latency measured {c['points'][0]['measured_latency_s']:.3f} s, simulated "
                    f"{c['points'][0]['simulated_latency_s']:.3f} s (alone {comparisons[llm]['engine_model_alone_s']:.3f} s); "
                    f"mean |error| {100 * c['mean_abs_error']:.1f}% over {len(c['points'])} points; capacity measured "
                    f"{c['measured_capacity_rps']:.2f} vs simulated {c['simulated_capacity_rps']:.2f} calls/s")
        timings["profile_s"] = time.perf_counter() - t

        # 6. plan on the measured profiles and run the beam search at `load` x max throughput
        capacity = {llm: comparisons[llm]["workflow"]["measured_capacity_rps"] for llm in PROFILED}
        max_rate = min(capacity[st["llm"]] / st["invocations"] for st in stages)
        rate = s.load * max_rate
        instance_path = out / "instance.yaml"
        instance_path.write_text(yaml.safe_dump(_instance(stages, round(rate, 6), measured_paths), sort_keys=False))
        plan = _scepsy(["plan", str(instance_path), "--out", str(out / "plan.json"), "--json"], log)
        predicted = plan["workflows"][0]["latency_s"]
        log(f"plan: {[(x['name'], x['fraction'], x['replicas']) for x in plan['llms']]}; rate {rate:.4f} req/s; "
            f"predicted mean latency {predicted:.3f} s")
        t = time.perf_counter()
        server, proxy_url = proxy(out / "run.db")
        with server:
            results = run_open_loop(_beam(proxy_url, s), rate * s.speedup, s.run_requests, seed=s.seed,
                                    questions_per_seed=s.trace_requests, arrivals=s.arrivals)
        timings["run_s"] = time.perf_counter() - t
    latencies = [r.latency_s * s.speedup for r in results if not r.error]
    measured = statistics.mean(latencies) if latencies else math.nan
    run_stats = _scepsy(["aggregate", str(out / "run.db"), "--json"], log)
    timings["total_s"] = time.perf_counter() - t0
    report = {
        "speedup": s.speedup,
        "replicas": [asdict(r) for r in REPLICAS],
        "stages": {name: w["stages"] for name, w in workflows.items()},
        "profiles": comparisons,
        "workflow_rate_rps": rate,
        "max_throughput_rps": max_rate,
        "plan": [(x["name"], x["fraction"], x["replicas"]) for x in plan["llms"]],
        "predicted_latency_s": predicted,
        "measured_mean_latency_s": measured,
        "relative_error": (predicted - measured) / measured if latencies else math.nan,
        "run_stages": {w["name"]: w["stages"] for w in run_stats["workflows"]},
        "measured_requests": len(latencies),
        "failed_requests": sum(1 for r in results if r.error),
        "timings_s": timings,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()},
    }
    (out / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    defaults = Settings()
    parser.add_argument("--out-dir", type=Path, default=defaults.out_dir)
    parser.add_argument("--speedup", type=float, default=defaults.speedup)
    parser.add_argument("--trace-requests", type=int, default=defaults.trace_requests)
    parser.add_argument("--run-requests", type=int, default=defaults.run_requests)
    parser.add_argument("--load", type=float, default=defaults.load)
    parser.add_argument("--duration-s", type=float, default=defaults.duration_s)
    parser.add_argument("--arrivals", choices=("uniform", "poisson"), default=defaults.arrivals)
    args = parser.parse_args(argv)
    settings = Settings(out_dir=args.out_dir, speedup=args.speedup, trace_requests=args.trace_requests,
                        run_requests=args.run_requests, load=args.load, duration_s=args.duration_s, arrivals=args.arrivals)
    report = run(settings)
    print("\nllm  replay       light-load measured_s simulated_s error  mean|error|  capacity measured/simulated calls/s")
    for llm, both in report["profiles"].items():
        for label in ("independent", "workflow"):
            c = both[label]
            first = c["points"][0]
            print(f"{llm:4s} {label:11s} {first['measured_latency_s']:>19.3f} {first['simulated_latency_s']:>11.3f} "
                  f"{100 * first['error']:+6.1f}% {100 * c['mean_abs_error']:>9.1f}%  {c['measured_capacity_rps']:8.2f} / "
                  f"{c['simulated_capacity_rps']:.2f}")
    light = [both["independent"]["points"][0]["error"] for both in report["profiles"].values() if both["independent"]["points"]]
    met = bool(light) and all(0 <= e <= TARGET_LIGHT_LOAD_ERROR for e in light)
    print(f"target: the emulator at light load no faster than the engine model and at most "
          f"{100 * TARGET_LIGHT_LOAD_ERROR:.0f}% slower (independent calls): {'met' if met else 'NOT met'}")
    print(f"beam search at {report['workflow_rate_rps']:.4f} req/s: predicted mean latency_s {report['predicted_latency_s']:.3f}, "
          f"measured {report['measured_mean_latency_s']:.3f} over {report['measured_requests']} requests, error "
          f"{100 * report['relative_error']:+.1f}%; total_s {report['timings_s']['total_s']:.0f}")
    return 0 if report["failed_requests"] == 0 else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
