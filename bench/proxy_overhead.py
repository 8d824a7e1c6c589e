"""Latency the tracing proxy adds, against going direct; and that it loses no record under load.

Three processes on loopback: a scripted OpenAI-compatible upstream (streams `--tokens` SSE events
`--token-delay-s` apart), the proxy (recording to a SQLite store, bodies on), and this client
(httpx, asyncio). For each scenario the same requests go direct and through the proxy, in
alternating rounds; per request we measure the time to the first byte (TTFB) and to the last
byte (total). Reported: medians and p99 of both paths, their differences (the added latency) and
ratios. Targets: added median < 1 ms, added p99 < 5 ms, zero lost records.

The proxy's CPU time per request (from /proc) is reported too: unlike latency it does not depend
on what else runs on the machine.

Scenarios: `sequential` (one request at a time: the proxy's own per-request cost) and
`concurrent` (`--streams` streams at once, 200 by default: the cost under load, where a Python
proxy shares 2 cores with the upstream and the client).

    python bench/proxy_overhead.py [--streams 200] [--rounds 3] [--json out/proxy_overhead.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

HERE = Path(__file__).resolve()


def _serve_upstream(port: int, token_delay_s: float) -> None:
    import uvicorn

    from scepsy.tracing.scripted import ScriptedEngine

    uvicorn.run(ScriptedEngine(token_delay_s=token_delay_s).app(), host="127.0.0.1", port=port, log_level="warning", access_log=False)


def _serve_proxy(port: int, upstream: str, store_path: str) -> None:
    from scepsy.tracing.proxy import ProxyConfig, serve
    from scepsy.tracing.store import TraceStore

    store = TraceStore(store_path)
    try:
        serve(ProxyConfig({"gen": upstream}, store=store), host="127.0.0.1", port=port)
    finally:
        store.close()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start(args: list[str], url: str) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, str(HERE), *args], stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            httpx.get(url + "/v1/models", timeout=1)
            return process
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server {args} did not start")


async def _one(client: httpx.AsyncClient, url: str, body: dict) -> tuple[float, float]:
    start = time.perf_counter()
    first = None
    async with client.stream("POST", url, json=body) as response:
        async for chunk in response.aiter_raw():
            if first is None and chunk:
                first = time.perf_counter() - start
    return first, time.perf_counter() - start


async def _batch(url: str, body: dict, count: int, concurrent: bool) -> list[tuple[float, float]]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await _one(client, url, body)  # warm the connection pool
        if concurrent:
            return list(await asyncio.gather(*(_one(client, url, body) for _ in range(count))))
        return [await _one(client, url, body) for _ in range(count)]


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc), to report the proxy's own cost."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _stats(samples: list[float]) -> dict:
    values = np.asarray(samples) * 1000
    return {"median_ms": float(np.median(values)), "p99_ms": float(np.percentile(values, 99)), "mean_ms": float(values.mean())}


def run(streams: int, rounds: int, tokens: int, token_delay_s: float, sequential: int) -> dict:
    upstream_port, proxy_port = _free_port(), _free_port()
    upstream_url, proxy_url = f"http://127.0.0.1:{upstream_port}", f"http://127.0.0.1:{proxy_port}"
    with tempfile.TemporaryDirectory() as tmp:
        store_path = str(Path(tmp) / "traces.db")
        upstream = _start(["--serve-upstream", str(upstream_port), str(token_delay_s)], upstream_url)
        proxy = _start(["--serve-proxy", str(proxy_port), upstream_url, store_path], proxy_url)
        body = {"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens, "stream": True}
        sent = 2 * rounds  # the warm-up requests
        results: dict[str, dict[str, list]] = {}
        cpu_ms: dict[str, dict[str, float]] = {}
        try:
            for scenario, count, concurrent in (("sequential", sequential, False), ("concurrent", streams, True)):
                paths = {"direct": [], "proxy": []}
                cpu = {"direct": 0.0, "proxy": 0.0}
                for _ in range(rounds):
                    before = _cpu_s(upstream.pid)
                    paths["direct"] += asyncio.run(_batch(upstream_url + "/v1/chat/completions", body, count, concurrent))
                    cpu["direct"] += _cpu_s(upstream.pid) - before
                    before = _cpu_s(proxy.pid)
                    paths["proxy"] += asyncio.run(_batch(proxy_url + "/v1/chat/completions", body, count, concurrent))
                    cpu["proxy"] += _cpu_s(proxy.pid) - before
                    sent += count
                results[scenario] = paths
                cpu_ms[scenario] = {"upstream_cpu_ms_per_request": 1000 * cpu["direct"] / (rounds * (count + 1)),
                                    "proxy_cpu_ms_per_request": 1000 * cpu["proxy"] / (rounds * (count + 1))}
            sent += rounds  # sequential and concurrent warm-ups through the proxy
        finally:
            proxy.terminate()
            proxy.wait(timeout=30)
            upstream.terminate()
            upstream.wait(timeout=30)
        import sqlite3

        with sqlite3.connect(store_path) as connection:
            recorded = connection.execute("SELECT COUNT(*), SUM(outcome = 'ok') FROM calls").fetchone()
    proxied_requests = rounds * (sequential + streams) + 2 * rounds
    report = {"settings": {"streams": streams, "rounds": rounds, "tokens": tokens, "token_delay_s": token_delay_s,
                           "sequential_requests": sequential},
              "proxied_requests": proxied_requests, "records": recorded[0], "records_ok": recorded[1],
              "lost_records": proxied_requests - recorded[0]}
    for scenario, paths in results.items():
        entry = {}
        for metric, index in (("ttfb", 0), ("total", 1)):
            direct = _stats([s[index] for s in paths["direct"]])
            proxied = _stats([s[index] for s in paths["proxy"]])
            entry[metric] = {
                "direct": direct,
                "proxy": proxied,
                "added_median_ms": proxied["median_ms"] - direct["median_ms"],
                "added_p99_ms": proxied["p99_ms"] - direct["p99_ms"],
                "ratio_median": proxied["median_ms"] / direct["median_ms"],
                "ratio_p99": proxied["p99_ms"] / direct["p99_ms"],
            }
        entry.update(cpu_ms[scenario])
        report[scenario] = entry
    return report


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve-upstream":
        _serve_upstream(int(argv[1]), float(argv[2]))
        return 0
    if argv and argv[0] == "--serve-proxy":
        _serve_proxy(int(argv[1]), argv[2], argv[3])
        return 0
    parser = argparse.ArgumentParser(description="Added latency of the tracing proxy")
    parser.add_argument("--streams", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=20)
    parser.add_argument("--token-delay-s", type=float, default=0.01)
    parser.add_argument("--sequential", type=int, default=100)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run(args.streams, args.rounds, args.tokens, args.token_delay_s, args.sequential)
    for scenario in ("sequential", "concurrent"):
        for metric in ("ttfb", "total"):
            e = report[scenario][metric]
            print(f"{scenario:10s} {metric:5s} direct median {e['direct']['median_ms']:8.2f} ms p99 {e['direct']['p99_ms']:8.2f} ms | "
                  f"proxy median {e['proxy']['median_ms']:8.2f} ms p99 {e['proxy']['p99_ms']:8.2f} ms | "
                  f"added median {e['added_median_ms']:+7.2f} ms p99 {e['added_p99_ms']:+7.2f} ms | "
                  f"ratio median {e['ratio_median']:.3f} p99 {e['ratio_p99']:.3f}")
        e = report[scenario]
        print(f"{scenario:10s} cpu   proxy {e['proxy_cpu_ms_per_request']:.2f} ms per request "
              f"(the scripted upstream: {e['upstream_cpu_ms_per_request']:.2f} ms)")
    print(f"records: {report['records']} of {report['proxied_requests']} proxied requests ({report['lost_records']} lost)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0 if report["lost_records"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
