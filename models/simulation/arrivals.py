"""Arrival timestamps for the simulator (`scepsy simulate --arrivals`).

Two formats: JSONL, one `{"workflow": W, "arrival_s": T}` per line; or a CSV with a TIMESTAMP
column (the Azure LLM inference trace format), which every workflow replays from its first
timestamp; `azure:conv` and `azure:code` name the Azure traces shipped with the package. Times are seconds from the start of the run: finite and >= 0. A file without a single
arrival is an input error (it would otherwise leave the simulator to draw Poisson arrivals, which
is not what was asked for).
"""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

from scepsy.models.data.azure import AZURE_TRACES, azure_trace_text
from scepsy.models.errors import InputError
from scepsy.models.inputs import read_text

FIX = "check the path of the arrivals file"


def load_arrivals(path: Path | str, workflows: list[str]) -> dict[str, list[float]]:
    """Arrival times (seconds) per workflow name."""
    kind = str(path).removeprefix("azure:") if str(path).startswith("azure:") else None
    if kind is not None and kind not in AZURE_TRACES:
        raise InputError(None, "arrivals", f"unknown Azure trace {str(path)!r}", "use azure:conv or azure:code")
    path = Path(path)
    if kind is not None:
        return _from_csv(path, azure_trace_text(kind), workflows)
    text = read_text(path, FIX)
    out = _from_csv(path, text, workflows) if path.suffix == ".csv" else _from_jsonl(path, text, workflows)
    if not any(out.values()):
        raise InputError(str(path), None, "no arrival in the file", "give at least one arrival, or leave `arrivals` out for Poisson arrivals", argument=True)
    return out


def _from_csv(path: Path, text: str, workflows: list[str]) -> dict[str, list[float]]:
    import pandas as pd

    try:
        stamps = pd.to_datetime(pd.read_csv(io.StringIO(text), usecols=["TIMESTAMP"])["TIMESTAMP"])
    except (ValueError, KeyError, TypeError, OverflowError, pd.errors.ParserError) as exc:
        raise InputError(str(path), "TIMESTAMP", f"cannot read timestamps ({exc})", "give a CSV with a TIMESTAMP column") from None
    if stamps.isna().any():
        row = int(stamps.isna().to_numpy().argmax()) + 2
        raise InputError(str(path), f"row {row}, column TIMESTAMP", "missing or unreadable timestamp", "write a date and time in every row")
    seconds = ((stamps - stamps.min()).dt.total_seconds()).tolist()
    return {w: seconds for w in workflows}


def _from_jsonl(path: Path, text: str, workflows: list[str]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            workflow, arrival = record["workflow"], float(record["arrival_s"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, RecursionError):
            raise InputError(str(path), f"line {number}", "expected {\"workflow\": W, \"arrival_s\": T}", "fix the line") from None
        if not isinstance(workflow, str) or workflow not in workflows:
            raise InputError(str(path), f"line {number}, workflow", f"unknown workflow {workflow!r}", f"use one of: {', '.join(workflows)}")
        if not (math.isfinite(arrival) and arrival >= 0):
            raise InputError(str(path), f"line {number}, arrival_s", f"{arrival!r} is not a time >= 0", "write seconds from the start, e.g. 1.25")
        out.setdefault(workflow, []).append(arrival)
    return out
