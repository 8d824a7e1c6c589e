"""bench/proxy_overhead.py stays runnable: a short run measures both paths and loses no record.

The latency targets are the benchmark's business (they depend on the machine); this test checks
what must hold anywhere, with counted requests instead of timed phases (`--requests-per-stream`):
every traced request has its record, and every event of every measured request had its delay
measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_short_proxy_overhead_run(tmp_path):
    out = tmp_path / "report.json"
    streams, tokens, measured = (1, 20), 8, 3
    command = [sys.executable, str(ROOT / "bench" / "proxy_overhead.py"), "--streams", ",".join(map(str, streams)),
               "--token-delays-ms", "20", "--tokens", str(tokens), "--requests-per-stream", str(measured), "--rounds", "1",
               "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    # through the proxy: per stream one warm-up request and the measured ones, each with its record
    assert report["traced_requests"] == sum(streams) * (1 + measured)
    assert report["lost_records"] == 0 and report["records"] == report["records_ok"] == report["traced_requests"]
    for scenario, count in zip(report["scenarios"], streams):
        for path in ("direct", "proxy"):
            # every measured request's first byte, and every one of its tokens + 1 events (the last
            # carries the usage), each with its delay
            assert scenario["ttfb"][path]["samples"] == count * measured
            assert scenario["event_delay"][path]["samples"] == count * measured * (tokens + 1)
            assert scenario["event_delay"][path]["median_ms"] >= 0
