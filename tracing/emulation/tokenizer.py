"""Token counts without a tokenizer, and deterministic filler text: the emulator's text model.

The engine emulator (tracing/emulation/emulator.py) must count prompt tokens the way a real engine would,
without downloading a tokenizer. `token_units` approximates a byte-pair-encoding tokenizer of the
Llama-3 / GPT-4 family (vocabularies of 100k+ tokens, where a common English word with its leading
space is one token). It splits text with the same kind of pre-tokenizer pattern those tokenizers
use and charges each piece:

    piece                                   tokens
    ' ?[A-Za-z]+'   a word (leading space)  ceil(letters / 6)      (common words are one token)
    ' ?[0-9]{1,3}'  a group of <= 3 digits  1                      (Llama-3 splits numbers so)
    ' ?[ASCII punctuation]+'                ceil(characters / 3)
    a non-ASCII character                   1                      (CJK, emoji, accents: ~1 each)
    a whitespace run                        ceil(characters / 16)  (a single space before a word
                                                                    belongs to the word)
    "'s 't 're 've 'm 'll 'd"               1

Each token is a *unit*: a string (the piece, or the piece with a part number when a long piece
costs several tokens); the prefix cache hashes units, so equal texts give equal units. On English
prose this gives about 1.2 tokens per word (published ratios for these tokenizers: about 1.3 tokens
per word, 4 characters per token); it is an approximation and documented as one.

Chat prompts follow the Llama-3 chat template: `<|begin_of_text|>`, then per message
`<|start_header_id|> role <|end_header_id|> \\n\\n content <|eot_id|>` (5 tokens + content), then
the generation prompt `<|start_header_id|> assistant <|end_header_id|> \\n\\n` (4 tokens).
Completions prompts get `<|begin_of_text|>` before the text; token-id prompts count one token per id.

Filler text. A generated sequence is a deterministic stream of tokens drawn from a small English
vocabulary (words of at most 6 letters, small numbers, "." and ","), seeded by the request: the
same request gives the same text. Every filler token is exactly one unit when the text is
tokenized again, so a conversation that sends an emulated answer back counts it right.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from typing import Any, Iterable, Mapping

# one alternative per piece kind, in the order a BPE pre-tokenizer tries them
_PIECES = re.compile(
    r"'(?:[sSdDmMtT]|ll|LL|ve|VE|re|RE)(?![A-Za-z])"
    r"| ?[A-Za-z]+"
    r"| ?[0-9]{1,3}"
    r"| ?[!-/:-@\[-`{-~]+"
    r"| ?[^\x00-\x7f]"
    r"|\s+(?!\S)"
    r"|\s+"
)
_WORD_LETTERS_PER_TOKEN = 6
_PUNCTUATION_PER_TOKEN = 3
_SPACES_PER_TOKEN = 16

BEGIN_OF_TEXT = "<|begin_of_text|>"
HEADER_START, HEADER_END, END_OF_TURN = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
MESSAGE_OVERHEAD_TOKENS = 5  # header start, role, header end, "\n\n", end of turn
GENERATION_PROMPT_TOKENS = 4  # header start, "assistant", header end, "\n\n"


def _piece_cost(piece: str) -> int:
    if piece.isspace():
        return math.ceil(len(piece) / _SPACES_PER_TOKEN)
    if piece[0] == "'" and piece[1:].isalpha():
        return 1  # a contraction
    core = piece[1:] if piece[0] == " " else piece
    first = core[0]
    if not first.isascii() or first.isdigit():
        return 1  # one non-ASCII character, or a group of up to 3 digits
    if first.isalpha():
        return math.ceil(len(core) / _WORD_LETTERS_PER_TOKEN)
    return math.ceil(len(core) / _PUNCTUATION_PER_TOKEN)


def token_units(text: str) -> list[str]:
    """The units (approximate tokens) of `text`, in order (see the module doc)."""
    units: list[str] = []
    for piece in _PIECES.findall(text):
        cost = _piece_cost(piece)
        units.append(piece)
        units.extend(f"{piece}\x00{part}" for part in range(1, cost))
    return units


def count_tokens(text: str) -> int:
    return sum(_piece_cost(piece) for piece in _PIECES.findall(text))


def message_text(content) -> str:
    """The text of a chat message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for part in content:
        if isinstance(part, dict) and part.get("type") == "text":
            parts.append(str(part.get("text") or ""))
        elif isinstance(part, str):
            parts.append(part)
    return "".join(parts)


