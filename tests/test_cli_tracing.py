"""The measurement commands end to end through the CLI (typer's runner, real servers on loopback)."""

from __future__ import annotations

import json

import yaml
from typer.testing import CliRunner

from scepsy.cli import app
from scepsy.models.instance.profile import load_profile
from scepsy.tracing.capture.proxy import ServerThread
from support.scripted import ScriptedEngine
from scepsy.tracing.capture.store import write_store

from test_benchimport import SGLANG, VLLM_NEW
from test_replay import beam_trace
from tracing_fixtures import wait_for

runner = CliRunner()


def test_aggregate_and_export(tmp_path):
    write_store(tmp_path / "t.db", beam_trace(3))
    result = runner.invoke(app, ["aggregate", str(tmp_path / "t.db"), "--out", str(tmp_path / "stats.yaml")])
    assert result.exit_code == 0, result.output
    assert "p_pooled" in result.output
    stats = yaml.safe_load((tmp_path / "stats.yaml").read_text())
    assert stats["workflows"][0]["stages"][0] == {"llm": "gen", "invocations": 4.0, "parallelism": stats["workflows"][0]["stages"][0]["parallelism"]}
    as_json = json.loads(runner.invoke(app, ["aggregate", str(tmp_path / "t.db"), "--json"]).output)
    assert as_json["workflows"][0]["name"] == "wf"
    result = runner.invoke(app, ["traces", "export", str(tmp_path / "t.db"), "--format", "parquet", "--out", str(tmp_path / "t.parquet")])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["aggregate", str(tmp_path / "t.parquet"), "--json"]).output == runner.invoke(app, ["aggregate", str(tmp_path / "t.db"), "--json"]).output


