"""The example workflows (LangGraph + openai) through the proxy: tagged calls, known structure."""

from __future__ import annotations

import pytest

from scepsy.tracing.statistics.stats import aggregate
from examples.workflows import BeamSearch, Rag, run_open_loop

from tracing_fixtures import Recorder, engine, proxied, wait_for  # noqa: F401 - fixtures


def test_beam_search_structure_through_the_proxy(proxied):
    url, recorder, engine = proxied
    beam = BeamSearch(url, beam_width=2, expansions=2, max_steps=3)
    result = beam.run("What is 2 + 2?", seed=3, workflow_id="req-1")
    # the scripted generator never says "answer": 3 steps of 1x2, 2x2, 2x2 proposals, each verified
    assert result.calls == 20 and result.error is None
    wait_for(lambda: len(recorder.records) == 20)
    assert {r.workflow_id for r in recorder.records} == {"req-1"} and {r.workflow for r in recorder.records} == {"beam"}
    gen, ver = aggregate(recorder.records).workflow("beam").llms
    assert (gen.llm, gen.invocations, ver.llm, ver.invocations) == ("gen", 10, "ver", 10)
    assert 1.0 < gen.parallelism <= 4.0  # fan-outs of 2 and 4 calls run concurrently
    # verifier requests carry the proposed steps (the workflow's data flows between the LLMs)
    assert any(b"tok0" in r.request_body for r in recorder.records if r.llm == "ver")


def test_rag_structure_and_open_loop_runner(engine):

    from scepsy.tracing.capture.proxy import ProxyConfig, ServerThread, create_app

    recorder = Recorder()
    upstreams = {name: engine.url for name in ("emb", "rerank", "gen")}
    with ServerThread(create_app(ProxyConfig(upstreams, store=recorder))) as proxy:
        rag = Rag(proxy.url)
        results = run_open_loop(rag, rate_rps=20.0, count=4, seed=1)
        wait_for(lambda: len(recorder.records) == 13)
    assert all(r.error is None for r in results) and [r.workflow_id for r in results] == [f"rag-1-{i}" for i in range(4)]
    stats = aggregate(recorder.records)
    assert [w.name for w in stats.workflows] == ["rag", "rag-index"]
    rag_stats = stats.workflow("rag")
    assert rag_stats.requests == 4
    assert [(s.llm, s.invocations, s.parallelism) for s in rag_stats.llms] == [("emb", 1, 1), ("gen", 1, 1), ("rerank", 1, 1)]
    assert {r.path for r in recorder.records} == {"/v1/embeddings", "/v1/rerank", "/v1/chat/completions"}


def test_judge_ensemble_runs_judges_side_by_side(engine):
    """Three judges answer at once, the aggregator after them: the traced critical-path shares
    count the judges' overlap once (below 1), the aggregator in full; the serial RAG above keeps 1."""
    from scepsy.tracing.capture.proxy import ProxyConfig, ServerThread, create_app
    from examples.workflows import JudgeEnsemble
    from scepsy.models.instance.statistic import JITTER_SHARE

    recorder = Recorder()
    names = ("judge-a", "judge-b", "judge-c", "aggregator")
    with ServerThread(create_app(ProxyConfig({n: engine.url for n in names}, store=recorder))) as proxy:
        ensemble = JudgeEnsemble(proxy.url, answer_max_tokens=40, verdict_max_tokens=48)
        results = [ensemble.run("What is 2 + 2?", seed=i, workflow_id=f"e-{i}") for i in range(3)]
        wait_for(lambda: len(recorder.records) == 12)
    assert all(r.error is None and r.calls == 4 for r in results)
    stats = aggregate(recorder.records).workflow("ensemble")
    shares = {s.llm: s.critical_path for s in stats.llms}
    assert shares["aggregator"] == pytest.approx(1.0, abs=1e-9)  # it waits for no other LLM
    judges = [shares[j] for j in names[:3]]
    assert all(0 < f < 0.9 for f in judges), shares  # the judges overlap: each waits on a part of its time
    # the aggregator starts once every judge has answered (it reads every answer); the proxy stamps
    # a call's end just after its last byte, which may be a hair after the next call starts
    for rid in ("e-0", "e-1", "e-2"):
        calls = [r for r in recorder.records if r.workflow_id == rid]
        judges_calls = [r for r in calls if r.llm != "aggregator"]
        agg = next(r for r in calls if r.llm == "aggregator")
        assert agg.start_s >= max(r.start_s for r in judges_calls)
        assert max(r.end_s for r in judges_calls) - agg.start_s <= JITTER_SHARE * (agg.end_s - agg.start_s)
