"""A LangGraph workflow traced by a real LLM instrumentation package, run against `scepsy emulate`
servers; run as a script, one process per instrumentation (instrumentors patch libraries globally):

    python tests/support/instrumented.py CASE URLS_JSON OUT_DIR [REQUESTS]

Two workflows, `wide` and `narrow`, each with a fan-out inside one LLM (3 or 2 calls to `gen` side
by side, LangGraph `Send`s) and one across LLMs (`ver` and `judge` side by side). The workflow
knows its truth: every LLM call's interval, measured around the client call with the clock the
SDK stamps spans with (time.time_ns), goes to OUT_DIR/truth.json with its workflow and request.
The spans go to OUT_DIR/sdk.jsonl through the SDK's OTLP JSON file exporter
(opentelemetry-exporter-otlp-json-file) and to OUT_DIR/spans.pb as length-prefixed protobuf
`ExportTraceServiceRequest`s of a few spans each, encoded by opentelemetry-exporter-otlp-proto-common
(the messages the Collector's file exporter writes with `format: proto`).

CASE (what each instrumentation package sees, and how each request is started):
- parent_attribute: the official openai-v2 instrumentation on the openai client; the application
  starts a span `handle` per request with its workflow in the attribute `app.workflow`.
- genai_spans: openai-v2, with the GenAI workflow, agent and tool spans of opentelemetry-util-genai
  around the calls (`invoke_workflow` named by gen_ai.workflow.name).
- openllmetry_openai_v2: OpenLLMetry's LangChain instrumentation and the official openai-v2 both on
  (LangChain's ChatOpenAI): each call is recorded twice.
- openllmetry: OpenLLMetry's LangChain and OpenAI instrumentations (its usual set-up).
- openinference: OpenInference's LangChain instrumentation.
- no_parent: openai-v2 alone, no span around a request.
"""

from __future__ import annotations

import json
import operator
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, nullcontext
from pathlib import Path
from typing import Annotated, Any, Callable, ContextManager, TypedDict

from langgraph.graph import END, START, StateGraph
from langgraph.types import Send
from opentelemetry.exporter.otlp.json.file import FileSpanExporter
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

CASES = ("parent_attribute", "genai_spans", "openllmetry_openai_v2", "openllmetry", "openinference", "no_parent")
WORKFLOWS = {"wide": 3, "narrow": 2}  # workflow -> calls of gen side by side
MAX_TOKENS = {"gen": 12, "ver": 8, "judge": 8}
SPANS_PER_MESSAGE = 7  # the Collector batches spans; several messages per file, as it writes them
LANGCHAIN_CASES = ("openllmetry_openai_v2", "openllmetry", "openinference")


class State(TypedDict):
    request: str
    llm: str
    done: Annotated[list[str], operator.add]


class Truth:
    """Every call's interval as the workflow measured it (thread-safe)."""

    def __init__(self) -> None:
        self.calls: list[dict] = []
        self._lock = threading.Lock()

    def record(self, workflow: str, request: str, llm: str, start_ns: int, end_ns: int) -> None:
        with self._lock:
            self.calls.append({"workflow": workflow, "request": request, "llm": llm, "start_ns": start_ns, "end_ns": end_ns})


def instrument(case: str, provider: TracerProvider) -> None:
    """Turn on the case's instrumentation packages (module docstring)."""
    if case in ("parent_attribute", "genai_spans", "openllmetry_openai_v2", "no_parent"):
        from opentelemetry.instrumentation.openai_v2 import OpenAIInstrumentor

        OpenAIInstrumentor().instrument(tracer_provider=provider)
    if case in ("openllmetry_openai_v2", "openllmetry"):
        from opentelemetry.instrumentation.langchain import LangchainInstrumentor

        LangchainInstrumentor().instrument(tracer_provider=provider)
    if case == "openllmetry":
        from opentelemetry.instrumentation.openai import OpenAIInstrumentor as TraceloopOpenAIInstrumentor

        TraceloopOpenAIInstrumentor().instrument(tracer_provider=provider)
    if case == "openinference":
        from openinference.instrumentation.langchain import LangChainInstrumentor

        LangChainInstrumentor().instrument(tracer_provider=provider)


