"""`scepsy manifests`: output, and one clear line with exit code 2 for every input it refuses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from k8s_support import CASES, GOLDEN, ROOT, regenerate

from scepsy.cli import app

runner = CliRunner()
COMBINED = next(c for c in CASES if c.instance == "combined-8xh100" and c.plan_kind == "optimal")
WHOLE = next(c for c in CASES if c.plan_kind == "whole")


def run(*args: str | Path):
    return runner.invoke(app, [str(a) for a in args])


def test_manifests_writes_the_golden_files(tmp_path):
    result = run("manifests", regenerate.plan_path(COMBINED), "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    golden = GOLDEN / "combined-8xh100-vllm-hami"
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in golden.iterdir())
    assert "scepsy deploy" in result.output


def test_instance_is_found_relative_to_the_plan_and_overridable(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the plan's relative instance path only resolves next to the plan
    assert run("manifests", regenerate.plan_path(COMBINED), "--out", "a").exit_code == 0
    plan = json.loads(regenerate.plan_path(COMBINED).read_text())
    plan["instance"] = "nowhere/missing.yaml"
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    result = run("manifests", "plan.json", "--out", "b")
    assert result.exit_code == 2
    assert "instance file 'nowhere/missing.yaml' not found" in result.output and "--instance" in result.output
    override = ROOT / "instances" / "combined-8xh100.yaml"
    assert run("manifests", "plan.json", "--out", "b", "--instance", override).exit_code == 0


@pytest.mark.parametrize(
    "case,options,message",
    [
        (COMBINED, ["--gpu-sharing", "none"], "whole GPUs only"),
        (COMBINED, ["--gpu-sharing", "device-plugin-mps"], "equal replicas"),
        (COMBINED, ["--gpu-sharing", "dra-mps", "--kubernetes-version", "1.30"], "needs Kubernetes >= 1.32"),
        (COMBINED, ["--gpu-sharing", "mig"], "unknown backend"),
        (COMBINED, ["--engine", "tgi"], "unknown engine"),
        (COMBINED, ["--gpu-memory-utilization", "0.02"], "exceed the"),
        (COMBINED, ["--namespace", "Bad_NS"], "DNS-1123"),
        (WHOLE, ["--shm-gib", "0"], "--shm-gib"),
    ],
)
def test_refusals_exit_2_with_one_line(tmp_path, case, options, message):
    result = run("manifests", regenerate.plan_path(case), "--out", tmp_path / "out", *options)
    assert result.exit_code == 2, result.output
    assert message in result.output
    assert "Traceback" not in result.output and "fix:" in result.output


def test_device_plugin_mps_refuses_unequal_shares_naming_the_backends(tmp_path):
    result = run("manifests", regenerate.plan_path(COMBINED), "--out", tmp_path, "--gpu-sharing", "device-plugin-mps")
    assert "use --gpu-sharing hami or dra-mps" in result.output


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda p: p.pop("placement"), "placement"),
        (lambda p: p["placement"][0].update(node="nowhere"), "placement[0].node"),
        (lambda p: p["placement"][0]["shards"][0].update(gpu=99), "placement[0].shards[0].gpu"),
        (lambda p: p["llms"][0].update(fraction=0.55), "llms[0].fraction"),
        (lambda p: p.update(fractions_per_gpu=4), "fractions_per_gpu"),
        (lambda p: p["llms"][0].update(name="ghost"), "llms[0].name"),
    ],
)
def test_bad_plans_exit_2_naming_the_field(tmp_path, mutate, field):
    plan = json.loads(regenerate.plan_path(COMBINED).read_text())
    plan["instance"] = str(ROOT / "instances" / "combined-8xh100.yaml")
    mutate(plan)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    result = run("manifests", tmp_path / "plan.json", "--out", tmp_path / "out")
    assert result.exit_code == 2, result.output
    assert field in result.output


def test_malformed_plan_json_exits_2(tmp_path):
    (tmp_path / "plan.json").write_text("{not json")
    result = run("manifests", tmp_path / "plan.json", "--out", tmp_path / "out")
    assert result.exit_code == 2 and "malformed JSON" in result.output


def test_without_gpu_uuids_hami_warns_naming_the_unpinnable_replicas(tmp_path):
    result = runner.invoke(app, ["manifests", str(regenerate.plan_path(COMBINED)), "--out", str(tmp_path)])
    assert result.exit_code == 0
    warning = next(line for line in result.stderr.splitlines() if line.startswith("warning:"))
    for deployment in ("gen-r0", "ver-r0", "embed-r0", "rerank-r0", "rag-gen-r0"):
        assert deployment in warning
    assert "node h100" in warning and "scepsy topology" in warning and "gpu_uuids" in warning
    pod = (tmp_path / "70-deployment-gen-r0.yaml").read_text()
    assert "scepsy.io/gpu-pinning: 'none: node h100 lists no gpu_uuids" in pod


def test_prometheus_adds_pod_monitors_for_engines_gateways_and_the_entry(tmp_path):
    result = run("manifests", regenerate.plan_path(COMBINED), "--out", tmp_path, "--prometheus")
    assert result.exit_code == 0, result.output
    monitors = sorted(p.name for p in tmp_path.glob("*podmonitor*"))
    llms = ("embed", "gen", "rag-gen", "rerank", "ver")
    gateways = ("embed", "gen", "rag-gen", "ver")  # vLLM's reranker has none
    assert monitors == sorted([f"80-podmonitor-{m}-engines.yaml" for m in llms] + [f"80-podmonitor-{m}-gateway.yaml" for m in gateways]
                              + ["80-podmonitor-scepsy-entry.yaml"])
    without = run("manifests", regenerate.plan_path(COMBINED), "--out", tmp_path / "plain")
    assert without.exit_code == 0 and not list((tmp_path / "plain").glob("*podmonitor*"))


def test_replanning_the_same_input_gives_byte_identical_manifests(tmp_path):
    """The plan ConfigMap holds the plan's decisions, no solver times: no diff in a GitOps repository."""
    instance = Path(__file__).resolve().parents[1] / "instances" / "beam-4xa6000.yaml"
    trees = []
    for k in range(2):
        plan = tmp_path / f"plan{k}.json"
        assert runner.invoke(app, ["plan", str(instance), "--out", str(plan), "--json"]).exit_code == 0
        out = tmp_path / f"deploy{k}"
        assert runner.invoke(app, ["manifests", str(plan), "--out", str(out)]).exit_code == 0
        trees.append({p.name: p.read_bytes() for p in sorted(out.iterdir())})
    assert json.loads((tmp_path / "plan0.json").read_text())["solver"]["wall_time_s"] is not None  # the plans do differ
    assert trees[0] == trees[1]
    assert b"wall_time_s" not in trees[0]["40-configmap-scepsy-plan.yaml"]


