"""Benchmark: what the SGLang model gateway costs per worker and per request (sizes its pod, k8s/sizing.py).

Usage: python bench/gateway_memory.py [--requests 2000] [--workers 64]

Runs the real gateway binary (PyPI `sglang-router`, the gateway image's release) in front of one
`scepsy emulate` engine that answers on every loopback address, so that N worker URLs
(http://127.0.0.k:PORT) cost one process. Prints, as JSON lines:
- the gateway's resident memory once 1 and `--workers` workers are registered and healthy;
- for cache_aware (the approximate radix tree it routes decoders by) with prompts whose new text is
  200, 1000 and 8000 characters after a shared system prompt, and for round_robin: the resident
  memory the requests added, per new character and per request beyond its characters, and the
  gateway's CPU time per request.
Eviction is switched off while measuring (`--eviction-interval-secs` beyond the run), so the tree
keeps everything it was sent.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import string
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

MODEL = "meta-llama/Llama-3.2-1B-Instruct"
SYSTEM_PROMPT = "You are a careful assistant. " * 40
WARMUP_REQUESTS = 20


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("0.0.0.0", 0))
        return sock.getsockname()[1]


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS"))


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(condition, what: str, limit_s: float = 300.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} not ready after {limit_s:g} s")


class Gateway:
    def __init__(self, policy: str, worker_urls: list[str]):
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(self.port),
                "--policy", policy, "--worker-urls", *worker_urls, "--eviction-interval-secs", "1000000",
                "--health-check-interval-secs", "10", "--prometheus-port", str(_free_port()), "--log-level", "warn"]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        healthy = lambda: sum(w["is_healthy"] for w in httpx.get(self.url + "/workers", timeout=5).json()["workers"]) == len(worker_urls)  # noqa: E731
        _wait(healthy, f"gateway with {len(worker_urls)} workers")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait()


def _requests(gateway: Gateway, suffix_chars: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    texts = ["".join(rng.choices(string.ascii_letters + " ", k=suffix_chars)) for _ in range(count)]
    with httpx.Client(timeout=300.0) as client:
        def send(text: str) -> None:
            body = {"model": "gen", "max_tokens": 1,
                    "messages": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": text}]}
            response = client.post(gateway.url + "/v1/chat/completions", json=body)
            response.raise_for_status()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(send, texts))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000, help="requests per measured configuration")
    parser.add_argument("--workers", type=int, default=64, help="worker URLs for the per-worker memory")
    args = parser.parse_args()

    port = _free_port()
    engine = subprocess.Popen([sys.executable, "-m", "scepsy", "emulate", "--model", MODEL, "--gpu", "H100", "--served-model-name", "gen",
                               "--speedup", "100000", "--host", "0.0.0.0", "--port", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200, "engine emulator")
        urls = [f"http://127.0.0.{k + 1}:{port}" for k in range(args.workers)]
        for workers in (1, args.workers):
            gateway = Gateway("cache_aware", urls[:workers])
            time.sleep(15)  # a round of health checks of every worker
            print(json.dumps({"workers": workers, "idle_rss_mib": round(_rss_kib(gateway.process.pid) / 1024, 1)}), flush=True)
            gateway.stop()
        for policy, suffix in (("cache_aware", 200), ("cache_aware", 1000), ("cache_aware", 8000), ("round_robin", 1000)):
            gateway = Gateway(policy, urls[:4])
            _requests(gateway, suffix, WARMUP_REQUESTS, seed=1)
            rss, cpu = _rss_kib(gateway.process.pid), _cpu_s(gateway.process.pid)
            _requests(gateway, suffix, args.requests, seed=2)
            grown = (_rss_kib(gateway.process.pid) - rss) * 1024
            cpu_ms = (_cpu_s(gateway.process.pid) - cpu) * 1000 / args.requests
            chars = suffix * args.requests
            print(json.dumps({"policy": policy, "workers": 4, "new_chars_per_request": suffix, "requests": args.requests,
                              "rss_growth_mib": round(grown / 2**20, 1), "bytes_per_new_char": round(grown / chars, 2),
                              "kib_per_request_beyond_chars": round((grown - chars) / args.requests / 1024, 2),
                              "cpu_ms_per_request": round(cpu_ms, 3)}), flush=True)
            gateway.stop()
    finally:
        engine.terminate()
        engine.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
