"""Latency the tracing proxy adds to streams, against going direct; and that it loses no record.

Three processes on loopback: a lean streaming upstream (aiohttp; one SSE event per token, every
event stamped with the CLOCK_MONOTONIC nanosecond it was written), the proxy (`scepsy proxy`'s
server, recording to a SQLite store, bodies on) and this client (aiohttp). CLOCK_MONOTONIC is one
clock for every process of the machine, so the client measures, for every event, the time from the
upstream writing it to the client reading it: the *event delay*. The same load runs direct and
through the proxy in alternating phases; the proxy's added latency is the difference of the two
paths' medians and p99s. The time to first byte (TTFB, request sent to first byte read) is measured
the same way.

The load is steady, as in a serving system: `--streams` clients each send a request, read its
stream to the end and send the next, with their starts staggered over one stream's length; only
requests that start after a warm-up are measured. The token spacing is an engine's inter-token
latency at that batch size: by default the engine model's decode step of Llama-3.1-8B at batch
200 on an L40S, an A100-80G and an H100-SXM (62, 28 and 18 ms: 3,200, 7,100 and 11,000 events/s
for 200 streams).

Placement on the CPUs: a proxy is deployed on its own core(s), not on the cores of the engine and
of its clients. With `--pin` (the default when there are at least 2 CPUs) the proxy process gets
the last CPU and the upstream and the client share the others; direct phases leave the proxy's
CPU idle. `--no-pin` lets all three share every CPU (then the added latency also counts the
proxy's CPU time taken from the upstream and the client). The proxy's CPU use per phase is
reported from /proc: when it nears 1.0 (one core), one proxy process is the bottleneck and more
must run (one per core) behind the same store.

Targets: at 200 concurrent streams, added median < 1 ms and added p99 < 5 ms; no record
lost.

    python bench/proxy_overhead.py [--streams 1,200] [--token-delays-ms 62,28,18] [--phase-s 8]
                                   [--rounds 2] [--no-pin] [--json out/proxy_overhead.json]

`--requests-per-stream N` replaces the timed phases by counts (a warm-up request, then N measured
ones per stream), so that how many samples a run gets does not depend on the machine's speed
(tests/test_bench_proxy.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import paths  # noqa: F401, E402 - examples/ and tests/support/ on the import path

HERE = Path(__file__).resolve()
SENT = re.compile(rb'"sent_ns":(\d+)')
TARGET_MEDIAN_MS, TARGET_P99_MS = 1.0, 5.0


def _fast_loop() -> None:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


def _pin(cpus: set[int] | None) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)


# ---------------------------------------------------------------- upstream (a child process)

def _event(payload: dict) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def _serve_upstream(port: int, cpus: set[int] | None) -> None:
    """An OpenAI-style streaming endpoint: `max_tokens` events, `X-Token-Delay-Ms` apart."""
    from aiohttp import web

    _pin(cpus)
    _fast_loop()

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        tokens = int(body.get("max_tokens", 16))
        delay_s = float(request.headers.get("x-token-delay-ms", "20")) / 1000
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        start = loop.time()
        chunk = {"id": "bench", "object": "chat.completion.chunk", "model": body.get("model"),
                 "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}], "sent_ns": time.monotonic_ns()}
        await response.write(_event(chunk))
        for index in range(tokens):
            # absolute deadlines: a late event does not delay the ones after it
            await asyncio.sleep(max(0.0, start + (index + 1) * delay_s - loop.time()))
            chunk["choices"][0]["delta"] = {"content": f"tok{index} "}
            chunk["sent_ns"] = time.monotonic_ns()
            await response.write(_event(chunk))
        usage = {"id": "bench", "object": "chat.completion.chunk", "choices": [],
                 "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens}}
        await response.write(_event(usage) + b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "gen", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _serve_proxy(port: int, upstream: str, store_path: str, cpus: set[int] | None) -> None:
    from scepsy.tracing.capture.proxy import ProxyConfig, serve
    from scepsy.tracing.capture.store import TraceStore

    _pin(cpus)
    store = TraceStore(store_path)
    try:
        serve(ProxyConfig({"gen": upstream}, store=store), host="127.0.0.1", port=port)
    finally:
        store.close()


# ---------------------------------------------------------------- the client (this process)

@dataclass
class Samples:
    ttfb_ns: list[int] = field(default_factory=list)
    event_delay_ns: list[int] = field(default_factory=list)
    requests: int = 0  # every request sent, measured or not
    events: int = 0


async def _stream_forever(session, url: str, payload: bytes, headers: dict, offset_s: float, measure_from: float,
                          stop_at: float, samples: Samples, requests: int | None = None) -> None:
    """Requests one after the other: until `stop_at` (those starting from `measure_from` measured),
    or, with `requests`, one unmeasured warm-up request and then that many measured ones,
    whatever the time."""
    loop = asyncio.get_running_loop()
    await asyncio.sleep(offset_s)
    sent_count = 0
    while (sent_count < 1 + requests) if requests is not None else loop.time() < stop_at:
        measured = sent_count >= 1 if requests is not None else loop.time() >= measure_from
        sent_count += 1
        sent = time.monotonic_ns()
        first = None
        async with session.post(url, data=payload, headers=headers) as response:
            response.raise_for_status()
            async for chunk in response.content.iter_any():
                now = time.monotonic_ns()
                if first is None:
                    first = now
                stamps = SENT.findall(chunk)
                samples.events += len(stamps)
                if measured:
                    samples.event_delay_ns.extend(now - int(stamp) for stamp in stamps)
        samples.requests += 1
        if measured and first is not None:
            samples.ttfb_ns.append(first - sent)


async def _phase(url: str, streams: int, tokens: int, token_delay_ms: float, phase_s: float,
                 requests: int | None = None) -> Samples:
    import aiohttp

    stream_s = (tokens + 1) * token_delay_ms / 1000
    payload = json.dumps({"model": "gen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": tokens,
                          "stream": True}).encode()
    headers = {"Content-Type": "application/json", "X-Token-Delay-Ms": str(token_delay_ms)}
    samples = Samples()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        loop = asyncio.get_running_loop()
        begin = loop.time()
        warmup_s = stream_s + 0.5
        await asyncio.gather(*(
            _stream_forever(session, url, payload, headers, stream_s * i / streams, begin + warmup_s,
                            begin + warmup_s + phase_s, samples, requests)
            for i in range(streams)
        ))
    return samples


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process and its threads (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _start(args: list[str], url: str) -> subprocess.Popen:
    import httpx

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


def _summary_ms(values_ns: list[int]) -> dict:
    values = np.asarray(values_ns, dtype=float) / 1e6
    if values.size == 0:
        return {"median_ms": float("nan"), "p99_ms": float("nan"), "samples": 0}
    return {"median_ms": float(np.median(values)), "p99_ms": float(np.percentile(values, 99)), "samples": int(values.size)}


def _compare(direct: list[int], proxied: list[int]) -> dict:
    d, p = _summary_ms(direct), _summary_ms(proxied)
    return {"direct": d, "proxy": p, "added_median_ms": p["median_ms"] - d["median_ms"],
            "added_p99_ms": p["p99_ms"] - d["p99_ms"]}


def _cpu_sets(pin: bool) -> tuple[set[int] | None, set[int] | None]:
    """(proxy CPUs, upstream-and-client CPUs)."""
    cpus = sorted(os.sched_getaffinity(0))
    if not pin or len(cpus) < 2:
        return None, None
    return {cpus[-1]}, set(cpus[:-1])


def run(streams_list: list[int], delays_ms: list[float], tokens: int, phase_s: float, rounds: int, pin: bool,
        requests_per_stream: int | None = None) -> dict:
    proxy_cpus, other_cpus = _cpu_sets(pin)
    _pin(other_cpus)
    _fast_loop()
    from support.ports import free_port

    upstream_port, proxy_port = free_port(), free_port()
    upstream_url, proxy_url = f"http://127.0.0.1:{upstream_port}", f"http://127.0.0.1:{proxy_port}"
    scenarios = []
    proxied_requests = 0
    with tempfile.TemporaryDirectory() as tmp:
        store_path = str(Path(tmp) / "traces.db")
        cpu_arg = ",".join(map(str, sorted(other_cpus))) if other_cpus else "-"
        proxy_arg = ",".join(map(str, sorted(proxy_cpus))) if proxy_cpus else "-"
        upstream = _start(["--serve-upstream", str(upstream_port), cpu_arg], upstream_url)
        proxy = _start(["--serve-proxy", str(proxy_port), upstream_url, store_path, proxy_arg], proxy_url)
        try:
            for streams in streams_list:
                for delay_ms in delays_ms:
                    paths = {"direct": Samples(), "proxy": Samples()}
                    proxy_cpu_s = proxy_wall_s = 0.0
                    for _ in range(rounds):
                        for path, base in (("direct", upstream_url), ("proxy", proxy_url)):
                            cpu0, wall0 = _cpu_s(proxy.pid), time.monotonic()
                            got = asyncio.run(_phase(base + "/v1/chat/completions", streams, tokens, delay_ms, phase_s,
                                                     requests_per_stream))
                            if path == "proxy":
                                proxy_cpu_s += _cpu_s(proxy.pid) - cpu0
                                proxy_wall_s += time.monotonic() - wall0
                                proxied_requests += got.requests
                            paths[path].ttfb_ns += got.ttfb_ns
                            paths[path].event_delay_ns += got.event_delay_ns
                            paths[path].requests += got.requests
                            paths[path].events += got.events
                    events_per_s = streams * 1000 / delay_ms
                    scenarios.append({
                        "streams": streams, "token_delay_ms": delay_ms, "offered_events_per_s": events_per_s,
                        "ttfb": _compare(paths["direct"].ttfb_ns, paths["proxy"].ttfb_ns),
                        "event_delay": _compare(paths["direct"].event_delay_ns, paths["proxy"].event_delay_ns),
                        "proxy_cpu_cores": proxy_cpu_s / proxy_wall_s,
                        "proxy_cpu_us_per_event": 1e6 * proxy_cpu_s / max(1, paths["proxy"].events),
                    })
                    _print_scenario(scenarios[-1])
        finally:
            proxy.terminate()
            proxy.wait(timeout=60)
            upstream.terminate()
            upstream.wait(timeout=30)
        with sqlite3.connect(store_path) as connection:
            records, records_ok = connection.execute("SELECT COUNT(*), SUM(outcome = 'ok') FROM calls").fetchone()
    traced = proxied_requests  # the readiness probes ask /v1/models, which is passed on untraced
    return {
        "settings": {"streams": streams_list, "token_delays_ms": delays_ms, "tokens": tokens, "phase_s": phase_s,
                     "requests_per_stream": requests_per_stream, "rounds": rounds, "pinned": proxy_cpus is not None,
                     "proxy_cpus": sorted(proxy_cpus) if proxy_cpus else None,
                     "upstream_and_client_cpus": sorted(other_cpus) if other_cpus else None},
        "scenarios": scenarios,
        "traced_requests": traced, "records": records, "records_ok": records_ok, "lost_records": traced - records,
    }


def _print_scenario(s: dict) -> None:
    for metric in ("ttfb", "event_delay"):
        e = s[metric]
        print(f"{s['streams']:4d} streams {s['token_delay_ms']:5.1f} ms/token {metric:11s} "
              f"direct {e['direct']['median_ms']:7.3f} / {e['direct']['p99_ms']:7.3f} ms  "
              f"proxy {e['proxy']['median_ms']:7.3f} / {e['proxy']['p99_ms']:7.3f} ms  "
              f"added median {e['added_median_ms']:+7.3f} ms p99 {e['added_p99_ms']:+7.3f} ms "
              f"({e['proxy']['samples']} samples)", flush=True)
    print(f"{s['streams']:4d} streams {s['token_delay_ms']:5.1f} ms/token proxy cpu {s['proxy_cpu_cores']:.2f} cores, "
          f"{s['proxy_cpu_us_per_event']:.0f} us per event ({s['offered_events_per_s']:.0f} events/s offered)", flush=True)


def _meets_targets(report: dict) -> bool:
    ok = report["lost_records"] == 0
    for s in report["scenarios"]:
        for metric in ("ttfb", "event_delay"):
            e = s[metric]
            ok = ok and e["added_median_ms"] < TARGET_MEDIAN_MS and e["added_p99_ms"] < TARGET_P99_MS
    return ok


def _cpus(text: str) -> set[int] | None:
    return None if text == "-" else {int(c) for c in text.split(",")}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--serve-upstream":
        _serve_upstream(int(argv[1]), _cpus(argv[2]))
        return 0
    if argv and argv[0] == "--serve-proxy":
        _serve_proxy(int(argv[1]), argv[2], argv[3], _cpus(argv[4]))
        return 0
    parser = argparse.ArgumentParser(description="Latency the tracing proxy adds to streams")
    parser.add_argument("--streams", default="1,200", help="concurrent streams, comma-separated")
    parser.add_argument("--token-delays-ms", default="62,28,18", help="inter-token latencies, comma-separated")
    parser.add_argument("--tokens", type=int, default=64, help="tokens per response")
    parser.add_argument("--phase-s", type=float, default=8.0, help="measured seconds per path and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests-per-stream", type=int, default=None,
                        help="instead of timed phases: a warm-up request, then this many measured ones per stream")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="the proxy on a CPU of its own (default), as deployed")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    report = run([int(s) for s in args.streams.split(",")], [float(d) for d in args.token_delays_ms.split(",")],
                 args.tokens, args.phase_s, args.rounds, args.pin, args.requests_per_stream)
    print(f"records: {report['records']} of {report['traced_requests']} traced requests ({report['lost_records']} lost)")
    met = _meets_targets(report)
    print(f"targets (added median < {TARGET_MEDIAN_MS} ms, p99 < {TARGET_P99_MS} ms, no record lost): "
          f"{'met' if met else 'NOT met'} in every scenario" if met else
          f"targets (added median < {TARGET_MEDIAN_MS} ms, p99 < {TARGET_P99_MS} ms, no record lost): NOT met everywhere")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    return 0 if report["lost_records"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
