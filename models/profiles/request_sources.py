"""Request sources: the request lengths, and the traced request structure, that profile synthesis
(models/profiles/synthesize.py) replays on one replica.

Request lengths come from a `RequestSource`:
  - `fixed:P,C`                prompt P tokens, completion C tokens (C = 0 for encoders)
  - `azure:conv`, `azure:code` the Azure LLM inference traces (2023), shipped with the package
                               (models/data/azure.py; licence and attribution in models/data/LICENSE.md)
  - PATH.csv                   a CSV with ContextTokens,GeneratedTokens columns (Azure format)
  - PATH.jsonl                 one call per line: {"prompt_tokens", "completion_tokens"} and
                               optionally "cached_tokens" (prefix-cache hits seen in the trace),
                               "sequences" (pairs in one reranker call) and "llm" (with `llm=`, only
                               that LLM's calls are used). `scepsy simulate --calls-out` writes it;
                               `scepsy traces export` (the tracing proxy) writes a form it reads too
                               (`workflow_id` and `call_id` give the request structure; calls
                               without token counts are left out).

Traces with request structure (every call has "request", "call", "start_s", "end_s", and
optionally "workflow", "prefix_call", "prefix_tokens", as `scepsy simulate --calls-out` writes)
are replayed as the paper's profiler does, maintaining the dependencies within each traced
request: workflow requests ("sessions") start as a Poisson process, their calls of this LLM run
in the traced order (calls that started together run in parallel; the traced gap between waves,
time spent elsewhere, is kept), and a call whose prompt extends an earlier call's is looked up in
the replica's prefix cache, which is simulated (so a small GPU fraction with little KV cache gets
fewer hits). The rate axis stays calls per second of this LLM. Other sources' calls arrive
independently, with their traced "cached_tokens" replayed as hits.
"""

from __future__ import annotations

import io
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from scepsy.models.data.azure import AZURE_TRACES, azure_trace_text
from scepsy.models.errors import InputError
from scepsy.models.inputs import check_input, read_text


@dataclass(frozen=True)
class RequestShape:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    sequences: int = 1


@dataclass(frozen=True)
class SessionCall:
    """One call of a traced workflow request: its shape, its index in the request, and the call
    whose prompt+output its prompt starts with (prefix-cache dependency), if any."""

    shape: RequestShape
    call: int
    prefix_call: int | None = None
    prefix_tokens: int = 0


@dataclass(frozen=True)
class Session:
    """One traced workflow request's calls of one LLM: waves of parallel calls, in order; each
    wave starts `gap_s` after the previous one ended (time spent in other LLMs and tools)."""

    waves: tuple[tuple[SessionCall, ...], ...]
    gaps_s: tuple[float, ...]

    @property
    def calls(self) -> int:
        return sum(len(w) for w in self.waves)


@dataclass(frozen=True)
class RequestSource:
    """A pool of request shapes to sample from (with replacement), and, for a trace with request
    structure, the sessions to replay with their dependencies."""

    name: str
    shapes: tuple[RequestShape, ...]
    sessions: tuple[Session, ...] = ()
    # a public trace of other models' requests (Azure) is clipped to the model's context; the
    # user's own lengths (fixed:P,C, a calls JSONL) must fit it (check_context)
    clip_to_context: bool = False

    def sample(self, rng: random.Random, n: int) -> list[RequestShape]:
        if len(self.shapes) == 1:
            return [self.shapes[0]] * n
        return [self.shapes[rng.randrange(len(self.shapes))] for _ in range(n)]

    @property
    def mean_prompt_tokens(self) -> float:
        return float(np.mean([s.prompt_tokens for s in self.shapes]))

    @property
    def mean_completion_tokens(self) -> float:
        return float(np.mean([s.completion_tokens for s in self.shapes]))


def _azure_source(path: Path | None, name: str, text: str) -> RequestSource:
    """A source from an Azure-format CSV's text (`path`: the file it came from, None for the
    shipped traces)."""
    try:
        frame = pd.read_csv(io.StringIO(text), usecols=["ContextTokens", "GeneratedTokens"])
    except (ValueError, pd.errors.ParserError) as exc:
        raise InputError(str(path) if path else None, None if path else "requests", f"not an Azure trace CSV ({exc})", "give a CSV with ContextTokens,GeneratedTokens") from None
    shapes = tuple(
        RequestShape(int(max(p, 1)), int(max(c, 1)))
        for p, c in zip(frame["ContextTokens"].to_numpy(), frame["GeneratedTokens"].to_numpy())
    )
    if not shapes:
        raise InputError(str(path) if path else None, None if path else "requests", "the trace has no rows", "give a non-empty trace")
    return RequestSource(name, shapes, clip_to_context=True)


def _sessions(records: list[dict]) -> tuple[Session, ...]:
    """Group a trace's calls by workflow request; calls starting together form a wave."""
    by_request: dict[tuple, list[dict]] = {}
    for record in records:
        by_request.setdefault((str(record.get("workflow")), record["request"]), []).append(record)
    sessions = []
    for key in sorted(by_request, key=lambda k: (str(k[0]), str(k[1]))):
        calls = sorted(by_request[key], key=lambda r: (float(r["start_s"]), int(r["call"])))
        present = {int(r["call"]) for r in calls}
        waves: list[list[dict]] = []
        for record in calls:
            if waves and abs(float(record["start_s"]) - float(waves[-1][0]["start_s"])) < 1e-6:
                waves[-1].append(record)
            else:
                waves.append([record])
        gaps, previous_end = [], None
        for wave in waves:
            start = float(wave[0]["start_s"])
            gaps.append(0.0 if previous_end is None else max(start - previous_end, 0.0))
            previous_end = max(float(r["end_s"]) for r in wave)
        sessions.append(Session(
            tuple(
                tuple(
                    SessionCall(
                        _shape(r),
                        int(r["call"]),
                        int(r["prefix_call"]) if r.get("prefix_call") is not None and int(r["prefix_call"]) in present else None,
                        int(r.get("prefix_tokens") or 0),
                    )
                    for r in wave
                )
                for wave in waves
            ),
            tuple(gaps),
        ))
    return tuple(sessions)


