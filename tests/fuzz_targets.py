"""What the fuzz suite mutates and runs: one target per command and input file (tests/test_fuzz.py
samples them, bench/fuzz.py walks every path and mutation of each).

A target names a shipped input (relative to the workspace of tests/hostile.py), the command line
that reads it (`{file}` is the mutated copy, `{out}` a fresh output path) and whether tree mutations
apply (YAML/JSON) or only raw-text ones (CSV).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hostile import assert_promise, run_cli

BEAM = "instances/beam-4xa6000.yaml"
RAG = "instances/rag-4xa6000.yaml"
PLAN = "plans/beam-4xa6000-optimal.json"
QUICK = ["--time-limit-s", "2", "--placement-time-limit-s", "1"]


@dataclass(frozen=True)
class Target:
    name: str
    source: str  # the shipped input that is mutated
    argv: tuple[str, ...]
    tree: bool = True  # parsed-document mutations apply (else raw text only)


TARGETS = (
    Target("plan-instance", BEAM, ("plan", "{file}", *QUICK, "--json")),
    Target("plan-rag-instance", RAG, ("plan", "{file}", *QUICK, "--json")),
    Target("plan-current", PLAN, ("plan", BEAM, "--current", "{file}", *QUICK, "--json")),
    Target("plan-profile", "instances/profiles/llama-3.2-1b.csv", ("plan", "{instance_for_profile}", *QUICK, "--json"), tree=False),
    Target("predict-allocation", "alloc.yaml", ("predict", BEAM, "--allocation", "{file}", "--json")),
    Target("predict-plan", PLAN, ("predict", BEAM, "--allocation", "{file}", "--json")),
    Target("place-allocation", "alloc.yaml", ("place", BEAM, "--allocation", "{file}", "--placement", "heuristic", "--json")),
    Target("whatif-instance", BEAM, ("whatif", "{file}", "--rates", "3", "--clusters", "4", "--time-limit-s", "2", "--json")),
    Target("simulate-plan", "alloc.yaml", ("simulate", BEAM, "--plan", "{file}", "--duration-s", "10", "--json")),
    Target("simulate-arrivals", "arrivals.jsonl", ("simulate", BEAM, "--plan", "alloc.yaml", "--duration-s", "10",
                                                   "--arrivals", "{file}", "--json")),
    Target("manifests-plan", PLAN, ("manifests", "{file}", "--instance", BEAM, "--out", "{out}", "--json")),
    Target("aggregate-traces", "traces.jsonl", ("aggregate", "{file}", "--json")),
    Target("export-traces", "traces.jsonl", ("traces", "export", "{file}", "--out", "{out}.jsonl")),
    Target("import-vllm", "vllm.json", ("profiles", "import", "{file}", "--gpu-type", "A6000", "--out", "{out}.csv")),
    Target("topology-pairs", "nvml/a6000-nvlink-pairs.json", ("topology", "--replay", "{file}", "--json")),
    Target("topology-nvswitch", "nvml/hgx-h100-nvswitch.json", ("topology", "--replay", "{file}", "--json")),
    Target("topology-pcie", "nvml/l4-pcie.json", ("topology", "--replay", "{file}", "--json")),
    Target("deploy-kubeconfig", "kubeconfig.yaml", ("deploy", "manifests", "--kubeconfig", "{file}")),
)


def mutated_copy(workspace: Path, target: Target, text: str, tag: str) -> Path:
    """Write the mutated text next to the original (relative references still resolve)."""
    source = workspace / target.source
    path = source.with_name(f"fuzz-{tag}{source.suffix}")
    path.write_text(text)
    return path


def command(workspace: Path, target: Target, mutated: Path, tag: str) -> list[str]:
    """The command line of `target` with its placeholders filled in."""
    values = {"{file}": str(mutated), "{out}": str(workspace / "out" / tag)}
    if "{instance_for_profile}" in target.argv:
        instance = (workspace / BEAM).read_text().replace("profiles/llama-3.2-1b.csv", f"profiles/{mutated.name}")
        path = workspace / "instances" / f"fuzz-profile-{tag}.yaml"
        path.write_text(instance)
        values["{instance_for_profile}"] = str(path)
    return [values.get(part, part).replace("{out}", values["{out}"]) for part in target.argv]


def check(workspace: Path, argv: list[str]):
    """Run the command in the workspace and assert the promise; valid JSON on exit 0 with --json."""
    result = run_cli(argv)
    assert_promise(result, argv)
    if result.code == 0 and "--json" in argv:
        json.loads(result.out)
    return result