def test_profile_command_writes_core_rows(tmp_path):
    write_store(tmp_path / "t.db", beam_trace(3, scale=0.1))
    engine = ScriptedEngine(token_delay_s=0.005)
    with ServerThread(engine.app()) as server:
        result = runner.invoke(app, ["profile", "--traces", str(tmp_path / "t.db"), "--llm", "gen", "--endpoint", server.url,
                                     "--gpu-type", "cpu", "--tp", "1", "--fraction", "0.5", "--rates", "20,40",
                                     "--duration-s", "0.5", "--min-requests", "3", "--out", str(tmp_path / "p.csv"), "--json"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.output)["points"]
    assert len(points) == 2 and all(not p["saturated"] and p["failed"] == 0 for p in points)
    profile = load_profile(tmp_path / "p.csv")
    assert profile.configurations() == [("cpu", 1)]
    assert len(profile.curves[("cpu", 1)][0].rates_rps) == 2


def test_profiles_import(tmp_path):
    (tmp_path / "v.json").write_text(json.dumps(VLLM_NEW))
    (tmp_path / "s.jsonl").write_text(json.dumps(SGLANG) + "\n")
    out = tmp_path / "p.csv"
    result = runner.invoke(app, ["profiles", "import", str(tmp_path / "v.json"), str(tmp_path / "s.jsonl"), "--gpu-type", "H100", "--tp", "1", "--fraction", "1.0", "--out", str(out)])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["profiles", "import", str(tmp_path / "v.json"), "--gpu-type", "H100", "--tp", "2", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert load_profile(out).configurations() == [("H100", 1), ("H100", 2)]
    assert out.read_text().splitlines()[0] == "gpu_type,tp,fraction,arrival_rate,throughput,latency_mean,latency_p50,latency_p90,latency_p99"


def test_bad_input_gets_one_line_and_exit_2(tmp_path):
    cases = [
        ["proxy", "--upstream", "gen"],
        ["proxy", "--upstream", "gen=ftp://x"],
        ["aggregate", str(tmp_path / "missing.db")],
        ["traces", "export", str(tmp_path / "missing.db"), "--out", str(tmp_path / "x"), "--format", "csv"],
        ["profile", "--traces", str(tmp_path / "missing.db"), "--llm", "gen", "--endpoint", "http://127.0.0.1:9",
         "--gpu-type", "cpu", "--out", str(tmp_path / "p.csv"), "--rates", "1,-2"],
        ["profiles", "import", str(tmp_path / "missing.json"), "--gpu-type", "A", "--out", str(tmp_path / "p.csv")],
    ]
    for args in cases:
        result = runner.invoke(app, args)
        assert result.exit_code == 2, (args, result.output)
        assert "Traceback" not in result.output
    write_store(tmp_path / "u.db", [c.__class__(**{**c.__dict__, "workflow_id": None}) for c in beam_trace(1)])
    result = runner.invoke(app, ["aggregate", str(tmp_path / "u.db")])
    assert result.exit_code == 2 and "X-Workflow-Id" in result.output


def _start_proxy_process(upstream_url: str, store):
    """`scepsy proxy` as a user runs it, in its own process; returns (process, url) once it answers."""
    import subprocess
    import sys

    import httpx

    from support.ports import free_port

    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "scepsy", "proxy", "--upstream", f"gen={upstream_url}", "--port", str(port), "--store", str(store)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"

    def answers() -> bool:
        try:
            return httpx.get(url + "/v1/models", timeout=0.5).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(answers, timeout_s=20)
    return process, url


def test_proxy_command_serves_records_and_shuts_down_cleanly(tmp_path):
    """`scepsy proxy` as a user runs it: a process on loopback; Ctrl-C flushes every record."""
    import signal

    import httpx

    from scepsy.tracing.capture.store import read_store

    engine = ScriptedEngine()
    with ServerThread(engine.app()) as server:
        store = tmp_path / "traces.db"
        process, url = _start_proxy_process(server.url, store)
        try:
            for i in range(5):
                response = httpx.post(url + "/v1/chat/completions", headers={"X-Workflow-Id": f"w{i}"},
                                      json={"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
                assert response.status_code == 200
        finally:
            process.send_signal(signal.SIGINT)
            _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err.decode()
    assert "recorded 5 calls" in err.decode()
    assert sorted(c.workflow_id or "" for c in read_store(store)) == [f"w{i}" for i in range(5)]


def test_proxy_terminated_mid_stream_finishes_the_streams_and_keeps_their_records(tmp_path):
    """SIGTERM (what Kubernetes sends) while streams are in flight: they complete and are all recorded.

    uvicorn drains the connections, then re-raises SIGTERM, which ends the process at once: the
    records must be written before that, not in a `finally` that never runs.
    """
    import asyncio
    import signal
    import threading

    import httpx

    from scepsy.tracing.capture.store import read_store

    engine = ScriptedEngine(token_delay_s=0.001)
    engine.gate = gate = threading.Event()  # every stream holds its tokens after the first until SIGTERM is sent
    with ServerThread(engine.app()) as server:
        store = tmp_path / "traces.db"
        process, url = _start_proxy_process(server.url, store)

        async def one(client: httpx.AsyncClient, i: int, first: asyncio.Queue) -> bytes:
            body = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "stream": True}
            chunks = []
            async with client.stream("POST", url + "/v1/chat/completions", json=body, headers={"X-Workflow-Id": f"w{i}"}) as response:
                async for chunk in response.aiter_raw():
                    if not chunks:
                        first.put_nowait(i)
                    chunks.append(chunk)
            return b"".join(chunks)

        async def streams_then_sigterm() -> list[bytes]:
            first: asyncio.Queue = asyncio.Queue()
            async with httpx.AsyncClient(timeout=60) as client:
                tasks = [asyncio.create_task(one(client, i, first)) for i in range(8)]
                for _ in range(8):  # every stream is in flight: its first bytes arrived, its tokens are held
                    await first.get()
                process.send_signal(signal.SIGTERM)
                gate.set()
                return await asyncio.gather(*tasks)

        try:
            bodies = asyncio.run(streams_then_sigterm())
        finally:
            process.communicate(timeout=20)
    assert all(body.rstrip().endswith(b"data: [DONE]") for body in bodies)
    records = list(read_store(store))
    assert sorted(c.workflow_id or "" for c in records) == [f"w{i}" for i in range(8)]
    assert all(c.outcome == "ok" and c.completion_tokens == 10 for c in records)
