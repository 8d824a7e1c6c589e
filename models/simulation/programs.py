"""Workflow programs: the control flow the simulator (models/simulation/simulator.py) runs for each request.

An instance's workflow may say which program it runs (`program:` in the YAML, optional); without
one it runs `stages`, built from its stages' statistics. The programs:

beam_search -- beam search with a process reward model as in HuggingFace search-and-learn
    (sal/search/beam_search.py). `beams` (n) beams start from the question. Each iteration:
      1. the active beams are refilled to n by repeating them (survivors fork);
      2. the generator extends every active beam by one reasoning step (one call per beam, all in
         parallel; the last allowed iteration generates to the end);
      3. the verifier scores every beam's solution so far (one call per beam, in parallel; with
         `verify_unique`, beams whose text is identical are scored once);
      4. beams that produced their final step (probability `finish_probability` per step, or the
         iteration limit) are completed; the search stops when no beam is active or n beams have
         completed;
      5. the top n // beam_width active beams by score survive (scores are random here).
    A step is identical to an earlier sibling's (same parent) with `duplicate_probability`.
    Prompts carry the whole beam so far; each call's prompt starts with the previous call of the
    same lineage, which the engine's prefix cache may still hold. Invocation counts vary
    strongly per request (the number of iterations is random).

rag -- retrieval-augmented generation with a reranker: embed the query; retrieve `passages`
    passages (a vector search taking `retrieve_s`); score the query against each passage with the
    cross-encoder (one call scoring all pairs, or one call per pair in parallel); generate the
    answer from the top `context_passages` passages.

ensemble -- a judge ensemble (a fan-out across LLMs): the question goes to every judge at once
    (one call each, different LLMs running side by side); when all have answered, the aggregator
    reads the question and every answer and writes the verdict. The request waits for its slowest
    judge, so the judges' latencies do not add up (docs/model.md, critical path).

stages -- the default: for each stage in order, about invocations/parallelism rounds of about
    `parallelism` parallel calls (random rounding keeps the means), so that the measured n and p
    match the stage statistics. Call lengths: `prompt_tokens`/`completion_tokens` per stage, else
    512/128 tokens for decoders and 64 prompt tokens for encoders.

Lengths marked "mean" are drawn per call from a lognormal distribution with that mean and a
coefficient of variation of `length_cv` (at least one token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
import random
from typing import Protocol, Sequence

import simpy

from scepsy.models.instance.instance import Workflow
from scepsy.models.instance.workflow import BeamSearchProgram, EnsembleProgram, Program, RagProgram, StagesProgram


class RequestContext(Protocol):
    """What a program sees of its request (models/simulation/simulator.py implements it)."""

    env: simpy.Environment
    workflow: Workflow
    rng: random.Random

    def is_encoder(self, llm: str) -> bool: ...

    def call(self, llm: str, prompt_tokens: int, completion_tokens: int, *, prefix_key=None, prefix_tokens: int = 0,
             store_key=None, sequences: int = 1) -> simpy.Event: ...

    def all_of(self, events: Sequence[simpy.Event]) -> simpy.Event: ...


# ---------------------------------------------------------------------------------------------
# Execution (SimPy generators driven by models/simulation/simulator.py)


def _length(ctx: "RequestContext", mean: float, cv: float) -> int:
    if cv <= 0:
        return max(int(round(mean)), 1)
    sigma = math.sqrt(math.log(1 + cv * cv))
    return max(int(round(ctx.rng.lognormvariate(math.log(mean) - sigma * sigma / 2, sigma))), 1)


@dataclass
class _Beam:
    key: int  # lineage key of the cached prompt+output of this beam's last calls
    tokens: int  # tokens of the solution so far
    finished: bool = False


def run_beam_search(ctx: "RequestContext", spec: BeamSearchProgram):
    rng = ctx.rng
    n = spec.beams
    survivors = max(n // spec.beam_width, 1)
    next_key = iter(range(1, 1 << 30))
    active = [_Beam(0, 0)]
    completed = 0
    for iteration in range(spec.max_iterations):
        last = iteration == spec.max_iterations - 1
        parents = (active * (n // len(active) + 1))[:n]
        # 1-2. one generation call per beam; a duplicate repeats an earlier sibling's step
        steps: list[tuple[_Beam, _Beam]] = []  # (parent, child)
        calls = []
        for index, parent in enumerate(parents):
            siblings = [child for p, child in steps if p is parent]
            if siblings and rng.random() < spec.duplicate_probability:
                twin = siblings[rng.randrange(len(siblings))]
                child = _Beam(twin.key, twin.tokens, twin.finished)
            else:
                length = _length(ctx, spec.final_tokens if last else spec.step_tokens, spec.length_cv)
                child = _Beam(next(next_key), parent.tokens + length, last or rng.random() < spec.finish_probability)
            steps.append((parent, child))
            prompt = spec.question_tokens + parent.tokens
            calls.append(
                ctx.call(
                    spec.generator, prompt, child.tokens - parent.tokens,
                    prefix_key=("gen", parent.key), prefix_tokens=prompt, store_key=("gen", child.key),
                )
            )
        yield ctx.all_of(calls)
        # 3. score the beams (identical texts once)
        children = [child for _, child in steps]
        scored = {}
        for parent, child in steps:
            if spec.verify_unique and child.key in scored:
                continue
            prompt = spec.question_tokens + child.tokens
            scored[child.key] = ctx.call(
                spec.verifier, prompt, spec.score_tokens,
                prefix_key=("ver", parent.key), prefix_tokens=spec.question_tokens + parent.tokens,
                store_key=("ver", child.key),
            )
        yield ctx.all_of(list(scored.values()))
        # 4. completed beams leave; stop when none is active or n have completed
        completed += sum(1 for child in children if child.finished)
        active = [child for child in children if not child.finished]
        if not active or completed >= n:
            return
        # 5. keep the top n // beam_width (random scores; duplicates are filtered first)
        unique = list({child.key: child for child in active}.values())
        rng.shuffle(unique)
        active = unique[:survivors]


def run_rag(ctx: "RequestContext", spec: RagProgram):
    yield ctx.call(spec.embedder, spec.query_tokens, 0)
    if spec.retrieve_s > 0:
        yield ctx.env.timeout(spec.retrieve_s)
    if spec.reranker is not None:
        pair = spec.query_tokens + spec.passage_tokens
        if spec.rerank_batched:
            yield ctx.call(spec.reranker, pair * spec.passages, 0, sequences=spec.passages)
        else:
            yield ctx.all_of([ctx.call(spec.reranker, pair, 0) for _ in range(spec.passages)])
    prompt = spec.system_tokens + spec.query_tokens + spec.context_passages * spec.passage_tokens
    yield ctx.call(spec.generator, prompt, _length(ctx, spec.output_tokens, spec.length_cv))


def run_ensemble(ctx: "RequestContext", spec: EnsembleProgram):
    answers = [_length(ctx, spec.answer_tokens, spec.length_cv) for _ in spec.judges]
    yield ctx.all_of([ctx.call(judge, spec.question_tokens, length) for judge, length in zip(spec.judges, answers)])
    prompt = spec.question_tokens + sum(answers)
    yield ctx.call(spec.aggregator, prompt, _length(ctx, spec.verdict_tokens, spec.length_cv))


def _round_random(ctx: "RequestContext", value: float) -> int:
    low = math.floor(value)
    return low + (1 if ctx.rng.random() < value - low else 0)


def run_stages(ctx: "RequestContext", spec: StagesProgram):
    lengths = {c.llm: c for c in spec.calls}
    for stage in ctx.workflow.stages:
        encoder = ctx.is_encoder(stage.llm)
        chosen = lengths.get(stage.llm)
        prompt = chosen.prompt_tokens if chosen and chosen.prompt_tokens else (64 if encoder else 512)
        completion = 0 if encoder else max(
            chosen.completion_tokens if chosen and chosen.completion_tokens is not None else 128, 1
        )
        per_round = stage.parallelism
        rounds = stage.invocations / per_round
        for _ in range(max(_round_random(ctx, rounds), 0)):
            width = max(_round_random(ctx, per_round), 1)
            yield ctx.all_of(
                [ctx.call(stage.llm, prompt, completion if encoder else _length(ctx, completion, spec.length_cv))
                 for _ in range(width)]
            )


def run_program(ctx: "RequestContext", program: Program):
    if isinstance(program, BeamSearchProgram):
        return run_beam_search(ctx, program)
    if isinstance(program, RagProgram):
        return run_rag(ctx, program)
    if isinstance(program, EnsembleProgram):
        return run_ensemble(ctx, program)
    return run_stages(ctx, program)