def _shape(record: dict) -> RequestShape:
    return RequestShape(
        int(record["prompt_tokens"]),
        int(record["completion_tokens"]),
        int(record.get("cached_tokens", 0) or 0),
        int(record.get("sequences", 1) or 1),
    )


SESSION_FIELDS = ("request", "call", "start_s", "end_s")
COUNT_MINIMUM = {"prompt_tokens": 0, "completion_tokens": 0, "cached_tokens": 0, "sequences": 1}  # a calls JSONL's counts


def _jsonl_source(path: Path, llm: str | None) -> RequestSource:
    records = []
    lines = read_text(path, "check the path of the request source").splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if llm is not None and record.get("llm") != llm:
                continue
            if "prompt_tokens" not in record and "completion_tokens" not in record:
                raise KeyError("prompt_tokens")
            counts = {key: int(record[key]) for key in COUNT_MINIMUM if record.get(key) is not None}
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError, OverflowError):
            raise InputError(
                str(path), f"line {number}", "not a JSON object with integer prompt_tokens and completion_tokens",
                'write one {"prompt_tokens": P, "completion_tokens": C} per line',
            ) from None
        for key, count in counts.items():  # a count given must be a number; missing ones are left out later
            if count < COUNT_MINIMUM[key]:
                raise InputError(str(path), f"line {number}, {key}", f"{record[key]!r} is less than {COUNT_MINIMUM[key]}",
                                 f"write a count >= {COUNT_MINIMUM[key]}")
        records.append(record)
    if not records:
        which = f" of llm {llm!r}" if llm else ""
        raise InputError(str(path), None, f"no calls{which} in the file", "check the llm name and the trace")
    try:
        return source_from_calls(records, f"{path.name}" + (f" ({llm})" if llm else ""))
    except (TypeError, ValueError) as exc:
        raise InputError(str(path), "request/call", f"cannot use the calls ({exc})",
                         "give prompt_tokens and completion_tokens, and integer request and call fields") from None


def _normalise(records: Sequence[dict]) -> tuple[list[dict], int]:
    """Records with token counts, with the request structure of a tracing-proxy export
    (`workflow_id`, `call_id`) mapped to `request` and `call` (the order of the calls within their
    workflow request). Returns the records and how many lacked token counts."""
    usable = [r for r in records if r.get("prompt_tokens") is not None and r.get("completion_tokens") is not None]
    if usable and all(r.get("request") is None for r in usable) and all(r.get("workflow_id") for r in usable):
        grouped: dict[tuple, list[dict]] = {}
        for record in usable:
            grouped.setdefault((str(record.get("workflow")), str(record["workflow_id"])), []).append(record)
        usable = []
        for key in sorted(grouped):
            ordered = sorted(grouped[key], key=lambda r: (float(r["start_s"]), str(r.get("call_id"))))
            usable += [dict(r, request=key[1], call=i) for i, r in enumerate(ordered)]
    return usable, len(records) - len(usable)


def source_from_calls(records: Sequence[dict], name: str) -> RequestSource:
    """A source from call records (the JSONL fields as dicts, or a tracing-proxy export), with
    sessions when every record has the request structure. Calls without token counts (streams
    whose engine sent no usage) are left out."""
    usable, dropped = _normalise(records)
    if not usable:
        raise ValueError("no call has prompt_tokens and completion_tokens")
    sessions: tuple[Session, ...] = ()
    if all(all(record.get(f) is not None for f in SESSION_FIELDS) for record in usable):
        sessions = _sessions(usable)
    label = f"{name}, {dropped} calls without token counts left out" if dropped else name
    return RequestSource(label, tuple(_shape(r) for r in usable), sessions)


def load_request_source(spec: str, llm: str | None = None) -> RequestSource:
    """Parse a request source (`requests`; see the module doc)."""
    if spec.startswith("fixed:"):
        try:
            prompt, completion = (int(x) for x in spec[len("fixed:"):].split(","))
        except ValueError:
            raise InputError(None, "requests", f"bad fixed lengths {spec!r}", "write fixed:PROMPT,COMPLETION, e.g. fixed:512,128") from None
        if prompt < 1 or completion < 0:
            raise InputError(None, "requests", "lengths must be prompt >= 1, completion >= 0", "fix the numbers")
        return RequestSource(spec, (RequestShape(prompt, completion),))
    if spec.startswith("azure:"):
        kind = spec[len("azure:"):]
        if kind not in AZURE_TRACES:
            raise InputError(None, "requests", f"unknown Azure trace {kind!r}", "use azure:conv or azure:code")
        return _azure_source(None, spec, azure_trace_text(kind))
    path = Path(spec)
    check_input(path, "give fixed:P,C, azure:conv|code, a .csv or a .jsonl path")
    if path.suffix == ".csv":
        return _azure_source(path, path.name, read_text(path, "check the path of the request source"))
    return _jsonl_source(path, llm)
