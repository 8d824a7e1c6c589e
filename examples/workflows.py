"""Example agentic workflows as real programs: LangGraph graphs calling LLMs with the `openai` client.

All take the proxy's URL and call each LLM through its path prefix (`<proxy>/<llm>/v1`). Every
workflow request gets a fresh id, sent as `X-Workflow-Id` with the workflow's name as
`X-Workflow-Name` on each of its calls, which is how the proxy groups calls into requests.

Beam search (the paper's Fig. 1). The generator proposes `expansions` next steps for each of the
`beam_width` active beams, all at once (a LangGraph `Send` fan-out); the verifier scores every
proposed step, all at once; the best `beam_width` candidates survive. A beam ends when its step
mentions "answer" (data dependent, so requests differ in length) or after `max_steps` steps.

Judge ensemble (a fan-out across different LLMs). Every judge answers the question at the same time
(a `Send` per judge); the aggregator then reads all answers and gives a verdict. The judges run
side by side, so `scepsy aggregate` reports a critical-path share below 1 for them.

RAG. The embedder embeds the question, the closest `retrieve_k` documents of a small in-memory
corpus (embedded once per runner, under the id `<runner>-index`) are reranked by the reranker
(`/v1/rerank`, the Jina/Cohere format vLLM serves), and the generator answers from the top `top_n`.
"""

from __future__ import annotations

import concurrent.futures
import math
import operator
import random
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Annotated, Any, TypedDict

import openai
from langgraph.graph import END, START, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.types import Send

QUESTIONS = (
    "A farmer has 17 sheep and all but 9 run away. How many sheep are left?",
    "Tom has 3 boxes with 4 apples each. He eats 2 apples. How many apples remain?",
    "A train travels 60 km in 1.5 hours. What is its average speed in km per hour?",
    "What is the sum of the first five odd numbers?",
    "If 5 pencils cost 2 dollars, how much do 20 pencils cost?",
    "A rectangle is 7 cm long and 3 cm wide. What is its area?",
    "Sara reads 12 pages a day. How many days does a 96 page book take?",
    "What is 15 percent of 80?",
)

CORPUS = (
    "Beam search keeps the best k partial solutions at every step and expands only those.",
    "A verifier model scores each reasoning step so that weak branches can be pruned early.",
    "Retrieval-augmented generation looks up relevant documents before the model answers.",
    "Embedding models map text to vectors; similar texts get vectors with a high cosine similarity.",
    "A reranker reads the query together with each candidate document and scores their relevance.",
    "Tensor parallelism splits each layer of a model across GPUs connected by a fast interconnect.",
    "GPU fractions let several small models share one GPU, each with a slice of its memory and compute.",
    "The Aggregate LLM Pipeline predicts workflow latency from per-LLM invocation counts and profiles.",
    "Kubernetes schedules pods onto nodes; device plugins expose GPUs to the scheduler.",
    "Continuous batching lets an inference engine add new requests to a running batch at every step.",
    "Prefix caching reuses the key-value cache of a shared prompt prefix across requests.",
    "Poisson arrivals have exponentially distributed gaps between consecutive requests.",
)


def _client(proxy_url: str, llm: str, api_key: str, timeout_s: float) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{proxy_url.rstrip('/')}/{llm}/v1", api_key=api_key, max_retries=0, timeout=timeout_s)


def _headers(workflow: str, workflow_id: str) -> dict[str, str]:
    return {"X-Workflow-Id": workflow_id, "X-Workflow-Name": workflow}


@dataclass(frozen=True)
class RequestResult:
    workflow_id: str
    latency_s: float
    answer: str
    calls: int
    error: str | None = None


# Every node reads the whole state (the `...State` TypedDicts: LangGraph's channels, all set by the
# time the node runs) and returns only the keys it changes, which LangGraph merges into the state
Update = dict[str, Any]


# ----------------------------------------------------------------------------------------------
# Beam search


class Candidate(TypedDict):
    beam: int
    step: int
    steps: list[str]
    text: str
    score: float
    done: bool


