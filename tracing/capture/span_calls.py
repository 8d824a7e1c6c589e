"""LLM calls from OpenTelemetry spans: which spans are calls, which request and workflow each
belongs to, and what in the spans a user should know about (docs/tracing.md, "OpenTelemetry spans").

- **Requests are traces.** The calls of one trace are one workflow request. A trace whose spans
  have several roots (spans without a parent), or none (every parent is missing from the files), is
  reported: its calls still count as one request.
- **Workflow identity**, per trace, from the first of: the attribute named by `workflow_attribute`
  (an application's own key, e.g. on the span it starts for each request); `gen_ai.workflow.name`
  on the GenAI workflow span (`gen_ai.operation.name` `invoke_workflow`; newer conventions name it
  with `gen_ai.agent.name`) or on any span; `traceloop.workflow.name` (OpenLLMetry);
  `scepsy.workflow.name` (scepsy's baggage key, copied onto spans by a baggage span processor);
  the root span's name (not when the root is itself an LLM call); the resource's `service.name`
  (not the SDK's `unknown_service` default). The outermost span that has a key wins, so a
  subgraph's own workflow span does not rename its parent's request. No name at all: the
  aggregate's default workflow name.
- **Only LLM calls count** (tracing/capture/spans.py `classify`): workflow, agent, task, tool, chain
  and other spans are skipped and counted by kind.
- **A call seen by two instrumentations counts once.** Two LLM-call spans of one trace for the same
  model, where one lies within the other in time and is its descendant (from any instrumentation
  scope: OpenLit writes its LangChain and OpenAI spans under one) or its sibling from another scope
  (a LangChain callback span and the OpenAI client span of the same request), are one call: the
  inner span is kept (its times are the client's), the outer dropped and counted. A span read
  twice (the same trace and span id) counts once too.
- **Warnings** (one line each, naming the fix): calls without a parent span (then every call is a
  request of its own: n is each LLM's share of all calls and p is 1), one workflow name for every
  request (workflows merged), duplicate calls or spans, spans of an unknown attribute scheme, traces
  with several roots or none, and requests without the `workflow_attribute`.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from scepsy.tracing.capture.records import CallRecord
from scepsy.tracing.capture.spans import LLM_CALL, UNKNOWN, Classified, Span, classify

BAGGAGE_KEY = "scepsy.workflow.name"
# where a request's workflow name came from, in the order they are tried
SOURCE_ATTRIBUTE = "workflow attribute"
SOURCE_GENAI = "gen_ai.workflow.name"
SOURCE_TRACELOOP = "traceloop.workflow.name"
SOURCE_BAGGAGE = BAGGAGE_KEY
SOURCE_ROOT = "root span name"
SOURCE_SERVICE = "service.name"
SOURCE_DEFAULT = "default"
_EXPLICIT = (SOURCE_ATTRIBUTE, SOURCE_BAGGAGE)  # names the application set for scepsy on purpose


@dataclass(frozen=True)
class SpanSummary:
    """What the spans held besides the calls (counted in `scepsy aggregate`'s summary)."""

    spans: int  # spans read
    llm_calls: int  # LLM calls counted
    skipped: Mapping[str, int]  # spans that are not LLM calls, by kind
    duplicate_calls: int  # LLM-call spans of a call another instrumentation recorded too
    repeated_spans: int  # spans read more than once
    requests: int  # traces with at least one LLM call
    traces_without_root: int
    traces_with_several_roots: int
    calls_without_parent: int
    workflow_sources: Mapping[str, str]  # workflow name -> where the name came from
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict:
        return {
            "spans": self.spans, "llm_calls": self.llm_calls, "skipped": dict(sorted(self.skipped.items())),
            "duplicate_calls": self.duplicate_calls, "repeated_spans": self.repeated_spans, "requests": self.requests,
            "traces_without_root": self.traces_without_root, "traces_with_several_roots": self.traces_with_several_roots,
            "calls_without_parent": self.calls_without_parent,
            "workflow_sources": dict(sorted(self.workflow_sources.items())),
        }

    def no_requests(self) -> tuple[str, str]:
        """Why these spans gave no workflow request, and the fix (for an aggregate with nothing in it)."""
        if self.llm_calls:
            return (f"no LLM-call span completed ({self.llm_calls} read, each with status ERROR)",
                    "trace workflow requests whose LLM calls succeed")
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(self.skipped.items(), key=lambda kv: (-kv[1], kv[0])))
        return (f"no span is an LLM call ({self.spans} read: {kinds})",
                "export the spans of an LLM instrumentation: the OpenTelemetry GenAI conventions "
                "(opentelemetry-instrumentation-openai-v2), OpenLLMetry or OpenInference (docs/tracing.md)")


