"""Support of the hostile-input tests and the fuzz suite (tests/test_hostile_input.py,
tests/test_fuzz.py, bench/fuzz.py): the CLI run in-process, the README's promise as an assertion,
a workspace holding copies of the shipped inputs, and the mutations applied to them.

The promise (docs/cli.md, "Exit codes, output and inputs"): exit 0 with valid output, 2 with one plain line naming the
file, the field and the fix, or 3 with the binding reason; never 1, never a traceback.
"""

from __future__ import annotations

import io
import json
import math
import random
import shutil
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
# stderr lines a failing command may print before its one error line
_CHATTER = ("warning: ", "note: ", "wrote ")


@dataclass(frozen=True)
class Result:
    code: int
    out: str
    err: str


def run_cli(argv: list) -> Result:
    """`scepsy ARGV` in this process (the `main` the console script runs): exit code and output."""
    from scepsy.cli import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main([str(a) for a in argv])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return Result(code, out.getvalue(), err.getvalue())


def assert_promise(result: Result, argv: list) -> None:
    """Exit 0, 2 or 3; a failure is one plain `error:` line, last on stderr; never a traceback."""
    context = f"scepsy {' '.join(map(str, argv))} -> exit {result.code}\n{result.err[-2000:]}"
    assert "Traceback" not in result.err and "Traceback" not in result.out, context
    assert result.code in (0, 2, 3), context
    if result.code:
        lines = [line for line in result.err.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("error: "), context
        assert all(line.startswith(_CHATTER) for line in lines[:-1]), context
        assert "\x1b[" not in result.err and "\u2500" not in result.err, context  # no colours, no boxes


# ---------------------------------------------------------------------------------------------
# The shipped inputs


def trace_rows() -> list[dict]:
    """A small traced beam search (two workflow requests) as export rows."""
    rows, i = [], 0
    for request in range(2):
        t = 100.0 * request
        for start, end, llm in [(0, 1, "gen"), (0, 1.2, "gen"), (1.2, 1.5, "ver"), (1.5, 2.5, "gen")]:
            body = json.dumps({"model": llm, "messages": [{"role": "user", "content": f"call {i}"}], "max_tokens": 4})
            rows.append({"call_id": f"c{i:03d}", "llm": llm, "path": "/v1/chat/completions", "start_s": t + start,
                         "end_s": t + end, "status": 200, "outcome": "ok", "workflow": "beam", "workflow_id": f"r{request}",
                         "stream": False, "prompt_tokens": 12, "completion_tokens": 4, "request_body": body})
            i += 1
    return rows


# `vllm bench serve` result (>= 0.5, with --percentile-metrics e2el), as in tests/test_benchimport.py
VLLM_RESULT = {"backend": "vllm", "model_id": "m", "num_prompts": 100, "request_rate": 2.0, "duration": 50.2,
               "completed": 100, "request_throughput": 1.99, "mean_e2el_ms": 1500.0, "median_e2el_ms": 1400.0,
               "p50_e2el_ms": 1400.0, "p90_e2el_ms": 1900.0, "p99_e2el_ms": 2500.0}
ALLOCATION = {"llms": [{"name": "gen", "gpu_type": "A6000", "tp": 1, "fraction": 0.5, "replicas": 2},
                       {"name": "ver", "gpu_type": "A6000", "tp": 2, "fraction": 1.0, "replicas": 1}]}


def workspace(directory: Path) -> Path:
    """Copies of the shipped inputs of every command under `directory`."""
    shutil.copytree(ROOT / "instances", directory / "instances", ignore=shutil.ignore_patterns("*.py", "*.md"))
    shutil.copytree(ROOT / "tests" / "golden" / "plans", directory / "plans")
    shutil.copytree(ROOT / "tests" / "fixtures" / "nvml", directory / "nvml", ignore=shutil.ignore_patterns("*.py"))
    (directory / "traces.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in trace_rows()))
    (directory / "vllm.json").write_text(json.dumps(VLLM_RESULT))
    (directory / "alloc.yaml").write_text(yaml.safe_dump(ALLOCATION))
    manifests = directory / "manifests"
    manifests.mkdir()
    (manifests / "kustomization.yaml").write_text("resources: [namespace.yaml]\n")
    (manifests / "namespace.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: scepsy}\n")
    # a real kubeconfig (kubectl config view) whose API server refuses connections at once
    (directory / "kubeconfig.yaml").write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "clusters": [{"name": "c", "cluster": {"server": "http://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}], "contexts": [{"name": "ctx", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "ctx",
    }))
    (directory / "arrivals.jsonl").write_text("".join(json.dumps({"workflow": "beam", "arrival_s": 0.5 * k}) + "\n" for k in range(20)))
    return directory


# ---------------------------------------------------------------------------------------------
# Mutations: a path into the parsed document and what to put there

HOSTILE_VALUES = (
    None, True, 0, -1, 1.5, 10**30, 1e308, math.inf, -math.inf, math.nan, "", "x" * 5000, "Node A_6000",
    "a\nb", ":x: [bold]markup[/bold]", "GPU-1", [], {}, [[[[[]]]]], {"unknown_field": 1}, "ä名",
)
STRUCTURAL = ("delete", "duplicate", "unknown_key")


def paths(document, prefix: tuple = ()) -> list[tuple]:
    """Every path into a parsed YAML/JSON document (keys and list indices), parents first."""
    out = [prefix]
    if isinstance(document, dict):
        for key, value in document.items():
            out += paths(value, prefix + (key,))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            out += paths(value, prefix + (index,))
    return out


def mutate(document, path: tuple, mutation):
    """A copy of the document with `mutation` (a hostile value or a STRUCTURAL name) at `path`."""
    copy = json.loads(json.dumps(document, allow_nan=True))
    if not path:
        return mutation if mutation not in STRUCTURAL else copy
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if mutation == "delete":
        del parent[last]
    elif mutation == "duplicate":
        if isinstance(parent, list):
            parent.insert(last, json.loads(json.dumps(parent[last], allow_nan=True)))
        else:
            parent[last] = [parent[last], parent[last]]
    elif mutation == "unknown_key":
        target = parent[last]
        if isinstance(target, dict):
            target["unknown_field"] = 1
        else:
            parent[last] = {"unknown_field": target}
    else:
        parent[last] = mutation
    return copy


def dump(document, suffix: str) -> str:
    if suffix in (".yaml", ".yml"):
        return yaml.safe_dump(document, sort_keys=False, allow_unicode=True)
    if suffix == ".jsonl":
        rows = document if isinstance(document, list) else [document]
        return "".join(json.dumps(row) + "\n" for row in rows)
    return json.dumps(document)


def load_document(path: Path):
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return yaml.safe_load(text) if path.suffix in (".yaml", ".yml") else json.loads(text)


def text_mutation(text: str, rng: random.Random) -> str:
    """A raw-text mutation: truncation, a duplicated line (YAML: a duplicate key), garbage bytes."""
    kind = rng.randrange(4)
    lines = text.splitlines(keepends=True)
    if kind == 0:
        return text[: rng.randrange(len(text) + 1)]
    if kind == 1 and lines:
        at = rng.randrange(len(lines))
        return "".join(lines[: at + 1] + lines[at:])
    if kind == 2:
        at = rng.randrange(len(text) + 1)
        return text[:at] + rng.choice(["\x00", "\ufffd", "{{", "]]", "&a", "*a", "!!python/object:os.system", "\t"]) + text[at:]
    return "- " * rng.randrange(1, 3000) + "x"  # deep nesting
