"""bench/proxy_overhead.py stays runnable: a short run measures both paths and loses no record.

The latency targets are the benchmark's business (they depend on the machine); this test checks
what must hold anywhere: every traced request has its record, and every event's delay was measured.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_short_proxy_overhead_run(tmp_path):
    out = tmp_path / "report.json"
    command = [sys.executable, str(ROOT / "bench" / "proxy_overhead.py"), "--streams", "1,20", "--token-delays-ms", "20",
               "--tokens", "8", "--phase-s", "1", "--rounds", "1", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    assert report["lost_records"] == 0 and report["records"] == report["traced_requests"] > 20
    for scenario in report["scenarios"]:
        for metric in ("ttfb", "event_delay"):
            assert scenario[metric]["direct"]["samples"] > 0 and scenario[metric]["proxy"]["samples"] > 0
            assert 0 < scenario[metric]["direct"]["median_ms"] < 1000 and 0 < scenario[metric]["proxy"]["median_ms"] < 1000
    # 20 streams of 9 events every 20 ms, 1 s measured: about 20 * 50 = 1,000 event delays per path
    many = report["scenarios"][1]["event_delay"]
    assert many["direct"]["samples"] > 500 and many["proxy"]["samples"] > 500