@dataclass(frozen=True)
class SpanCalls:
    calls: tuple[CallRecord, ...]
    summary: SpanSummary


@dataclass
class _Trace:
    spans: list[Span]
    kinds: dict[str, Classified]  # span id -> classification

    def __post_init__(self) -> None:
        self.by_id = {s.span_id: s for s in self.spans}
        self.depth = {s.span_id: self._depth(s) for s in self.spans}

    def _depth(self, span: Span) -> int:
        depth, seen, parent = 0, {span.span_id}, span.parent_id
        while parent in self.by_id and parent not in seen:  # a cycle in broken data ends the walk
            seen.add(parent)
            depth += 1
            parent = self.by_id[parent].parent_id
        return depth

    def ancestors(self, span: Span) -> set[str]:
        found, parent = set(), span.parent_id
        while parent in self.by_id and parent not in found:
            found.add(parent)
            parent = self.by_id[parent].parent_id
        return found

    def outermost_first(self) -> list[Span]:
        return sorted(self.spans, key=lambda s: (self.depth[s.span_id], s.start_ns, s.span_id))

    @property
    def roots(self) -> list[Span]:
        return [s for s in self.spans if s.parent_id is None]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value.strip() else None


def _workflow_name(trace: _Trace, attribute: str | None) -> tuple[str | None, str]:
    """The request's workflow name and where it came from (module docstring)."""
    ordered = trace.outermost_first()

    def first(*keys: str, operation: str | None = None) -> str | None:
        for span in ordered:
            if operation is not None and span.attributes.get("gen_ai.operation.name") != operation:
                continue
            for key in keys:
                if (value := _text(span.attributes.get(key))) is not None:
                    return value
        return None

    if attribute:
        value = first(attribute) or next((v for s in ordered if (v := _text(s.resource.get(attribute)))), None)
        if value is not None:
            return value, SOURCE_ATTRIBUTE
    genai = first("gen_ai.workflow.name", "gen_ai.agent.name", operation="invoke_workflow") or first("gen_ai.workflow.name")
    if genai is not None:
        return genai, SOURCE_GENAI
    for key, source in (("traceloop.workflow.name", SOURCE_TRACELOOP), (BAGGAGE_KEY, SOURCE_BAGGAGE)):
        if (value := first(key)) is not None:
            return value, source
    roots = trace.roots
    if len(roots) == 1 and trace.kinds[roots[0].span_id].kind != LLM_CALL and _text(roots[0].name):
        return roots[0].name, SOURCE_ROOT
    for span in ordered:
        service = _text(span.resource.get("service.name"))
        if service is not None and not service.startswith("unknown_service"):
            return service, SOURCE_SERVICE
    return None, SOURCE_DEFAULT


def _same_call(trace: _Trace, outer: Span, inner: Span, model: dict[str, str | None]) -> bool:
    """`inner` is the call `outer` records too: the same model, within it in time, and its descendant
    (an LLM call makes no LLM call inside it, so a nested one is the same call recorded at two levels,
    whichever instrumentation scope wrote each: OpenLit writes its LangChain and OpenAI spans under
    one) or its sibling from another instrumentation (two calls of a fan-out are siblings too)."""
    if model[outer.span_id] != model[inner.span_id] or not outer.start_ns <= inner.start_ns <= inner.end_ns <= outer.end_ns:
        return False
    if outer.span_id in trace.ancestors(inner):
        return True
    return inner.parent_id == outer.parent_id and outer.scope != inner.scope