def llm_caller(case: str, urls: dict[str, str]) -> Callable[[str, str], None]:
    """call(llm, prompt): one chat completion through the client the case's instrumentation sees."""
    if case in LANGCHAIN_CASES:
        from langchain_openai import ChatOpenAI
        from pydantic import SecretStr

        models = {llm: ChatOpenAI(model=llm, base_url=f"{url}/v1", api_key=SecretStr("scepsy-test"), max_completion_tokens=MAX_TOKENS[llm],
                                  temperature=0.0, max_retries=0) for llm, url in urls.items()}

        def invoke(llm: str, prompt: str) -> None:
            models[llm].invoke(prompt)

        return invoke
    import openai

    clients = {llm: openai.OpenAI(base_url=f"{url}/v1", api_key="scepsy-test", max_retries=0) for llm, url in urls.items()}

    def call(llm: str, prompt: str) -> None:
        clients[llm].chat.completions.create(model=llm, messages=[{"role": "user", "content": prompt}],
                                             max_tokens=MAX_TOKENS[llm], temperature=0.0)

    return call


def build(name: str, width: int, call: Callable[[str, str], None], truth: Truth,
          around_call: Callable[[str], ContextManager[Any]]) -> Any:
    """The workflow: `width` gen calls side by side, then ver and judge side by side."""

    def timed(state: State) -> dict:
        llm = state["llm"]
        with around_call(llm):
            start = time.time_ns()
            call(llm, f"{name} {state['request']}: {llm} step")
            truth.record(name, state["request"], llm, start, time.time_ns())
        return {"done": [llm]}

    def gather(state: State) -> dict:
        return {}

    graph = StateGraph(State)
    graph.add_node("draft", timed)
    graph.add_node("gather", gather)
    graph.add_node("check", timed)
    graph.add_conditional_edges(START, lambda state: [Send("draft", {**state, "llm": "gen"}) for _ in range(width)], ["draft"])
    graph.add_edge("draft", "gather")
    graph.add_conditional_edges("gather", lambda state: [Send("check", {**state, "llm": llm}) for llm in ("ver", "judge")], ["check"])
    graph.add_edge("check", END)
    return graph.compile(name=name)  # the graph's name is the workflow name LangChain instrumentations record


def main(case: str, urls: dict[str, str], out: Path, requests: int) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": f"scepsy-test-{case}"}))
    provider.add_span_processor(BatchSpanProcessor(FileSpanExporter(out / "sdk.jsonl")))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrument(case, provider)
    tracer = provider.get_tracer("scepsy.tests.instrumented")
    genai: Any = None
    if case == "genai_spans":
        from opentelemetry.util.genai.handler import TelemetryHandler

        genai = TelemetryHandler(tracer_provider=provider)

    def around_call(llm: str) -> ContextManager[Any]:
        if genai is None:
            return nullcontext()
        stack = ExitStack()  # an agent that uses a tool, which calls the LLM
        stack.enter_context(genai.invoke_local_agent(agent_name=f"{llm}-agent", request_model=llm))
        stack.enter_context(genai.tool(f"{llm}-lookup"))
        return stack

    truth = Truth()
    call = llm_caller(case, urls)
    graphs = {name: build(name, width, call, truth, around_call) for name, width in WORKFLOWS.items()}

    def run(name: str, request: str) -> None:
        if case == "parent_attribute":
            scope: ContextManager[Any] = tracer.start_as_current_span("handle", attributes={"app.workflow": name})
        elif case == "genai_spans":
            scope = genai.workflow(name)
        else:
            scope = nullcontext()
        with scope:
            graphs[name].invoke({"request": request, "llm": "", "done": []}, {"max_concurrency": 4})

    with ThreadPoolExecutor(max_workers=2) as pool:  # two requests at a time
        jobs = [pool.submit(run, name, f"{name}-{i}") for i in range(requests) for name in WORKFLOWS]
        for job in jobs:
            job.result()
    provider.force_flush()
    provider.shutdown()
    spans = sorted(memory.get_finished_spans(), key=lambda s: (s.start_time or 0, s.context.span_id if s.context else 0))
    with (out / "spans.pb").open("wb") as handle:
        for first in range(0, len(spans), SPANS_PER_MESSAGE):
            message = encode_spans(spans[first:first + SPANS_PER_MESSAGE]).SerializeToString()
            handle.write(len(message).to_bytes(4, "big") + message)
    (out / "truth.json").write_text(json.dumps(truth.calls))


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[1] not in CASES:
        sys.exit(f"usage: {sys.argv[0]} {{{','.join(CASES)}}} URLS_JSON OUT_DIR [REQUESTS]")
    main(sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) == 5 else 3)
