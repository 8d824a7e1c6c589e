"""Instance validation: every rule reports the file, the field and a fix (InputError, exit code 2)."""

from __future__ import annotations

from pathlib import Path

import pytest

from scepsy.models.errors import InputError
from scepsy.models.instance.instance import load_instance

from conftest import INSTANCES, profile_rows


@pytest.mark.parametrize("path", sorted(INSTANCES.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_instances_load(path):
    instance = load_instance(path)
    assert instance.llms and instance.workflows
    for llm in instance.llms:
        assert llm.profile.configurations()


def test_nodes_expand_and_domains_complete(write_instance):
    def cluster(doc):
        doc["cluster"]["nodes"] = [
            {"name": "a", "count": 2, "gpu_type": "A6000", "gpus": 4, "nvlink_domains": [[0, 1]]},
            {"name": "solo", "gpu_type": "A6000", "gpus": 2, "gpu_uuids": ["GPU-a", "GPU-b"]},
        ]

    instance = load_instance(write_instance(cluster))
    assert [n.name for n in instance.cluster.nodes] == ["a-0", "a-1", "solo"]
    assert instance.cluster.nodes[0].domains == ((0, 1), (2,), (3,))
    assert instance.cluster.nodes[2].gpu_uuids == ("GPU-a", "GPU-b")
    assert instance.llm("gen").tp_degrees == (1, 2)


def test_default_tp_degrees_are_powers_of_two_up_to_the_largest_domain(write_instance):
    def no_tp(doc):
        doc["cluster"]["nodes"][0]["gpus"] = 8
        doc["cluster"]["nodes"][0]["nvlink_domains"] = [[0, 1, 2, 3, 4, 5, 6]]
        for llm in doc["llms"]:
            llm.pop("tp_degrees")

    assert load_instance(write_instance(no_tp)).llm("gen").tp_degrees == (1, 2, 4)


def _set(path, value):
    def mutate(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    return mutate


def _drop(path):
    def mutate(doc):
        node = doc
        for key in path[:-1]:
            node = node[key]
        del node[path[-1]]
    return mutate


CASES = {
    "negative rate": (_set(["workflows", 0, "arrival_rate"], -1.0), "workflows[0] (beam).arrival_rate"),
    "zero invocations": (_set(["workflows", 0, "stages", 0, "invocations"], 0), "workflows[0] (beam).stages[0].invocations"),
    "parallelism below one": (_set(["workflows", 0, "stages", 1, "parallelism"], 0.5), "stages[1].parallelism"),
    "unknown llm in a stage": (_set(["workflows", 0, "stages", 1, "llm"], "verifier"), "stages[1].llm"),
    "llm twice in a workflow": (_set(["workflows", 0, "stages", 1, "llm"], "gen"), "stages[1].llm"),
    "unused llm": (lambda d: d["llms"].append(dict(d["llms"][0], name="spare")), "llms[2] (spare)"),
    "duplicate llm name": (_set(["llms", 1, "name"], "gen"), "llms[1].name"),
    "misspelt field": (_set(["llms", 0, "weight_gib"], 2.0), "llms[0] (gen).weight_gib"),
    "missing field": (_drop(["llms", 0, "weights_gib"]), "llms[0] (gen).weights_gib"),
    "negative weights": (_set(["llms", 0, "weights_gib"], -2.0), "llms[0] (gen).weights_gib"),
    "model too large": (_set(["llms", 1, "weights_gib"], 120.0), "llms[1] (ver).weights_gib"),
    "tp beyond domains": (_set(["llms", 0, "tp_degrees"], [4]), "llms[0] (gen).tp_degrees"),
    "missing profile": (_set(["llms", 0, "profile"], "nope.csv"), "llms[0] (gen).profile"),
    "unknown gpu type": (_set(["cluster", "nodes", 0, "gpu_type"], "H100"), "cluster.nodes[0] (node).gpu_type"),
    "domain out of range": (_set(["cluster", "nodes", 0, "nvlink_domains"], [[0, 4]]), "nvlink_domains[0]"),
    "gpu in two domains": (_set(["cluster", "nodes", 0, "nvlink_domains"], [[0, 1], [1, 2]]), "nvlink_domains"),
    "uuid count": (_set(["cluster", "nodes", 0, "gpu_uuids"], ["GPU-x"]), "gpu_uuids"),
    "zero gpus": (_set(["cluster", "nodes", 0, "gpus"], 0), "cluster.nodes[0] (node).gpus"),
    "max utilization above one": (_set(["max_utilization"], 1.5), "max_utilization"),
    "unknown latency metric": (_set(["latency_metric"], "p95"), "latency_metric"),
    "unknown objective": (_set(["objective"], "fastest"), "objective"),
    "reserved on unknown node": (_set(["cluster", "reserved"], [{"node": "node", "gpu": 0, "fraction": 0.5}]), "cluster.reserved[0].node"),
    "no workflows": (_set(["workflows"], []), "workflows"),
    "parallelism above invocations": (_set(["workflows", 0, "stages", 0, "parallelism"], 99.0), "workflows[0] (beam).stages[0].parallelism"),
    "infinite rate": (_set(["workflows", 0, "arrival_rate"], float("inf")), "workflows[0] (beam).arrival_rate"),
    "not a number invocations": (_set(["workflows", 0, "stages", 1, "invocations"], float("nan")), "stages[1].invocations"),
    "critical path above one": (_set(["workflows", 0, "stages", 1, "critical_path"], 1.5), "stages[1].critical_path"),
    "falling latency ratios": (_set(["workflows", 0, "latency_ratios"], {"p90": 2.0, "p99": 1.5}), "latency_ratios.p99"),
    "critical path negative": (_set(["workflows", 0, "stages", 1, "critical_path"], -0.1), "stages[1].critical_path"),
}


def test_parallelism_up_to_invocations_or_one_is_accepted(write_instance):
    # p = n (every call of a request at once) and p = 1 > n (an LLM only some requests call once)
    def edge(doc):
        doc["workflows"][0]["stages"][0].update(invocations=9.0, parallelism=9.0)
        doc["workflows"][0]["stages"][1].update(invocations=0.4, parallelism=1.0)

    instance = load_instance(write_instance(edge))
    assert instance.workflows[0].stages[0].parallelism == 9.0


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_rule_names_file_field_and_fix(write_instance, name):
    mutate, field = CASES[name]
    path = write_instance(mutate)
    with pytest.raises(InputError) as err:
        load_instance(path)
    error = err.value
    assert error.file == str(path) or Path(error.file or "").name.endswith(".csv")
    assert field in (error.field or ""), error.line()
    assert "; fix: " in error.line() and "\n" not in error.line()


def test_malformed_yaml_names_the_line(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("cluster:\n  nodes: [a, b\nllms: []\n")
    with pytest.raises(InputError) as err:
        load_instance(path)
    assert (err.value.field or "").startswith("line ") and "malformed YAML" in err.value.problem


@pytest.mark.parametrize(
    "column, change",
    [("latency_p90", lambda f: f.assign(latency_p90=f["latency_p50"] * 0.5)), ("latency_mean", lambda f: f.assign(latency_mean=0.0))],
)
def test_impossible_profile_latencies_name_the_column(write_instance, column, change):
    path = write_instance(profiles={"gen.csv": change(profile_rows()), "ver.csv": profile_rows()})
    with pytest.raises(InputError) as err:
        load_instance(path)
    assert (err.value.file or "").endswith("gen.csv") and column in (err.value.field or "") and "fix" in err.value.line()


def test_profile_problems_name_the_csv(write_instance):
    broken = profile_rows().drop(columns=["throughput"])
    path = write_instance(profiles={"gen.csv": broken, "ver.csv": profile_rows()})
    with pytest.raises(InputError) as err:
        load_instance(path)
    assert (err.value.file or "").endswith("gen.csv") and "throughput" in (err.value.field or "")


def test_reserved_shares_reduce_free_units(write_instance):
    path = write_instance(_set(["cluster", "reserved"], [{"node": "node-0", "gpu": 1, "fraction": 0.25}]))
    cluster = load_instance(path).cluster
    assert cluster.free_units("node-0", 1) == 7  # 0.25 of 10 units rounds up to 3 reserved
    assert cluster.free_units("node-0", 0) == 10