def _drop_outer_spans(trace: _Trace, calls: list[Span]) -> tuple[list[Span], list[tuple[Span, Span]]]:
    """The calls with every outer span of a call seen twice dropped, and the (outer, inner) pairs."""
    model = {s.span_id: trace.kinds[s.span_id].model for s in calls}
    by_start = sorted(calls, key=lambda s: (s.start_ns, s.span_id))
    starts = [s.start_ns for s in by_start]
    used_as_inner: set[str] = set()
    pairs = []
    for outer in sorted(calls, key=lambda s: (s.start_ns - s.end_ns, s.start_ns, s.span_id)):  # longest first
        window = by_start[bisect.bisect_left(starts, outer.start_ns):bisect.bisect_right(starts, outer.end_ns)]
        inners = [s for s in window if s is not outer and s.span_id not in used_as_inner and _same_call(trace, outer, s, model)]
        if inners:
            inner = max(inners, key=lambda s: (s.end_ns - s.start_ns, -s.start_ns, s.span_id))  # the next wrapper level
            used_as_inner.add(inner.span_id)
            pairs.append((outer, inner))
    dropped = {outer.span_id for outer, _ in pairs}
    return [s for s in calls if s.span_id not in dropped], pairs


def _record(span: Span, kind: Classified, workflow: str | None, llm_names: Mapping[str, str]) -> CallRecord:
    model = kind.model or ""
    return CallRecord(
        call_id=span.span_id,
        llm=llm_names.get(model, model),
        path=kind.path,
        start_s=span.start_ns / 1e9,
        end_s=span.end_ns / 1e9,
        status=500 if span.failed else 200,
        outcome="upstream_error" if span.failed else "ok",
        workflow=workflow,
        workflow_id=span.trace_id,
        model=model,
        stream=kind.stream,
        prompt_tokens=kind.prompt_tokens,
        completion_tokens=kind.completion_tokens,
        usage_source="usage" if kind.prompt_tokens is not None or kind.completion_tokens is not None else None,
        error=span.status_message if span.failed else None,
    )


def span_calls(spans: Iterable[Span], llm_names: Mapping[str, str] | None = None,
               workflow_attribute: str | None = None) -> SpanCalls:
    """The LLM calls of `spans`, one request per trace, with the summary and its warnings."""
    llm_names = llm_names or {}
    unique: dict[tuple[str, str], Span] = {}
    read = 0
    for span in spans:
        read += 1
        unique.setdefault((span.trace_id, span.span_id), span)
    by_trace: dict[str, list[Span]] = defaultdict(list)
    for span in unique.values():
        by_trace[span.trace_id].append(span)

    records: list[CallRecord] = []
    skipped: Counter[str] = Counter()
    unknown: Counter[str] = Counter()
    sources: dict[str, set[str]] = defaultdict(set)
    request_names: list[tuple[str | None, str]] = []
    pairs: list[tuple[Span, Span]] = []
    without_root = several_roots = without_parent = missing_attribute = 0
    for trace_id in sorted(by_trace):
        members = by_trace[trace_id]
        trace = _Trace(members, {s.span_id: classify(s) for s in members})
        calls = []
        for span in members:
            kind = trace.kinds[span.span_id]
            if kind.kind == LLM_CALL:
                calls.append(span)
            else:
                skipped[kind.kind] += 1
                if kind.kind == UNKNOWN:
                    unknown[kind.unknown or "?"] += 1
        if not calls:
            continue
        kept, found = _drop_outer_spans(trace, calls)
        pairs += found
        roots = len(trace.roots)
        without_root += roots == 0
        several_roots += roots > 1
        without_parent += sum(1 for s in kept if s.parent_id is None)
        name, source = _workflow_name(trace, workflow_attribute)
        missing_attribute += bool(workflow_attribute) and source != SOURCE_ATTRIBUTE
        request_names.append((name, source))
        if name is not None:
            sources[name].add(source)
        records += [_record(s, trace.kinds[s.span_id], name, llm_names) for s in kept]

    summary = SpanSummary(
        spans=read,
        llm_calls=len(records),
        skipped=dict(skipped),
        duplicate_calls=len(pairs),
        repeated_spans=read - len(unique),
        requests=len(request_names),
        traces_without_root=without_root,
        traces_with_several_roots=several_roots,
        calls_without_parent=without_parent,
        workflow_sources={name: ", ".join(sorted(found)) for name, found in sources.items()},
    )
    warnings = _warnings(summary, request_names, pairs, unknown, workflow_attribute, missing_attribute)
    return SpanCalls(tuple(records), replace(summary, warnings=tuple(warnings)))


