"""Time limits bound the whole `scepsy plan`: the deadline starts with the command and is
checked while reading the instance, expanding its nodes, loading its profiles (each file once),
building the options and placing; loading scales with the node layouts, not the GPUs.

Order-based: a deadline already past at a step must stop that step before it builds anything; no
test measures wall-clock time (bench/time_limits.py measures the overshoot)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from scepsy import api
from scepsy.models import inputs
from scepsy.models.errors import TimeLimitError
from scepsy.models.instance.allocation import Allocation, LlmAllocation, Placement, ReplicaPlacement, Shard
from scepsy.models.instance.instance import build_instance, load_instance
from scepsy.models.plan.fragmentation import fragmentation_report
from scepsy.placement.objective import evaluate
from scepsy.placement.place import PlacementSettings, place
from scepsy.planner.allocation.options import _pareto, llm_options

from hostile import assert_promise, run_cli

ROOT = Path(__file__).resolve().parents[1]
BEAM = ROOT / "instances" / "beam-4xa6000.yaml"


def _beam(tmp_path: Path, edit=None, name: str = "beam.yaml") -> Path:
    """The shipped beam instance with absolute profile paths, `edit(raw)` applied, written to tmp_path."""
    raw = yaml.safe_load(BEAM.read_text())
    for llm in raw["llms"]:
        llm["profile"] = str(BEAM.parent / llm["profile"])
    if edit is not None:
        edit(raw)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture
def reads(monkeypatch):
    """Every file read through models/inputs.py (instances, profiles), in order."""
    seen: list[str] = []
    original = inputs.read_bytes

    def counting(path, fix="check the path"):
        seen.append(str(Path(path).resolve()))
        return original(path, fix)

    monkeypatch.setattr(inputs, "read_bytes", counting)
    return seen


def _past() -> float:
    return time.perf_counter() - 1.0


def test_an_expired_deadline_stops_before_anything_is_built(tmp_path, reads):
    path = _beam(tmp_path)
    with pytest.raises(TimeLimitError, match=r"while reading .*beam\.yaml.*too large for the limit.*raise `time_limit_s`"):
        api.plan(path, time_limit_s=0.5, started_s=_past())
    assert reads == [str(path.resolve())]  # the instance file only: no profile loaded, nothing built


def test_the_same_instance_plans_when_the_deadline_is_ahead(tmp_path, reads):
    path = _beam(tmp_path)
    result = api.plan(path, time_limit_s=30.0, placement_time_limit_s=10.0, started_s=time.perf_counter())
    assert result.status == "optimal"
    assert Counter(reads) == Counter({str(path.resolve()): 1, **{str((BEAM.parent / "profiles" / f).resolve()): 1 for f in (
        "llama-3.2-1b.csv", "llama-3.1-8b-prm.csv")}})


def test_each_profile_file_is_read_once_through_inputs(tmp_path, reads):
    def many_llms(raw):
        generator, verifier = raw["llms"]
        raw["llms"] = [dict(generator, name=f"gen{i}") for i in range(40)] + [verifier]
        workflow = raw["workflows"][0]
        workflow["stages"] = [{"llm": f"gen{i}", "invocations": 1.0, "parallelism": 1.0} for i in range(40)] + [
            workflow["stages"][1]]
        del workflow["program"]

    path = _beam(tmp_path, many_llms)
    instance = load_instance(path)
    assert len(instance.llms) == 41
    assert Counter(reads) == Counter(set(reads)) and len(reads) == 3  # the instance and its two profile files


def test_an_expired_deadline_stops_node_expansion_and_profile_loading(tmp_path, reads):
    raw = yaml.safe_load(_beam(tmp_path, lambda r: r["cluster"]["nodes"][0].update(count=250_000)).read_text())
    with pytest.raises(TimeLimitError, match=r"expanding cluster\.nodes\[0\] \(a6000\) \(1,000,000 GPUs in all\)"):
        build_instance(raw, "big.yaml", tmp_path, deadline=_past())
    assert reads == []  # stopped before any profile file was opened


def test_the_cli_answers_one_line_with_exit_3(tmp_path):
    path = _beam(tmp_path, lambda r: r["cluster"]["nodes"][0].update(count=250_000), "huge.yaml")
    argv = ["plan", path, "--time-limit-s", "0.01", "--placement-time-limit-s", "0.01"]
    result = run_cli(argv)
    assert_promise(result, argv)
    assert result.code == 3
    line = result.err.strip().splitlines()[-1]
    assert "the instance is too large for the limit" in line and "raise --time-limit-s" in line


def test_placement_past_its_deadline_keeps_the_heuristic_placement(tmp_path):
    instance = load_instance(_beam(tmp_path, lambda r: r["cluster"]["nodes"][0].update(count=8)))
    allocation = api.plan(instance, time_limit_s=30.0).allocation
    result = place(instance.cluster, allocation, PlacementSettings(time_limit_s=30.0), deadline=_past())
    assert result.info.status == "heuristic"
    assert "did not finish building within the time limit" in " ".join(result.info.notes)


def test_listing_replicas_stops_where_the_latency_curve_is_flat(tmp_path):
    """The options equal the dominance-pruned set over every replica count that fits the cluster
    (the computation before the cut-off), on a cluster large enough for the cut-off to drop counts."""
    instance = load_instance(_beam(tmp_path, lambda r: r["cluster"]["nodes"][0].update(count=500)))
    for llm in instance.llms:
        every = llm_options(instance, llm, prune=False)
        pruned = llm_options(instance, llm)
        expected = []
        for gpu_type, tp in sorted({(o.gpu_type, o.tp) for o in every}):
            group = [o for o in every if (o.gpu_type, o.tp) == (gpu_type, tp)]
            candidates = {}
            for share in sorted({o.share for o in group}):
                row = sorted((o.replicas, o.latency_s) for o in group if o.share == share)
                candidates[share] = (np.array([d for d, _ in row]), np.array([lat for _, lat in row]))
            expected += [(gpu_type, tp, s, d, lat) for s, d, lat in _pareto(candidates)]
        assert sorted((o.gpu_type, o.tp, o.share, o.replicas, o.latency_s) for o in pruned) == sorted(expected)
        assert max(o.replicas for o in every) > 10 * max(o.replicas for o in pruned)  # the cut-off did drop counts


def _per_gpu_fragmentation(cluster, placement):
    """The report computed GPU by GPU (the definition in models/plan/fragmentation.py)."""
    f = cluster.fractions_per_gpu
    free = {(n.name, g): cluster.free_units(n.name, g) for n in cluster.nodes for g in range(n.gpus)}
    for replica in placement.replicas:
        for shard in replica.shards:
            free[(replica.node, shard.gpu)] -= shard.units
    out = []
    for gpu_type in cluster.used_gpu_types():
        nodes = [n for n in cluster.nodes if n.gpu_type == gpu_type]
        units = [free[(n.name, g)] for n in nodes for g in range(n.gpus)]
        domains = [[free[(n.name, g)] for g in d] for n in nodes for d in n.domains]
        out.append((gpu_type, len(units), sum(u == f for u in units), len(domains), sum(all(u == f for u in d) for d in domains),
                    sum(units), sum(u for u in units if u < f), max(sum(u == f for u in d) for d in domains),
                    max(sum(u >= (f + 1) // 2 for u in d) for d in domains)))
    return out


def test_reports_counted_per_domain_kind_equal_the_per_gpu_count(tmp_path):
    def edit(raw):
        raw["cluster"]["nodes"][0]["count"] = 6
        raw["cluster"]["reserved"] = [{"node": "a6000-1", "gpu": 0, "fraction": 0.3}, {"node": "a6000-4", "gpu": 3, "fraction": 1.0}]

    cluster = load_instance(_beam(tmp_path, edit)).cluster
    f = cluster.fractions_per_gpu
    placement = Placement(f, (
        ReplicaPlacement("gen", 0, "a6000-1", (Shard(0, 5), Shard(1, 5))),
        ReplicaPlacement("gen", 1, "a6000-2", (Shard(2, 5), Shard(3, 5))),
        ReplicaPlacement("ver", 0, "a6000-2", (Shard(2, 5), Shard(3, 5))),
        ReplicaPlacement("ver", 1, "a6000-4", (Shard(0, 10), Shard(1, 10))),
    ))
    allocation = Allocation(f, (LlmAllocation("gen", "A6000", 2, 5, 2), LlmAllocation("ver", "A6000", 2, 5, 2)))
    for candidate in (placement, Placement(f, ())):
        report = [(r.gpu_type, r.gpus, r.free_gpus, r.domains, r.free_domains, round(r.free_capacity_gpus * f),
                   round(r.stranded_capacity_gpus * f), r.largest_tp_whole_gpu, r.largest_tp_half_gpu)
                  for r in fragmentation_report(cluster, candidate)]
        assert report == _per_gpu_fragmentation(cluster, candidate)
        taken = {(rp.node, s.gpu) for rp in candidate.replicas for s in rp.shards}
        objective = evaluate(cluster, allocation, candidate)
        assert objective.free_gpus == sum(
            (n.name, g) not in taken and cluster.free_units(n.name, g) == f for n in cluster.nodes for g in range(n.gpus))
        assert objective.free_domains == sum(
            all((n.name, g) not in taken and cluster.free_units(n.name, g) == f for g in d) for n in cluster.nodes for d in n.domains)
