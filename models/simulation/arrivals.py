"""Recorded arrival timestamps for the simulator (`scepsy simulate --arrivals`)."""

from __future__ import annotations

import json
from pathlib import Path

from scepsy.models.errors import InputError


def load_arrivals(path: Path, workflows: list[str]) -> dict[str, list[float]]:
    """Arrival timestamps: JSONL {"workflow", "arrival_s"} or a CSV with a TIMESTAMP column
    (Azure trace format; every workflow replays it, from its first timestamp)."""
    import pandas as pd

    if not path.is_file():
        raise InputError(str(path), None, "file not found", "check the --arrivals path")
    if path.suffix == ".csv":
        try:
            stamps = pd.to_datetime(pd.read_csv(path, usecols=["TIMESTAMP"])["TIMESTAMP"])
        except (ValueError, KeyError, pd.errors.ParserError) as exc:
            raise InputError(str(path), "TIMESTAMP", f"cannot read timestamps ({exc})", "give a CSV with a TIMESTAMP column") from None
        seconds = ((stamps - stamps.min()).dt.total_seconds()).tolist()
        return {w: seconds for w in workflows}
    out: dict[str, list[float]] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            out.setdefault(str(record["workflow"]), []).append(float(record["arrival_s"]))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise InputError(str(path), f"line {number}", "expected {\"workflow\": W, \"arrival_s\": T}", "fix the line") from None
    unknown = sorted(set(out) - set(workflows))
    if unknown:
        raise InputError(str(path), "workflow", f"unknown workflow {unknown[0]!r}", f"use one of: {', '.join(workflows)}")
    return out
