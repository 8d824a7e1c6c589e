"""The sequences of a generation request: each choice's length and finish reason (the engine's end
of sequence drawn, or the cap), the text each token adds, and the `usage` they add up to."""

from __future__ import annotations

import math
from dataclasses import dataclass

from scepsy.tracing.emulation.livereplica import LiveSequence
from scepsy.tracing.emulation.requests import Sampling
from scepsy.tracing.emulation.tokenizer import natural_length

UNCAPPED_MEAN_OUTPUT_TOKENS = 256.0


@dataclass(eq=False)
class Choice:
    """One sequence of a generation request, and what of it was sent already."""

    index: int
    prompt_index: int
    prompt_tokens: int
    token_texts: list[str]
    finish_reason: str
    stop_reason: str | None
    sequence: LiveSequence
    sent: int = 0

    @property
    def text(self) -> str:
        return "".join(self.token_texts)


def token_texts(tokens: list[str], used: int, text: str) -> list[str]:
    """The text each of the first `used` tokens adds, clipped to the returned `text` (tokens of a
    stop string add nothing)."""
    texts, offset = [], 0
    for token in tokens[:used]:
        end = offset + len(token)
        texts.append(text[min(offset, len(text)):min(end, len(text))])
        offset = end
    return texts


def sequence_plan(body: Sampling, room: int, rng, default_mean: float) -> tuple[int, str]:
    """(tokens to generate before any stop string, finish reason) of one sequence; `room` is what
    the context leaves after the prompt (the cap of a request without max_tokens)."""
    cap = body.cap
    mean = default_mean
    if cap is None:
        cap = room
        mean = mean or UNCAPPED_MEAN_OUTPUT_TOKENS
    natural = natural_length(rng, mean) if mean > 0 and not body.ignore_eos else math.inf
    length = max(min(cap, natural), min(body.min_tokens, cap))
    return int(length), ("length" if length >= cap else "stop")


def usage_counts(choices: list[Choice]) -> dict:
    """The `usage` of a response: each prompt counted once (its first choice), every choice's
    generated tokens, and the prompt tokens the prefix cache held."""
    first: dict[int, Choice] = {}
    for choice in choices:
        first.setdefault(choice.prompt_index, choice)
    prompt = sum(c.prompt_tokens for c in first.values())
    completion = sum(c.sequence.generated for c in choices)
    cached = sum(c.sequence.cached_tokens for c in first.values())
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}
