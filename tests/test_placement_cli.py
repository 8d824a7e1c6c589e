"""`scepsy plan --placement/--current` and `scepsy place` end to end: JSON keys, tables, exit codes,
re-planning, reservations from the instance file."""

from __future__ import annotations

import json
import subprocess
import sys

import yaml

from conftest import INSTANCES

DEFAULT = INSTANCES / "beam-4xa6000.yaml"


def scepsy(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "scepsy", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def one_line_error(result, code: int, *needles: str) -> None:
    assert result.returncode == code, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_plan_carries_placement_solver_and_fragmentation():
    result = scepsy("plan", INSTANCES / "rag-8xa6000.yaml", "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    solver = plan["placement_solver"]
    assert solver["method"] == "cpsat" and solver["status"] == "optimal"
    assert set(solver["objective"]) == {"free_domains", "free_gpus", "shared_gpus"}
    (report,) = plan["fragmentation"]
    assert set(report) == {
        "gpu_type", "gpus", "free_gpus", "domains", "free_domains", "free_capacity_gpus",
        "stranded_capacity_gpus", "largest_tp_whole_gpu", "largest_tp_half_gpu",
    }
    assert report["gpu_type"] == "A6000" and report["gpus"] == 8


def test_plan_table_shows_placement_and_free_capacity():
    result = scepsy("plan", DEFAULT, "--placement", "heuristic")
    assert result.returncode == 0, result.stderr
    assert "placement: heuristic (heuristic)" in result.stdout
    for label in ("Free after placement", "free_gpus", "largest_tp_whole_gpu", "free_capacity_gpus"):
        assert label in result.stdout


def test_unknown_placement_method_exits_2():
    one_line_error(scepsy("plan", DEFAULT, "--placement", "greedy"), 2, "--placement", "unknown placement method", "cpsat, heuristic")


def test_replanning_with_the_previous_plan_keeps_everything(tmp_path):
    first = tmp_path / "plan.json"
    assert scepsy("plan", INSTANCES / "beam-8xa6000.yaml", "--out", first, "--json").returncode == 0
    for current in (first, tmp_path / "placement.json"):
        if current.name == "placement.json":  # the bare placement list works too
            current.write_text(json.dumps(json.loads(first.read_text())["placement"]))
        result = scepsy("plan", INSTANCES / "beam-8xa6000.yaml", "--current", current, "--json")
        assert result.returncode == 0, result.stderr
        again = json.loads(result.stdout)
        objective = again["placement_solver"]["objective"]
        assert objective["moved_shards"] == 0
        assert objective["kept_replicas"] == len(again["placement"])
        assert again["placement"] == json.loads(first.read_text())["placement"]


def test_replanning_after_a_load_change_keeps_what_it_can(tmp_path):
    first = tmp_path / "plan.json"
    assert scepsy("plan", INSTANCES / "rag-16xa6000.yaml", "--out", first, "--json").returncode == 0
    doc = yaml.safe_load((INSTANCES / "rag-16xa6000.yaml").read_text())
    doc["workflows"][0]["arrival_rate"] *= 0.5
    for llm in doc["llms"]:
        llm["profile"] = str(INSTANCES / llm["profile"])
    lighter = tmp_path / "lighter.yaml"
    lighter.write_text(yaml.safe_dump(doc))
    result = scepsy("plan", lighter, "--current", first, "--json")
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    before = {(p["llm"], p["node"], tuple(s["gpu"] for s in p["shards"]), p["shards"][0]["fraction"]) for p in json.loads(first.read_text())["placement"]}
    after = {(p["llm"], p["node"], tuple(s["gpu"] for s in p["shards"]), p["shards"][0]["fraction"]) for p in plan["placement"]}
    kept = plan["placement_solver"]["objective"]["kept_replicas"]
    assert kept > 0 and len(before & after) == kept


def test_malformed_current_exits_2(tmp_path):
    bad = tmp_path / "current.json"
    bad.write_text('{"placement": [{"llm": "gen", "replica": 0, "node": "a6000-0", "shards": [{"gpu": 0, "fraction": 0.33}]}]}')
    one_line_error(scepsy("plan", DEFAULT, "--current", bad), 2, "current.json", "placement[0].shards[0].fraction", "multiple of 1/10")
    bad.write_text("[1, 2")
    one_line_error(scepsy("plan", DEFAULT, "--current", bad), 2, "malformed JSON")


def test_place_a_given_allocation(tmp_path):
    allocation = tmp_path / "alloc.yaml"
    allocation.write_text(yaml.safe_dump({"llms": [
        {"name": "gen", "gpu_type": "A6000", "tp": 1, "fraction": 0.3, "replicas": 3},
        {"name": "ver", "gpu_type": "A6000", "tp": 2, "fraction": 0.5, "replicas": 2},
    ]}))
    out = tmp_path / "placed.json"
    result = scepsy("place", DEFAULT, "--allocation", allocation, "--json", "--out", out)
    assert result.returncode == 0, result.stderr
    placed = json.loads(result.stdout)
    assert json.loads(out.read_text()) == placed
    assert set(placed) >= {"placement_solver", "placement", "fragmentation", "llms"}
    assert placed["placement_solver"]["status"] == "optimal"
    assert len(placed["placement"]) == 5
    table = scepsy("place", DEFAULT, "--allocation", allocation, "--placement", "heuristic")
    assert table.returncode == 0 and "Free after placement" in table.stdout


def test_place_an_unplaceable_allocation_exits_3_with_the_reason(tmp_path):
    allocation = tmp_path / "alloc.yaml"
    allocation.write_text(yaml.safe_dump({"llms": [
        {"name": "gen", "gpu_type": "A6000", "tp": 4, "fraction": 0.5, "replicas": 1},
        {"name": "ver", "gpu_type": "A6000", "tp": 1, "fraction": 1.0, "replicas": 1},
    ]}))
    one_line_error(scepsy("place", DEFAULT, "--allocation", allocation), 3, "cannot be placed", "tp 4", "largest NVLink domain")


def test_reservations_in_the_instance_file_are_honoured(write_instance):
    def mutate(doc):
        doc["cluster"]["reserved"] = [{"node": "node-0", "gpu": 0, "fraction": 1.0}, {"node": "node-0", "gpu": 1, "fraction": 0.5}]

    path = write_instance(mutate)
    for method in ("cpsat", "heuristic"):
        result = scepsy("plan", path, "--json", "--placement", method)
        assert result.returncode == 0, result.stderr
        plan = json.loads(result.stdout)
        load = {}
        for replica in plan["placement"]:
            for shard in replica["shards"]:
                load[shard["gpu"]] = load.get(shard["gpu"], 0) + shard["fraction"]
        assert load.get(0, 0) == 0 and load.get(1, 0) <= 0.5 + 1e-9
        assert plan["fragmentation"][0]["free_capacity_gpus"] <= 4 - 1.5  # reservations are deducted