class BeamState(TypedDict):
    workflow_id: str
    question: str
    seed: int
    step: int
    beams: list[Candidate]
    proposals: Annotated[list[Candidate], operator.add]
    scored: Annotated[list[Candidate], operator.add]
    calls: Annotated[int, operator.add]


@dataclass
class BeamSearch:
    """The beam-search workflow; `run(question)` executes one workflow request."""

    proxy_url: str
    generator: str = "gen"
    verifier: str = "ver"
    beam_width: int = 2
    expansions: int = 2
    max_steps: int = 3
    gen_max_tokens: int = 16
    ver_max_tokens: int = 1
    temperature: float = 0.8
    api_key: str = "scepsy-example"
    timeout_s: float = 300.0
    name: str = "beam"
    _graph: CompiledStateGraph = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.gen = _client(self.proxy_url, self.generator, self.api_key, self.timeout_s)
        self.ver = _client(self.proxy_url, self.verifier, self.api_key, self.timeout_s)
        self._graph = self._build()

    # nodes --------------------------------------------------------------------------------------
    def _start(self, state: BeamState) -> Update:
        root = Candidate(beam=0, step=0, steps=[], text="", score=0.0, done=False)
        return {"step": 0, "beams": [root]}

    def _fan_out_generate(self, state: BeamState) -> list[Send]:
        sends = []
        for b, beam in enumerate(b for b in state["beams"] if not b["done"]):
            for k in range(self.expansions):
                sends.append(Send("generate", {**state, "beams": [beam], "seed": state["seed"] * 1000 + state["step"] * 100 + b * 10 + k}))
        return sends

    def _generate(self, state: BeamState) -> Update:
        beam = state["beams"][0]
        so_far = "\n".join(beam["steps"]) or "-"
        response = self.gen.chat.completions.create(
            model=self.generator,
            messages=[
                {"role": "system", "content": "Solve it step by step. Say 'the answer is' at the end."},
                {"role": "user", "content": f"Q: {state['question']}\nSteps:\n{so_far}\nNext step:"},
            ],
            max_tokens=self.gen_max_tokens,
            temperature=self.temperature,
            seed=state["seed"],
            stop=["\n\n"],
            extra_headers=_headers(self.name, state["workflow_id"]),
        )
        text = (response.choices[0].message.content or "").strip()
        steps = beam["steps"] + [text]
        done = "answer" in text.lower() or state["step"] + 1 >= self.max_steps
        proposal = Candidate(beam=beam["beam"], step=state["step"] + 1, steps=steps, text=text, score=0.0, done=done)
        return {"proposals": [proposal], "calls": 1}

    def _fan_out_verify(self, state: BeamState) -> list[Send]:
        current = [p for p in state["proposals"] if p["step"] == state["step"] + 1]
        return [Send("verify", {**state, "proposals": [p]}) for p in current]

    def _verify(self, state: BeamState) -> Update:
        proposal = state["proposals"][-1]
        response = self.ver.chat.completions.create(
            model=self.verifier,
            messages=[
                {"role": "user", "content": f"Q: {state['question']}\nSteps:\n" + "\n".join(proposal["steps"]) + "\nRate the last step 1-10:"},
            ],
            max_tokens=self.ver_max_tokens,
            temperature=0.0,
            extra_headers=_headers(self.name, state["workflow_id"]),
        )
        match = re.search(r"\d+", response.choices[0].message.content or "")
        score = min(float(match.group()), 10.0) if match else 5.0
        return {"scored": [{**proposal, "score": score}], "calls": 1}

    def _select(self, state: BeamState) -> Update:
        step = state["step"] + 1
        current = [c for c in state["scored"] if c["step"] == step]
        kept_done = [b for b in state["beams"] if b["done"]]
        ranked = sorted(current + kept_done, key=lambda c: (-c["score"], len(c["text"]), c["text"]))
        beams = [{**c, "beam": i} for i, c in enumerate(ranked[: self.beam_width])]
        return {"step": step, "beams": beams}

    def _continue(self, state: BeamState) -> str:
        return END if all(b["done"] for b in state["beams"]) else "expand"

    def _build(self):
        graph = StateGraph(BeamState)
        graph.add_node("start", self._start)
        graph.add_node("expand", lambda state: {})
        graph.add_node("generate", self._generate)
        graph.add_node("gather", lambda state: {})
        graph.add_node("verify", self._verify)
        graph.add_node("select", self._select)
        graph.add_edge(START, "start")
        graph.add_edge("start", "expand")
        graph.add_conditional_edges("expand", self._fan_out_generate, ["generate"])
        graph.add_edge("generate", "gather")
        graph.add_conditional_edges("gather", self._fan_out_verify, ["verify"])
        graph.add_edge("verify", "select")
        graph.add_conditional_edges("select", self._continue, ["expand", END])
        return graph.compile()

    def run(self, question: str, seed: int = 0, workflow_id: str | None = None) -> RequestResult:
        workflow_id = workflow_id or uuid.uuid4().hex
        start = time.perf_counter()
        state = self._graph.invoke(
            {"workflow_id": workflow_id, "question": question, "seed": seed, "proposals": [], "scored": [], "calls": 0},
            {"recursion_limit": 20 + 8 * self.max_steps, "max_concurrency": self.beam_width * self.expansions},
        )
        best = max(state["beams"], key=lambda c: c["score"])
        return RequestResult(workflow_id, time.perf_counter() - start, "\n".join(best["steps"]), state["calls"])


