"""Published measurements the engine model is checked against (docs/engine-model.md).

Each `Reference` is one published number with its source, and says how the engine model
reproduces it:

- `decode`: time per output token of `batch` sequences decoding together at `context` tokens of
  context each (single-stream decode speed when batch = 1): `Engine.decode_step_time_s`;
- `prefill`: time to first token of `prompts` submitted at once to an idle server, which prefills
  them in one iteration: `Engine.iteration_time_s` of that iteration (the published number also
  holds the HTTP server's request handling, which the engine model leaves out);
- `closed_loop`: requests/s of a closed loop of `concurrency` clients sending fixed-length requests
  (`vllm bench serve --max-concurrency`): the replica simulation of models/performance/replica.py. The source
  repeats each configuration three times with the same seed, so (vLLM >= 0.8 caches prefixes by
  default) a repeated run finds its prompts cached: `cached_runs` says which of the averaged runs
  the model replays with cached prompts. This is our reading of the setup, not the source's.

References with `in_bound=False` are reported but not held to the bound: the TTFTs measured under
vLLM 0.6.0 with multi-step scheduling include more than the prefill iteration.

`compare()` evaluates the model on every reference; tests/test_engine.py keeps the error within
the bound stated in docs/engine-model.md.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import simpy

from scepsy.models.catalog.catalog import gpu, model
from scepsy.models.performance.engine import DEFAULT_SETTINGS, Engine, EngineSettings, IterationWork, causal_attention
from scepsy.models.performance.replica import ReplicaSim, Request

LAMBDA = "https://github.com/LambdaLabsML/vllm-benchmark/blob/main/results/prompt_10"
LAMBDA_PROMPTS_LLAMA3 = (13, 25, 27, 10, 329, 29, 399, 328, 4, 205)
LAMBDA_PROMPTS_MISTRAL = (14, 30, 28, 12, 375, 29, 487, 369, 5, 236)
CSSNOEASY = "https://github.com/cssnoeasy/a100-vllm-benchmark-blog/blob/main/docs/reports/a100-tp1-vs-tp2-formal-baseline.md"


@dataclass(frozen=True)
class Reference:
    key: str
    kind: str  # decode | prefill | closed_loop
    gpu: str
    model: str
    tp: int
    engine: str  # the serving engine that produced the number
    published: float
    unit: str  # "ms/token", "ms", "req/s"
    source: str
    note: str
    batch: int = 1
    context: int = 0
    prompts: tuple[int, ...] = ()
    concurrency: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    settings: dict = field(default_factory=dict)  # engine settings of that deployment
    cached_runs: tuple[bool, ...] = (False,)  # closed loop: runs averaged, each with prompts cached or not
    in_bound: bool = True  # counted in the error bound of docs/engine-model.md


REFERENCES: tuple[Reference, ...] = (
    Reference(
        "a6000-qwen7b-decode", "decode", "A6000", "qwen2.5-7b", 1, "vLLM 0.23", 21.9, "ms/token",
        "https://ld-singh.github.io/ai-factory-ops-lab/portfolio-lab/06-validation-reports/inference-benchmark-report/",
        "TPOT p50 at concurrency 1 (short chat prompts, ~50 output tokens)", batch=1, context=150,
    ),
    Reference(
        "a100-40g-llama31-8b-decode", "decode", "A100-40G", "llama-3.1-8b", 1, "vLLM 0.23", 1000 / 75, "ms/token",
        "https://johnmusgrave.com/p/vllm-throughput-latency-sweep-on",
        "~75 tokens/s at concurrency 1, 1024 input / 128 output tokens", batch=1, context=1088,
    ),
    Reference(
        "a100-80g-llama3-8b-decode", "decode", "A100-80G", "llama-3-8b", 1, "vLLM 0.6.0", 11.41, "ms/token",
        f"{LAMBDA}/1xA100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json",
        "inter-token latency of the last running request (741 output tokens), 10-step scheduling chunks / 10",
        batch=1, context=1000,
    ),
    Reference(
        "h100-llama3-8b-decode", "decode", "H100-SXM", "llama-3-8b", 1, "vLLM 0.6.0", 7.05, "ms/token",
        f"{LAMBDA}/1xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json",
        "inter-token latency of the last running request (741 output tokens), 10-step chunks / 10",
        batch=1, context=1000,
    ),
    Reference(
        "h100-mistral7b-decode", "decode", "H100-SXM", "mistral-7b", 1, "vLLM 0.6.0", 6.78, "ms/token",
        f"{LAMBDA}/1xH100-80GB-SXM/Mistral-7B-Instruct-v0.3_tp1_len2048.json",
        "inter-token latency with the two longest requests (883, 928 output tokens) left", batch=2, context=800,
    ),
    Reference(
        "a6000-llama2-7b-decode-llamacpp", "decode", "A6000", "llama-2-7b", 1, "llama.cpp (F16)", 1000 / 44.01,
        "ms/token", "https://github.com/XiongjieDai/GPU-Benchmarks-on-LLM-Inference",
        "llama-bench text generation, LLaMA 2 7B F16, 44.01 tokens/s", batch=1, context=256,
    ),
    Reference(
        "a100-80g-llama3-8b-prefill", "prefill", "A100-80G", "llama-3-8b", 1, "vLLM 0.6.0", 126.87, "ms",
        f"{LAMBDA}/1xA100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json",
        "mean TTFT of 10 prompts (1,369 tokens) sent at once", prompts=LAMBDA_PROMPTS_LLAMA3, in_bound=False,
    ),
    Reference(
        "h100-llama3-8b-prefill", "prefill", "H100-SXM", "llama-3-8b", 1, "vLLM 0.6.0", 62.43, "ms",
        f"{LAMBDA}/1xH100-80GB-SXM/Meta-Llama-3-8B-Instruct_tp1_len2048.json",
        "mean TTFT of 10 prompts (1,369 tokens) sent at once", prompts=LAMBDA_PROMPTS_LLAMA3, in_bound=False,
    ),
    Reference(
        "h100-mistral7b-prefill", "prefill", "H100-SXM", "mistral-7b", 1, "vLLM 0.6.0", 67.99, "ms",
        f"{LAMBDA}/1xH100-80GB-SXM/Mistral-7B-Instruct-v0.3_tp1_len2048.json",
        "median TTFT of 10 prompts (1,585 tokens) sent at once", prompts=LAMBDA_PROMPTS_MISTRAL, in_bound=False,
    ),
) + tuple(
    Reference(
        f"a100-pcie-qwen7b-tp{tp}-{isl}-{osl}-c{c}", "closed_loop", "A100-80G-PCIE", "qwen2.5-7b", tp, "vLLM 0.19.0",
        rps, "req/s", CSSNOEASY,
        f"vllm bench serve random {isl}/{osl}, max-concurrency {c}, TP over PCIe (no NVLink){note}",
        concurrency=c, prompt_tokens=isl, completion_tokens=osl, settings={"memory_utilization": 0.75},
        cached_runs=runs,
    )
    for tp, isl, osl, c, rps, note, runs in (
        (1, 512, 256, 8, 2.63, "; mean of runs 2-3 (run 1 is a flagged outlier)", (True, True)),
        (2, 512, 256, 8, 3.655, "; mean of runs 2-3 (run 1 is a flagged outlier)", (True, True)),
        (1, 2048, 128, 16, 7.08, "; mean of 3 runs", (False, True, True)),
        (2, 2048, 128, 16, 9.45, "; mean of 3 runs", (False, True, True)),
        (1, 2048, 512, 32, 3.43, "; mean of 3 runs", (False, True, True)),
        (2, 2048, 512, 32, 4.97, "; mean of 3 runs", (False, True, True)),
    )
)


@dataclass(frozen=True)
class Comparison:
    reference: Reference
    modelled: float

    @property
    def error(self) -> float:
        """(model - published) / published."""
        return (self.modelled - self.reference.published) / self.reference.published


def engine_of(reference: Reference, settings: EngineSettings = DEFAULT_SETTINGS) -> Engine:
    chosen = replace(settings, **reference.settings) if reference.settings else settings
    return Engine(model(reference.model), gpu(reference.gpu), reference.tp, 1.0, chosen)


def closed_loop_rps(engine: Engine, concurrency: int, prompt_tokens: int, completion_tokens: int,
                    num_prompts: int = 100, client_gap_s: float = 0.005, seed: int = 0,
                    prompts_cached: bool = False) -> float:
    """Requests/s as `vllm bench serve --max-concurrency C --num-prompts N` reports it: N requests,
    at most C in flight (a new one is sent when one returns), N / (last finish - first send).

    Each send waits an exponential gap (mean `client_gap_s`: HTTP round trip, tokenisation);
    without it, fixed-length requests stay in lock-step forever in a deterministic simulation.
    `prompts_cached`: every prompt is already in the prefix cache (a rerun with the same seed).
    """
    cached = prompt_tokens - 1 if prompts_cached else 0
    rng = random.Random(seed)
    env = simpy.Environment()
    replica = ReplicaSim(env, engine)
    remaining = [num_prompts]
    last = [0.0]

    def client():
        while remaining[0] > 0:
            remaining[0] -= 1
            yield env.timeout(rng.expovariate(1 / client_gap_s))
            yield replica.submit(Request(prompt_tokens, completion_tokens, cached_tokens=cached))
            last[0] = env.now

    for _ in range(concurrency):
        env.process(client())
    env.run()
    return num_prompts / last[0]


def modelled(reference: Reference, settings: EngineSettings = DEFAULT_SETTINGS) -> float:
    engine = engine_of(reference, settings)
    if reference.kind == "decode":
        return engine.decode_step_time_s(reference.batch, reference.context) * 1e3
    if reference.kind == "prefill":
        work = IterationWork(
            prefill_tokens=sum(reference.prompts),
            prefill_attention=sum(causal_attention(n) for n in reference.prompts),
            prefills_finishing=len(reference.prompts),
        )
        return engine.iteration_time_s(work) * 1e3
    if reference.kind == "closed_loop":
        runs = [
            closed_loop_rps(engine, reference.concurrency, reference.prompt_tokens, reference.completion_tokens,
                            prompts_cached=cached)
            for cached in reference.cached_runs
        ]
        return sum(runs) / len(runs)
    raise ValueError(f"unknown reference kind {reference.kind!r}")


def compare(settings: EngineSettings = DEFAULT_SETTINGS, references=REFERENCES) -> list[Comparison]:
    return [Comparison(r, modelled(r, settings)) for r in references]
