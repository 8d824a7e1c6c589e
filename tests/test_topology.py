"""NVML topology discovery replayed from recorded answers (tests/fixtures/nvml/): an 8-GPU NVSwitch
node, a 4-GPU node with NVLink pairs, a PCIe-only node; the P2P cross-check; missing NVML; the
`scepsy topology` command end to end into an instance that plans."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
import yaml

from scepsy.models.instance.instance import NodeSpec, load_instance
from scepsy.tracing.discovery.topology import NvmlUnavailableError, RecordedNvml, discover, gpu_type_name, record

from conftest import REPO

FIXTURES = REPO / "tests" / "fixtures" / "nvml"


def answers(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def scepsy(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "scepsy", *map(str, args)], capture_output=True, text=True, cwd=cwd)


def test_nvswitch_node_is_one_domain():
    found = discover(RecordedNvml(answers("hgx-h100-nvswitch")), "hgx-0")
    assert found.gpu_type == "H100" and found.memory_gib == 79.6 and len(found.gpus) == 8
    assert found.domains == ((0, 1, 2, 3, 4, 5, 6, 7),)
    assert all(to.startswith("switch:") for _, _, to in found.nvlinks) and len(found.nvlinks) == 8 * 18
    assert found.warnings == ()
    entry = found.node_entry()
    assert entry["nvlink_domains"] == [[0, 1, 2, 3, 4, 5, 6, 7]]
    assert entry["gpu_uuids"][0] == "GPU-5e2c0000-7d1a-4c3b-9f0e-1a2b3c4d0000"
    NodeSpec.model_validate(entry)


def test_nvlink_pairs_are_two_domains():
    found = discover(RecordedNvml(answers("a6000-nvlink-pairs")), "a6000-0")
    assert found.gpu_type == "A6000" and found.memory_gib == 48.0
    assert found.domains == ((0, 1), (2, 3))
    assert {(g, to) for g, _, to in found.nvlinks} == {(0, "gpu:1"), (1, "gpu:0"), (2, "gpu:3"), (3, "gpu:2")}
    assert found.warnings == ()
    assert found.node_entry()["nvlink_domains"] == [[0, 1], [2, 3]]


def test_pcie_only_node_has_no_nvlink_domains():
    found = discover(RecordedNvml(answers("l4-pcie")), "l4-0")
    assert found.gpu_type == "L4" and found.domains == ((0,), (1,), (2,), (3,))
    assert found.nvlinks == () and found.warnings == ()
    assert found.node_entry()["nvlink_domains"] == []


@pytest.mark.parametrize("name", ["hgx-h100-nvswitch", "a6000-nvlink-pairs", "l4-pcie"])
def test_record_replays_to_the_same_answers(name):
    assert record(RecordedNvml(answers(name))) == answers(name)


def test_p2p_without_a_link_is_a_warning():
    data = answers("a6000-nvlink-pairs")
    for gpu in (2, 3):  # the bridge of 2-3 is down; the driver still reports NVLink P2P
        for link in data["gpus"][gpu]["nvlinks"].values():
            if "value" in link["state"]:
                link["state"] = {"value": 0}
    found = discover(RecordedNvml(data), "n")
    assert found.domains == ((0, 1), (2,), (3,))
    assert any("NVLink P2P between GPUs 2 and 3 but no active link" in w for w in found.warnings)


def test_a_chain_of_links_is_one_domain_with_a_warning():
    data = answers("a6000-nvlink-pairs")
    data["gpus"] = copy.deepcopy(data["gpus"][:3])
    bus = [g["pci"] for g in data["gpus"]]
    # links: 0-1 (as recorded) and a new 1-2 on GPU 1's links 2, 3 and GPU 2's links 0, 1
    for link in ("2", "3"):
        data["gpus"][1]["nvlinks"][link]["remote_pci"] = {"value": bus[2]}
    for link in ("0", "1"):
        data["gpus"][2]["nvlinks"][link]["remote_pci"] = {"value": bus[1]}
    for link in ("2", "3"):
        data["gpus"][2]["nvlinks"][link]["state"] = {"value": 0}
    for i, gpu in enumerate(data["gpus"]):
        gpu["p2p_nvlink"] = {str(j): {"value": 0 if abs(i - j) == 1 else 5} for j in range(3) if j != i}
    found = discover(RecordedNvml(data), "n")
    assert found.domains == ((0, 1, 2),)
    assert any("GPUs 0 and 2 share NVLink domain [0, 1, 2]" in w for w in found.warnings)


def test_switch_links_without_type_or_bus_id_still_join_one_domain():
    data = answers("hgx-h100-nvswitch")
    for gpu in data["gpus"]:
        for link in gpu["nvlinks"].values():
            link["remote_type"] = {"error": "NotSupported"}
            link["remote_pci"] = {"error": "NotSupported"}
    found = discover(RecordedNvml(data), "n")
    assert found.domains == ((0, 1, 2, 3, 4, 5, 6, 7),)


def test_remote_type_unsupported_but_bus_id_of_a_local_gpu_is_a_gpu_link():
    data = answers("a6000-nvlink-pairs")
    for gpu in data["gpus"]:
        for link in gpu["nvlinks"].values():
            if "remote_type" in link:
                link["remote_type"] = {"error": "FunctionNotFound"}
    assert discover(RecordedNvml(data), "n").domains == ((0, 1), (2, 3))


def test_mixed_gpu_models_are_refused():
    data = answers("l4-pcie")
    data["gpus"][3]["name"] = "NVIDIA L40S"
    with pytest.raises(NvmlUnavailableError, match="different models"):
        discover(RecordedNvml(data), "n")


@pytest.mark.parametrize("error", ["LibraryNotFound", "DriverNotLoaded"])
def test_no_nvml_is_a_clear_error(error):
    with pytest.raises(NvmlUnavailableError, match="NVML is not available here") as caught:
        discover(RecordedNvml({"init_error": error, "gpus": []}), "n")
    assert caught.value.exit_code == 2


def test_no_gpu_is_a_clear_error():
    with pytest.raises(NvmlUnavailableError, match="no GPU"):
        discover(RecordedNvml({"gpus": []}), "n")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("NVIDIA H100 80GB HBM3", "H100"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA H100 NVL", "H100-NVL"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100-PCIe"),
        ("NVIDIA RTX A6000", "A6000"),
        ("NVIDIA RTX 6000 Ada Generation", "RTX-6000-Ada"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("Tesla V100-SXM2-16GB", "V100"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H200", "H200"),
    ],
)
def test_gpu_type_names(name, expected):
    assert gpu_type_name(name) == expected


def test_cli_without_nvml_exits_2_with_one_line():
    result = scepsy("topology")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "NVML is not available here" in lines[0] and "Traceback" not in result.stderr


def test_cli_replay_writes_a_node_entry_that_plans(tmp_path, write_instance):
    node_file = tmp_path / "node.yaml"
    answers_file = tmp_path / "answers.json"
    result = scepsy(
        "topology", "--replay", FIXTURES / "a6000-nvlink-pairs.json", "--node-name", "a6000-7",
        "--out", node_file, "--record", answers_file,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == node_file.read_text()
    assert json.loads(answers_file.read_text()) == answers("a6000-nvlink-pairs")
    fragment = yaml.safe_load(node_file.read_text())

    def mutate(doc):
        doc["cluster"]["gpu_types"] = fragment["gpu_types"]
        doc["cluster"]["nodes"] = fragment["nodes"]

    instance = load_instance(write_instance(mutate))
    (node,) = instance.cluster.nodes
    assert node.name == "a6000-7" and node.domains == ((0, 1), (2, 3)) and node.gpu_uuids is not None and node.gpu_uuids[3].startswith("GPU-a6000003")
    planned = scepsy("plan", instance.source, "--json")
    assert planned.returncode == 0, planned.stderr
    assert {p["node"] for p in json.loads(planned.stdout)["placement"]} == {"a6000-7"}


def test_cli_json_and_warnings(tmp_path):
    data = answers("a6000-nvlink-pairs")
    for gpu in (2, 3):
        for link in data["gpus"][gpu]["nvlinks"].values():
            if "value" in link["state"]:
                link["state"] = {"value": 0}
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(data))
    result = scepsy("topology", "--replay", path, "--node-name", "n", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert out["nodes"][0]["nvlink_domains"] == [[0, 1]] and out["warnings"]
    assert "warning: NVML reports NVLink P2P between GPUs 2 and 3" in result.stderr


@pytest.mark.parametrize("field, mutate, says", [
    ("format", lambda a: a.update(format="nvidia-smi/2"), "format: 'nvidia-smi/2' is not 'scepsy-nvml-answers/1'"),
    ("memory", lambda a: a["gpus"][1].update(memory_total_bytes=-5), "gpus[1].memory_total_bytes: -5 is not a positive number of bytes"),
    ("memory zero", lambda a: a["gpus"][0].update(memory_total_bytes=0), "gpus[0].memory_total_bytes: 0 is not"),
])
def test_cli_refuses_answers_of_another_format_or_without_memory_with_one_line(tmp_path, field, mutate, says):
    recorded = answers("l4-pcie")
    mutate(recorded)
    path = tmp_path / "answers.json"
    path.write_text(json.dumps(recorded))
    result = scepsy("topology", "--replay", path, "--json")
    assert result.returncode == 2, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and says in lines[0] and "scepsy topology --record" in lines[0], lines
    assert result.stdout == ""