# ----------------------------------------------------------------------------------------------
# RAG


class RagState(TypedDict):
    workflow_id: str
    question: str
    query_vector: list[float]
    candidates: list[int]
    ranked: list[int]
    answer: str
    calls: Annotated[int, operator.add]


def _vector(data) -> list[float]:
    """An embedding; engines that return one vector per token (no pooling) are mean-pooled here."""
    if data and isinstance(data[0], list):
        width = len(data[0])
        return [sum(row[i] for row in data) / len(data) for i in range(width)]
    return list(data)


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else 0.0


@dataclass
class Rag:
    """RAG with an embedder, a reranker and a generator; `run(question)` is one workflow request."""

    proxy_url: str
    embedder: str = "emb"
    reranker: str = "rerank"
    generator: str = "gen"
    retrieve_k: int = 4
    top_n: int = 2
    gen_max_tokens: int = 24
    corpus: tuple[str, ...] = CORPUS
    api_key: str = "scepsy-example"
    timeout_s: float = 300.0
    name: str = "rag"
    _graph: CompiledStateGraph = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.emb = _client(self.proxy_url, self.embedder, self.api_key, self.timeout_s)
        self.rerank_client = _client(self.proxy_url, self.reranker, self.api_key, self.timeout_s)
        self.gen = _client(self.proxy_url, self.generator, self.api_key, self.timeout_s)
        self._index: list[list[float]] | None = None
        self._index_lock = threading.Lock()
        self._graph = self._build()

    def index(self) -> list[list[float]]:
        with self._index_lock:
            if self._index is None:
                response = self.emb.embeddings.create(
                    model=self.embedder, input=list(self.corpus),
                    extra_headers=_headers(f"{self.name}-index", uuid.uuid4().hex),
                )
                self._index = [_vector(item.embedding) for item in sorted(response.data, key=lambda d: d.index)]
            return self._index

    def _embed(self, state: RagState) -> Update:
        response = self.emb.embeddings.create(
            model=self.embedder, input=state["question"], extra_headers=_headers(self.name, state["workflow_id"])
        )
        return {"query_vector": _vector(response.data[0].embedding), "calls": 1}

    def _retrieve(self, state: RagState) -> Update:
        index = self.index()
        scores = [(-_cosine(state["query_vector"], doc), i) for i, doc in enumerate(index)]
        return {"candidates": [i for _, i in sorted(scores)[: self.retrieve_k]]}

    def _rerank(self, state: RagState) -> Update:
        documents = [self.corpus[i] for i in state["candidates"]]
        response = self.rerank_client.post(
            "/rerank",
            cast_to=object,
            body={"model": self.reranker, "query": state["question"], "documents": documents, "top_n": self.top_n},
            options={"headers": _headers(self.name, state["workflow_id"])},
        )
        if not isinstance(response, dict):
            raise TypeError(f"/rerank answered {type(response).__name__}, not a JSON object")
        results = sorted(response["results"], key=lambda r: (-r["relevance_score"], r["index"]))
        return {"ranked": [state["candidates"][r["index"]] for r in results[: self.top_n]], "calls": 1}

    def _generate(self, state: RagState) -> Update:
        context = "\n".join(f"- {self.corpus[i]}" for i in state["ranked"])
        response = self.gen.chat.completions.create(
            model=self.generator,
            messages=[
                {"role": "system", "content": "Answer briefly using the context."},
                {"role": "user", "content": f"Context:\n{context}\nQuestion: {state['question']}"},
            ],
            max_tokens=self.gen_max_tokens,
            temperature=0.0,
            extra_headers=_headers(self.name, state["workflow_id"]),
        )
        return {"answer": response.choices[0].message.content or "", "calls": 1}

    def _build(self):
        graph = StateGraph(RagState)
        graph.add_node("embed", self._embed)
        graph.add_node("retrieve", self._retrieve)
        graph.add_node("rerank", self._rerank)
        graph.add_node("generate", self._generate)
        graph.add_edge(START, "embed")
        graph.add_edge("embed", "retrieve")
        graph.add_edge("retrieve", "rerank")
        graph.add_edge("rerank", "generate")
        graph.add_edge("generate", END)
        return graph.compile()

    def run(self, question: str, seed: int = 0, workflow_id: str | None = None) -> RequestResult:
        workflow_id = workflow_id or uuid.uuid4().hex
        self.index()
        start = time.perf_counter()
        state = self._graph.invoke({"workflow_id": workflow_id, "question": question, "calls": 0})
        return RequestResult(workflow_id, time.perf_counter() - start, state["answer"], state["calls"])