def chat_units(messages: Iterable[Mapping[str, Any]]) -> list[str]:
    """Units of a chat prompt under the Llama-3 template, generation prompt included."""
    units = [BEGIN_OF_TEXT]
    for message in messages:
        units += [HEADER_START, str(message.get("role", "user")), HEADER_END, "\n\n"]
        units += token_units(message_text(message.get("content")))
        units.append(END_OF_TURN)
    return units + [HEADER_START, "assistant", HEADER_END, "\n\n"]


def prompt_units(prompt) -> list[str]:
    """Units of one completions prompt: text (after <|begin_of_text|>) or a list of token ids."""
    if isinstance(prompt, str):
        return [BEGIN_OF_TEXT] + token_units(prompt)
    return [f"\x01{int(token)}" for token in prompt]


# ----------------------------------------------------------------------------------------------
# Filler text

VOCABULARY = (
    "the", "a", "is", "of", "to", "and", "in", "it", "we", "so", "that", "this", "then", "next",
    "first", "step", "answer", "value", "sum", "total", "number", "each", "more", "less", "than",
    "times", "half", "twice", "add", "take", "left", "right", "gives", "equals", "means", "result",
    "check", "again", "since", "thus", "hence", "now", "count", "part", "whole", "per", "hour",
    "day", "cost", "price", "items", "box", "boxes", "apples", "sheep", "train", "speed", "area",
    "width", "length", "pages", "book", "model", "query", "text", "data", "graph", "node", "state",
    "can", "will", "must", "not", "only", "also", "both", "all", "some", "one", "two", "three",
)
_NUMBERS = tuple(str(n) for n in range(0, 13))


# fields that limit or deliver an answer without changing what is sampled: with a fixed seed, a
# real engine's longer answer starts with its shorter one, whatever the stop strings or choices
DELIVERY_FIELDS = frozenset({"stream", "stream_options", "max_tokens", "max_completion_tokens", "min_tokens",
                             "ignore_eos", "stop", "n", "user"})


def request_seed(payload: dict) -> bytes:
    """A seed that identifies what a request asks: the SHA-256 of its JSON body with sorted keys,
    without the `DELIVERY_FIELDS` (so the same prompt with a larger max_tokens extends the text)."""
    content = {k: v for k, v in payload.items() if k not in DELIVERY_FIELDS}
    canonical = _canonical(content)
    return hashlib.sha256(canonical.encode()).digest()


def _canonical(value) -> str:
    import json

    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def sequence_rng(seed: bytes, index: int, purpose: str = "text") -> random.Random:
    """The random stream of sequence `index` (a choice) of a request, one per purpose (the text,
    the end-of-sequence draw), so that drawing one never shifts the other."""
    return random.Random(hashlib.sha256(seed + index.to_bytes(4, "big") + purpose.encode()).digest())


def filler_tokens(rng: random.Random, count: int) -> list[str]:
    """`count` filler tokens: sentences of vocabulary words and small numbers, each token one unit."""
    tokens: list[str] = []
    sentence_start = True
    since_period = 0
    while len(tokens) < count:
        roll = rng.random()
        after_word = bool(tokens) and tokens[-1] not in (".", ",")  # punctuation never doubles up
        if after_word and since_period >= 4 and roll < 0.12:
            tokens.append(".")
            sentence_start, since_period = True, 0
            continue
        if after_word and since_period >= 2 and roll < 0.17:
            tokens.append(",")
            continue
        word = rng.choice(_NUMBERS) if roll > 0.9 else rng.choice(VOCABULARY)
        if sentence_start:
            word = word.capitalize()
        tokens.append(word if not tokens else " " + word)
        sentence_start = False
        since_period += 1
    return tokens


def natural_length(rng: random.Random, mean_tokens: float) -> int:
    """A sequence's length when it ends at a drawn end-of-sequence token: geometric with the given
    mean (each token ends the sequence with probability 1 / mean), at least 1."""
    if mean_tokens <= 1:
        return 1
    p = 1.0 / mean_tokens
    u = 1.0 - rng.random()  # in (0, 1]
    return 1 + int(math.log(u) / math.log1p(-p))


def apply_stop(tokens: list[str], stops: Iterable[str]) -> tuple[int, str, str | None]:
    """Cut a token sequence at the first stop string: (tokens generated, text returned, the stop
    string or None). Generation ends with the token that completes the stop string; the returned
    text ends before it (OpenAI and vLLM leave stop strings out)."""
    text = "".join(tokens)
    best: tuple[int, str] | None = None
    for stop in stops:
        if not stop:
            continue
        at = text.find(stop)
        if at >= 0 and (best is None or at < best[0]):
            best = (at, stop)
    if best is None:
        return len(tokens), text, None
    at, stop = best
    end, used = 0, 0
    for token in tokens:
        end += len(token)
        used += 1
        if end >= at + len(stop):
            break
    return used, text[:at], stop