def test_the_default_deployment_has_the_workflow_entry_and_turning_it_off_warns_once(tmp_path):
    """By default the manifests hold the workflow entry (scepsy's own image), which tags every call
    and holds each LLM at its entry limit: the burst cure. Without it, one warning says the engines
    serve first come first served and gives each workflow's recovery_limit_fcfs_rps: none claimed
    for beam search, whose calls continue earlier prompts; RAG's unchanged. The plan reports both."""
    from scepsy.k8s.entry import DEFAULT_ENTRY_IMAGE

    plan = json.loads(regenerate.plan_path(COMBINED).read_text())
    limits = {w["name"]: (w["recovery_limit_fcfs_rps"], w["recovery_limit_rps"]) for w in plan["workflows"]}
    assert limits["beam"][0] == 0.0 < limits["beam"][1] and 0.0 < limits["rag"][0] == limits["rag"][1]
    cured = run("manifests", regenerate.plan_path(COMBINED), "--out", tmp_path / "cured")
    assert cured.exit_code == 0 and "no workflow entry" not in cured.stderr
    entry = yaml.safe_load((tmp_path / "cured" / "70-deployment-scepsy-entry.yaml").read_text())
    assert entry["spec"]["template"]["spec"]["containers"][0]["image"] == DEFAULT_ENTRY_IMAGE
    for args, why in ((["--no-entry"], "turned off"), (["--router", "inference-gateway"], "inference gateway")):
        bare = run("manifests", regenerate.plan_path(COMBINED), "--out", tmp_path / why.replace(" ", "-"), *args)
        warned = [line for line in bare.stderr.splitlines() if line.startswith("warning:")]
        warned = [line for line in warned if "no workflow entry" in line]
        assert bare.exit_code == 0 and len(warned) == 1, bare.stderr
        assert why in warned[0] and "first come first served" in warned[0]
        assert f"beam 0.000 (with the entry {limits['beam'][1]:.3f})" in warned[0]
        assert f"rag {limits['rag'][0]:.3f}" in warned[0]
        assert not list((tmp_path / why.replace(" ", "-")).glob("*scepsy-entry*"))