# ----------------------------------------------------------------------------------------------
# Judge ensemble (a fan-out across LLMs)


class EnsembleState(TypedDict):
    workflow_id: str
    question: str
    seed: int
    judge: str
    answers: Annotated[list[tuple[str, str]], operator.add]  # (judge, answer)
    verdict: str
    calls: Annotated[int, operator.add]


@dataclass
class JudgeEnsemble:
    """Several different LLMs answer the question side by side (a LangGraph `Send` to each judge,
    which run concurrently), then the aggregator reads every answer and gives the verdict; the
    program `ensemble` of models/simulation/programs.py. `run(question)` is one workflow request."""

    proxy_url: str
    judges: tuple[str, ...] = ("judge-a", "judge-b", "judge-c")
    aggregator: str = "aggregator"
    answer_max_tokens: int = 24
    verdict_max_tokens: int = 16
    temperature: float = 0.7
    api_key: str = "scepsy-example"
    timeout_s: float = 300.0
    name: str = "ensemble"
    _graph: CompiledStateGraph = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.clients = {j: _client(self.proxy_url, j, self.api_key, self.timeout_s) for j in self.judges}
        self.agg = _client(self.proxy_url, self.aggregator, self.api_key, self.timeout_s)
        self._graph = self._build()

    def _fan_out(self, state: EnsembleState) -> list[Send]:
        return [Send("judge", {**state, "judge": j, "seed": state["seed"] * 10 + k}) for k, j in enumerate(self.judges)]

    def _judge(self, state: EnsembleState) -> Update:
        judge = state["judge"]
        response = self.clients[judge].chat.completions.create(
            model=judge,
            messages=[{"role": "user", "content": f"Answer briefly: {state['question']}"}],
            max_tokens=self.answer_max_tokens,
            temperature=self.temperature,
            seed=state["seed"],
            extra_headers=_headers(self.name, state["workflow_id"]),
        )
        return {"answers": [(judge, (response.choices[0].message.content or "").strip())], "calls": 1}

    def _aggregate(self, state: EnsembleState) -> Update:
        answers = "\n".join(f"{judge}: {answer}" for judge, answer in sorted(state["answers"]))
        response = self.agg.chat.completions.create(
            model=self.aggregator,
            messages=[{"role": "user", "content": f"Q: {state['question']}\nAnswers:\n{answers}\nWhich answer is right?"}],
            max_tokens=self.verdict_max_tokens,
            temperature=0.0,
            extra_headers=_headers(self.name, state["workflow_id"]),
        )
        return {"verdict": response.choices[0].message.content or "", "calls": 1}

    def _build(self):
        graph = StateGraph(EnsembleState)
        graph.add_node("judge", self._judge)
        graph.add_node("aggregate", self._aggregate)
        graph.add_conditional_edges(START, self._fan_out, ["judge"])
        graph.add_edge("judge", "aggregate")
        graph.add_edge("aggregate", END)
        return graph.compile()

    def run(self, question: str, seed: int = 0, workflow_id: str | None = None) -> RequestResult:
        workflow_id = workflow_id or uuid.uuid4().hex
        start = time.perf_counter()
        state = self._graph.invoke(
            {"workflow_id": workflow_id, "question": question, "seed": seed, "answers": [], "calls": 0},
            {"max_concurrency": len(self.judges)},
        )
        return RequestResult(workflow_id, time.perf_counter() - start, state["verdict"], state["calls"])


