"""The public Python API (`from scepsy import plan, place, predict, simulate`), the one output
writer (every output path of the CLI: exit 2 with one line when it cannot be written), `python -m
scepsy`, and the optional dependencies that the core install leaves out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib

import pytest
from typer.testing import CliRunner

import scepsy
from scepsy import place, plan, predict, simulate
from scepsy.cli import app
from scepsy.models.plan.document import plan_json
from scepsy.models.simulation.simulator import SimulationSettings
from scepsy.tracing.capture.store import write_store

from conftest import INSTANCES, REPO
from test_replay import beam_trace

DEFAULT = INSTANCES / "beam-4xa6000.yaml"
runner = CliRunner()


def test_the_api_answers_what_the_commands_answer(tmp_path):
    planned = plan(DEFAULT)
    out = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(DEFAULT), "--out", str(out)]).exit_code == 0
    written = json.loads(out.read_text())
    assert written["llms"] == plan_json(planned)["llms"] and written["placement"] == plan_json(planned)["placement"]

    placed = place(DEFAULT, out)  # a plan JSON is an allocation too
    assert placed.placement == planned.placement
    predicted = predict(DEFAULT, planned.allocation)
    assert predicted.workflow("beam").latency_s == pytest.approx(planned.prediction.workflow("beam").latency_s)
    simulated = simulate(DEFAULT, planned.allocation, rate_rps=1.0, settings=SimulationSettings(duration_s=20.0))
    assert [w.name for w in simulated.workflows] == ["beam"] and simulated.workflows[0].completed > 0


def test_a_milp_plan_leaves_stdout_where_it_was(capfd):
    """The MILP backend silences HiGHS's banner on file descriptor 1 while the reference problems
    are solved side by side on two threads (combined-8xh100 is egalitarian): afterwards, what the
    caller prints still arrives (not /dev/null)."""
    before = os.fstat(1)
    planned = plan(INSTANCES / "combined-8xh100.yaml", backend="milp")
    after = os.fstat(1)
    assert (after.st_dev, after.st_ino) == (before.st_dev, before.st_ino)
    print(f"objective_value {planned.objective_value}", flush=True)
    assert capfd.readouterr().out == f"objective_value {planned.objective_value}\n"


def test_one_writer_for_planned_and_placed_documents(tmp_path):
    """`scepsy plan` and `scepsy place` write one document format (models/plan/document.py): a
    planned one begins with how it was solved, a placed one with the instance; both read back."""
    from scepsy import api
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.plan.document import read_allocation, read_current

    planned = plan(DEFAULT)
    placed = place(DEFAULT, planned.allocation)
    documents = {"plan": api.plan_document(planned), "place": api.placement_document(str(DEFAULT), planned.allocation, placed)}
    assert list(documents["place"]) == ["instance", "fractions_per_gpu", "llms", "placement_solver", "placement", "fragmentation"]
    assert list(documents["plan"])[:6] == ["status", "objective", "objective_value", "bound", "gap", "solver"]
    assert list(documents["plan"])[-3:] == ["llms", "placement", "fragmentation"]
    instance = load_instance(DEFAULT)
    placements = {"plan": planned.placement, "place": placed.placement}
    for name, document in documents.items():
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(document))
        assert read_allocation(path, instance) == planned.allocation, name
        assert read_current(path, instance) == placements[name], name


def test_profile_summaries_come_from_the_api(tmp_path):
    """`profiles synthesize --json` prints what api.synthesis_document(api.synthesize_profile(...)) gives."""
    from scepsy import api
    from scepsy.models.profiles.synthesize import SynthesisSettings

    out = tmp_path / "e5.csv"
    result = runner.invoke(app, ["profiles", "synthesize", "--model", "e5-base-v2", "--gpu", "A6000", "--tp", "1",
                                 "--fractions", "0.1,1.0", "--requests", "fixed:48,0", "--requests-per-point", "60",
                                 "--out", str(out), "--json"])
    assert result.exit_code == 0, result.output
    synthesized = api.synthesize_profile("e5-base-v2", "A6000", [1], [0.1, 1.0], "fixed:48,0",
                                         settings=SynthesisSettings(requests_per_point=60))
    assert json.loads(result.output) == api.synthesis_document(synthesized, out)
    assert synthesized.capacities_rps() and all(capacity > 0 for capacity in synthesized.capacities_rps().values())


def test_python_dash_m_scepsy_is_the_command():
    result = subprocess.run([sys.executable, "-m", "scepsy", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "plan" in result.stdout and "manifests" in result.stdout


@pytest.fixture
def blocked(tmp_path):
    """An output path that cannot be created: its parent is a regular file (also for root)."""
    wall = tmp_path / "a-file"
    wall.write_text("")
    return wall / "out"


def _one_line_exit_2(result, path) -> None:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and str(path) in lines[0] and "cannot write" in lines[0], result.output


@pytest.mark.parametrize("command", [
    ["plan", str(DEFAULT), "--out", "{out}.json"],
    ["predict", str(DEFAULT), "--allocation", "{allocation}", "--out", "{out}.json"],
    ["aggregate", "{traces}", "--out", "{out}.yaml"],
    ["traces", "export", "{traces}", "--format", "jsonl", "--out", "{out}.jsonl"],
])
def test_every_output_path_goes_through_the_writer(tmp_path, blocked, command):
    traces = tmp_path / "t.db"
    write_store(traces, beam_trace(2))
    args = [part.format(out=blocked, traces=traces, allocation="") for part in command]
    if command[0] == "predict":  # an allocation of the default instance
        allocation = tmp_path / "alloc.yaml"
        allocation.write_text("llms:\n  - {name: gen, gpu_type: A6000, tp: 1, fraction: 0.5, replicas: 2}\n"
                              "  - {name: ver, gpu_type: A6000, tp: 2, fraction: 1.0, replicas: 1}\n")
        args[args.index("--allocation") + 1] = str(allocation)
    result = runner.invoke(app, args)
    _one_line_exit_2(result, blocked)


def test_a_missing_extra_is_one_line_naming_the_extra():
    code = "import sys; sys.modules['kubernetes'] = None; from scepsy.cli import main; sys.argv = ['scepsy', 'status']; main()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "pip install 'scepsy[k8s]'" in result.stderr


def test_the_controller_without_its_extra_is_one_line_naming_it(tmp_path):
    plan = tmp_path / "plan.json"
    assert runner.invoke(app, ["plan", str(REPO / "instances" / "rag-4xa6000.yaml"), "--out", str(plan)]).exit_code == 0
    args = ["scepsy", "control", str(REPO / "instances" / "rag-4xa6000.yaml"), "--plan", str(plan), "--simulate", "--arrivals", "azure:conv"]
    code = f"import sys; sys.modules['scipy'] = None; sys.modules['filterpy'] = None; from scepsy.cli import main; sys.argv = {args!r}; main()"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and "pip install 'scepsy[control]'" in result.stderr


def test_the_core_install_leaves_the_optional_dependencies_out():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    core = " ".join(project["dependencies"]).lower()
    for optional in ("langgraph", "openai", "kubernetes", "vllm", "torch", "filterpy", "scipy"):
        assert optional not in core
    extras = project["optional-dependencies"]
    assert {"tracing", "k8s", "examples", "dask", "control", "vllm", "test"} <= set(extras)
    assert "scepsy[tracing,k8s,examples,dask,control]" in extras["test"]  # the README's test command sets up everything


def test_the_api_is_typed_for_static_tools():
    assert (REPO / "scepsy" / "py.typed").is_file()
    assert scepsy.__all__ == ["plan", "place", "predict", "simulate"]


@pytest.mark.parametrize("settings, field", [
    ({"period_s": 0.0}, "period_s"),
    ({"period_s": float("nan")}, "period_s"),
    ({"startup_s": -1.0}, "startup_s"),
    ({"predictor": "oracle"}, "predictor"),
])
def test_the_controller_settings_are_checked_once_naming_the_knob(settings, field):
    """ControlSettings checks its knobs (control/policy.py); the API names the knob that is out of
    range, whichever it is (the command's options bound the numbers themselves)."""
    from scepsy import api
    from scepsy.models.errors import InputError

    with pytest.raises(InputError) as raised:
        api.control_settings(**settings)
    assert raised.value.field == field and str(raised.value).startswith(f"{field}: ")


def test_the_command_names_an_unknown_predictor(tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text("{}")
    result = runner.invoke(app, ["control", str(DEFAULT), "--plan", str(plan), "--simulate", "--arrivals", "azure:conv",
                                 "--predictor", "oracle"])
    assert result.exit_code == 2 and result.output.startswith("error: --predictor: unknown predictor 'oracle'"), result.output