def _examples(counter: Counter[str], limit: int = 3) -> str:
    return ", ".join(name for name, _ in sorted(counter.items(), key=lambda kv: (-kv[1], kv[0]))[:limit])


def _warnings(summary: SpanSummary, request_names: list[tuple[str | None, str]], pairs: list[tuple[Span, Span]],
              unknown: Counter[str], attribute: str | None, missing_attribute: int) -> list[str]:
    """One line per finding, each naming its fix (module docstring)."""
    out = []
    calls, requests = summary.llm_calls, summary.requests
    if summary.calls_without_parent:
        out.append(
            f"{summary.calls_without_parent} of {calls} LLM calls have no parent span, so each is a workflow request of "
            "its own (n is then the LLM's share of all calls and p is 1): start a span for each workflow request "
            "(tracer.start_as_current_span) or instrument the framework too (LangChain/LangGraph), so that a "
            "request's calls share one trace"
        )
    names = {name for name, _ in request_names}
    source = request_names[0][1] if request_names else SOURCE_DEFAULT
    if (requests > 1 and len(names) == 1 and source not in _EXPLICIT
            and summary.calls_without_parent < calls):
        (name,) = names
        shown = f"'{name}' (from the {source})" if name is not None else "the default workflow (no name found)"
        out.append(
            f"all {requests} workflow requests are named {shown}: requests of different workflows are merged; name "
            "each request's workflow with an attribute of its parent span and pass its key as `workflow_attribute`, "
            "or set gen_ai.workflow.name or traceloop.workflow.name"
        )
    if attribute and missing_attribute:
        out.append(
            f"{missing_attribute} of {requests} workflow requests carry no attribute {attribute} on any span and are "
            f"named from the next source instead: set {attribute} on the span that starts each request"
        )
    if pairs:
        scopes = Counter(f"{outer.scope or '?'} around {inner.scope or '?'}" if outer.scope != inner.scope
                         else f"{outer.scope or '?'}, nested" for outer, inner in pairs)
        out.append(
            f"{len(pairs)} LLM calls were recorded by two instrumentations ({_examples(scopes, 2)}); each counts once "
            "(the inner span): to record each call once, enable only one of them for the LLM client"
        )
    if summary.repeated_spans:
        out.append(
            f"{summary.repeated_spans} spans were read more than once (the same trace and span id); each counts once: "
            "pass each exported file once"
        )
    if unknown:
        out.append(
            f"{sum(unknown.values())} spans carry LLM attributes scepsy does not read ({_examples(unknown)}) and are "
            "skipped: if they are LLM calls, record them with the OpenTelemetry GenAI conventions "
            "(gen_ai.operation.name chat and gen_ai.request.model), OpenLLMetry or OpenInference"
        )
    if summary.traces_without_root:
        out.append(
            f"{summary.traces_without_root} of {requests} workflow requests have no root span (their parent spans "
            "are missing from the files): pass every file of the export, after the application has flushed its spans"
        )
    if summary.traces_with_several_roots:
        out.append(
            f"{summary.traces_with_several_roots} of {requests} workflow requests have several root spans (spans of "
            "one trace id without a parent): each still counts as one request; check that the spans of one request "
            "are exported whole and that trace ids are not reused"
        )
    return out