# ----------------------------------------------------------------------------------------------
# Load generation


def _request_template(i: int, seed: int, distinct: int | None, questions) -> tuple[str, int]:
    """Request i's (question, sampling seed): request i repeats request i mod `distinct`."""
    j = i % distinct if distinct else i
    return questions[j % len(questions)], seed * 10_000 + j


def run_open_loop(workflow, rate_rps: float, count: int, seed: int = 0, questions=QUESTIONS,
                  questions_per_seed: int | None = None, arrivals: str = "poisson") -> list[RequestResult]:
    """Start `count` workflow requests as a Poisson process of `rate_rps` (seeded; or 1 / rate_rps
    apart with `arrivals="uniform"`); wait for all.

    Request i asks questions[j % len(questions)] with sampling seed `seed * 10000 + j`, where
    j = i mod `questions_per_seed` (or i): the same (question, seed) pairs as `run_closed_loop`.
    Requests run in threads (each a LangGraph invocation with its own fan-out), so a slow request
    never delays the next arrival. A request that fails is returned with its error, not raised.
    """
    rng = random.Random(seed)
    if arrivals not in ("poisson", "uniform"):
        raise ValueError(f"unknown arrival process {arrivals!r}; use poisson or uniform")
    times, t = [], 0.0
    for _ in range(count):
        times.append(t)
        t += rng.expovariate(rate_rps) if arrivals == "poisson" else 1.0 / rate_rps

    def one(i: int) -> RequestResult:
        workflow_id = f"{workflow.name}-{seed}-{i}"
        question, request_seed = _request_template(i, seed, questions_per_seed, questions)
        try:
            return workflow.run(question, seed=request_seed, workflow_id=workflow_id)
        except Exception as exc:  # noqa: BLE001 - reported per request
            return RequestResult(workflow_id, math.nan, "", 0, f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(4, count)) as pool:
        futures = []
        for i, arrival in enumerate(times):
            delay = start + arrival - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            futures.append(pool.submit(one, i))
        return [f.result() for f in futures]


def run_closed_loop(workflow, count: int, seed: int = 0, questions=QUESTIONS) -> list[RequestResult]:
    """Run `count` workflow requests one after the other (tracing at light load)."""
    results = []
    for i in range(count):
        question, request_seed = _request_template(i, seed, None, questions)
        results.append(workflow.run(question, seed=request_seed, workflow_id=f"{workflow.name}-trace-{seed}-{i}"))
    return results
