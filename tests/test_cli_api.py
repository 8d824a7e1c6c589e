"""The command line is a thin adapter over `scepsy.api`: every command calls exactly one function of
it (found by walking the Typer application, checked both in the command's code and by running it),
imports nothing else of scepsy, and shows an error's argument names as its own options through the
one table `scepsy.cli.common.FLAGS`, while the API names them as its keyword arguments."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from scepsy import api
from scepsy.cli import app
from scepsy.cli.common import FLAGS, flag
from scepsy.models.errors import InputError, ScepsyError, too_large_for_limit

from conftest import INSTANCES, REPO

DEFAULT = str(INSTANCES / "beam-4xa6000.yaml")
runner = CliRunner()

# Each command: the one scepsy.api function it calls, and arguments that reach that call.
COMMANDS: dict[str, tuple[str, list[str]]] = {
    "plan": ("plan", [DEFAULT]),
    "place": ("place", [DEFAULT, "--allocation", "{tmp}/alloc.yaml"]),
    "predict": ("predict", [DEFAULT, "--allocation", "{tmp}/alloc.yaml"]),
    "whatif": ("whatif", [DEFAULT, "--rates", "2"]),
    "simulate": ("simulate_rates", [DEFAULT]),
    "sweep": ("sweep", [DEFAULT, "--rates", "1", "--out-csv", "{tmp}/s.csv", "--out-png", "{tmp}/s.png"]),
    "profile": ("replay_profile", ["--traces", "{tmp}/t.db", "--llm", "gen", "--endpoint", "http://127.0.0.1:9",
                                   "--gpu-type", "A6000", "--out", "{tmp}/p.csv"]),
    "proxy": ("proxy", ["--upstream", "gen=http://127.0.0.1:9", "--store", "{tmp}/t.db"]),
    "emulate": ("emulate", ["--model", "llama-3.2-1b", "--gpu", "L4"]),
    "aggregate": ("aggregate_traces", ["{tmp}/t.db"]),
    "topology": ("topology", []),
    "manifests": ("manifests", ["{tmp}/plan.json", "--out", "{tmp}/deploy"]),
    "deploy": ("deploy", ["{tmp}/deploy"]),
    "status": ("status", []),
    "profiles synthesize": ("synthesize_profile", ["--model", "llama-3.2-1b", "--gpu", "L4", "--out", "{tmp}/p.csv"]),
    "profiles import": ("import_profile", ["{tmp}/bench.json", "--gpu-type", "H100", "--out", "{tmp}/p.csv"]),
    "traces export": ("export_traces", ["{tmp}/t.db", "--out", "{tmp}/t.jsonl"]),
    "control": ("simulate_control", [DEFAULT, "--plan", "{tmp}/alloc.yaml", "--simulate", "--arrivals", "{tmp}/alloc.yaml"]),
}
# A command with modes calls one function per mode: its other modes (function, arguments that reach it)
MODES = {
    "control": [("control", [DEFAULT, "--plan", "{tmp}/alloc.yaml", "--prometheus-url", "http://127.0.0.1:9"])],
}
# What a command may use besides its one function: the documents and views it prints, and the
# settings it passes (built and checked by the API).
HELPERS = {
    "plan_document", "placement_document", "prediction_document", "simulation_document", "stats_document",
    "plan_view", "placement_view", "prediction_view", "simulation_view", "stats_view",
    "study_document", "sweep_document", "synthesis_document", "replay_document", "topology_document",
    "manifests_document", "deployed_document", "status_document", "control_simulation_document", "control_run_document",
    "study_view", "sweep_view", "replay_view", "recorded_view", "manifests_view", "deployed_view", "status_view",
    "control_simulation_view",
    "placement_settings", "simulation_settings", "replay_settings", "emulator_config", "control_settings",
    "SimulationSettings", "SynthesisSettings", "ManifestSettings", "manifest_settings", "controller_settings",
    "live_control_settings",
}
ADD_A_COMMAND = ("add it to COMMANDS in tests/test_cli_api.py: the one scepsy.api function it calls and arguments "
                 "that reach that call")


def commands() -> dict[str, Any]:
    """Every command of the application by its path (`plan`, `profiles synthesize`)."""
    found: dict[str, Any] = {}

    def walk(command: Any, path: tuple[str, ...]) -> None:
        if hasattr(command, "commands"):  # a group (typer vendors click: no isinstance against click)
            for name, sub in command.commands.items():
                walk(sub, path + (name,))
        else:
            found[" ".join(path)] = command

    walk(typer.main.get_command(app), ())
    return found


def operations() -> set[str]:
    """The API's functions that do work (a command's, or a step of one such as `load`): its public
    callables but the helpers."""
    return {name for name in api.__all__ if name not in HELPERS and callable(getattr(api, name))}


def options(command: Any) -> set[str]:
    """How a user names each parameter of a command: its options, or an argument's metavar."""
    names: set[str] = set()
    for param in command.params:
        if param.param_type_name == "argument":
            names.add(param.name.upper())
        else:
            names.update(param.opts)
            names.update(param.secondary_opts)
    return names


def test_every_command_is_listed():
    walked = set(commands())
    assert walked, "found no commands"
    assert not walked - set(COMMANDS), f"commands without an entry: {sorted(walked - set(COMMANDS))}; {ADD_A_COMMAND}"
    assert not set(COMMANDS) - walked, f"entries of no command: {sorted(set(COMMANDS) - walked)}"
    assert HELPERS <= set(api.__all__), sorted(HELPERS - set(api.__all__))
    assert {function for function, _ in COMMANDS.values()} <= set(api.OPERATIONS) <= operations()


def _api_calls(function: Any) -> list[str]:
    """The names of the `api.NAME(...)` calls in a function's code, nested functions included."""
    tree = ast.parse(_dedented(function))
    return [node.func.attr for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "api"]


def _dedented(function: Any) -> str:
    return textwrap.dedent(inspect.getsource(function))


@pytest.mark.parametrize("path", sorted(COMMANDS))
def test_the_code_of_a_command_calls_one_api_function(path):
    function = inspect.unwrap(commands()[path].callback)
    calls = [name for name in _api_calls(function) if name not in HELPERS]
    expected = sorted([COMMANDS[path][0], *(name for name, _ in MODES.get(path, []))])
    assert sorted(calls) == expected, f"{path} calls {calls} of scepsy.api besides its documents and views"
    tree = ast.parse(_dedented(function))
    imports = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]
    assert all(isinstance(node, ast.ImportFrom) and node.module == "scepsy" and [a.name for a in node.names] == ["api"]
               for node in imports), f"{path} imports more than `from scepsy import api`"


def test_the_command_modules_import_only_the_api():
    """Commands reach the packages only through scepsy.api; the shared module also uses the error
    classes and the output writer."""
    for path in sorted((REPO / "scepsy" / "cli").glob("*.py")):
        allowed = {"scepsy", "scepsy.api", "scepsy.models.errors"} | ({"scepsy.models.output"} if path.name == "common.py" else set())
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                if name.startswith("scepsy") and not name.startswith("scepsy.cli"):
                    assert name in allowed, f"{path.name} imports {name}"


class Reached(Exception):
    """Raised by a stand-in of an API function: the command got there."""


@pytest.fixture
def files(tmp_path):
    (tmp_path / "alloc.yaml").write_text("llms:\n  - {name: gen, gpu_type: A6000, tp: 1, fraction: 0.5, replicas: 2}\n"
                                         "  - {name: ver, gpu_type: A6000, tp: 2, fraction: 1.0, replicas: 1}\n")
    return tmp_path


@pytest.mark.parametrize("path, mode", [(path, 0) for path in sorted(COMMANDS)] + [(path, k + 1) for path, modes in sorted(MODES.items()) for k in range(len(modes))])
def test_running_a_command_calls_its_api_function_first(path, mode, files, monkeypatch):
    """Every API function is replaced by a stand-in that records its name and stops the command:
    the first (and so only) one reached is the command's own (in each of its modes)."""
    called: list[str] = []
    for name in operations():
        def stand_in(*args: object, _name: str = name, **kwargs: object) -> None:
            called.append(_name)
            raise Reached(_name)

        monkeypatch.setattr(api, name, stand_in)
    function, arguments = COMMANDS[path] if mode == 0 else MODES[path][mode - 1]
    result = runner.invoke(app, path.split() + [a.format(tmp=files) for a in arguments])
    assert called == [function], f"{path}: {called}; output: {result.output}"
    assert result.exit_code == 1 and "internal error: Reached" in result.output


def test_every_flag_in_the_table_is_an_option_of_a_command():
    every = commands()
    everywhere = set().union(*(options(command) for command in every.values()))
    for key, shown in FLAGS.items():
        command, _, field = key.rpartition(" ")
        assert field.isidentifier(), key
        if command:
            assert command in every, f"FLAGS[{key!r}]: no command {command!r}"
            assert shown in options(every[command]), f"FLAGS[{key!r}] = {shown!r} is not an option of {command}"
        else:
            assert shown in everywhere, f"FLAGS[{key!r}] = {shown!r} is no command's option"


def test_a_parameter_named_like_an_argument_shows_as_that_parameter():
    """Where a command's parameter has an argument's name, the table gives that parameter's own
    option (or the command has its own entry): `instance` is INSTANCE for `plan`, --instance for
    `manifests`."""
    for path, command in commands().items():
        for param in command.params:
            if param.name in FLAGS:
                assert flag(param.name, path) in options(command) and (
                    param.param_type_name == "argument" or flag(param.name, path) in param.opts), (path, param.name)


# --------------------------------------------------------------------------------------------
# What a library error names


def _string_constants(tree: ast.AST) -> list[tuple[str, bool]]:
    """(string constant, whether it is an element of a list or tuple literal: a command line of
    another program), docstrings left out."""
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    listed = {id(element) for node in ast.walk(tree) if isinstance(node, (ast.List, ast.Tuple)) for element in node.elts}
    return [(node.value, id(node) in listed) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def library_files() -> list[Path]:
    files = [path for package in ("models", "planner", "placement", "k8s", "tracing") for path in sorted((REPO / package).rglob("*.py"))]
    return files + sorted((REPO / "scepsy" / "api").glob("*.py")) + [REPO / "scepsy" / "pipeline.py"]


# the position of the argument name in calls that take one (InputError: when its file is None)
FIELD_POSITION = {"check_finite": 1, "check_fraction": 1, "check_choice": 2, "check_output": 2, "check_output_dir": 2,
                  "writing": 1, "write_text": 2, "parse_values": 1, "parse_named": 1, "EngineModelUnavailable": 0}


def argument_names() -> dict[str, str]:
    """Argument names the library puts in errors: literal fields of argument errors, and names in
    backquotes in its strings; with a file that uses each."""
    found: dict[str, str] = {}
    for path in library_files():
        tree = ast.parse(path.read_text())
        where = str(path.relative_to(REPO))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            position = FIELD_POSITION.get(name)
            if name == "InputError" and len(node.args) > 1:
                argument = any(k.arg == "argument" for k in node.keywords) or (
                    isinstance(node.args[0], ast.Constant) and node.args[0].value is None)
                position = 1 if argument else None
            given = node.args[position] if position is not None and len(node.args) > position else None
            if isinstance(given, ast.Constant) and isinstance(given.value, str):
                found.setdefault(given.value, where)
        for text, _ in _string_constants(tree):
            for mention in re.findall(r"`([a-z][a-z0-9_]*)`", text):
                found.setdefault(mention, where)
    return found


def test_every_argument_name_the_library_uses_has_an_option():
    names = argument_names()
    assert {"clusters", "backend", "time_limit_s", "engine_model"} <= set(names)  # the scan finds them
    missing = {name: where for name, where in names.items() if not any(key.rpartition(" ")[2] == name for key in FLAGS)}
    assert not missing, f"argument names without an option in scepsy/cli/common.py FLAGS: {missing}"


def test_no_library_message_names_an_option_of_the_command_line():
    """Library text names arguments (`clusters`), never options (--clusters), except in a
    backquoted `scepsy COMMAND ...` line and in command lines of other programs (list elements,
    helm's --namespace)."""
    every = set().union(*(options(command) for command in commands().values()))
    others = {("k8s/sharing.py", "--namespace")}  # helm's, in the install hint
    for path in library_files():
        where = str(path.relative_to(REPO))
        for constant, in_list in _string_constants(ast.parse(path.read_text())):
            if in_list:
                continue
            text = re.sub(r"`scepsy [^`]*`", "", constant)
            for option in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text):
                assert option not in every or (where, option) in others, f"{where}: {constant!r} names {option}"


CASES = [  # (API call, command line, the argument's name, its option)
    (lambda: api.whatif(DEFAULT, rates="2", clusters="5"), ["whatif", DEFAULT, "--rates", "2", "--clusters", "5"], "clusters", "--clusters"),
    (lambda: api.plan(DEFAULT, backend="nope"), ["plan", DEFAULT, "--backend", "nope"], "backend", "--backend"),
    (lambda: api.emulator_config("llama-3.1-8b", "H100", tp=3), ["emulate", "--model", "llama-3.1-8b", "--gpu", "H100", "--tp", "3"], "tp", "--tp"),
    (lambda: api.simulation_settings(routing="x"), ["simulate", DEFAULT, "--routing", "x"], "routing", "--routing"),
]


@pytest.mark.parametrize("call, args, field, option", CASES, ids=[case[2] for case in CASES])
def test_an_error_names_the_argument_in_the_api_and_the_option_on_the_command_line(call, args, field, option):
    with pytest.raises(InputError) as raised:
        call()
    assert raised.value.field == field and f"{field}: " in str(raised.value) and option not in str(raised.value)
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.output.startswith("error: ") and f"{option}: " in result.output, result.output
    assert f"{field}: " not in result.output.replace(f"{option}: ", "")


def test_an_argument_named_in_the_text_is_shown_as_its_option():
    with pytest.raises(InputError) as raised:
        api.whatif(DEFAULT, rates="2", address="tcp://127.0.0.1:1")
    assert raised.value.field == "address" and "`executor`" in str(raised.value) and "--" not in str(raised.value)
    result = runner.invoke(app, ["whatif", DEFAULT, "--rates", "2", "--address", "tcp://127.0.0.1:1"])
    assert result.exit_code == 2 and "error: --address: " in result.output and "--executor dask" in result.output
    assert "`" not in result.output


def test_a_time_limit_names_its_argument():
    error = too_large_for_limit("reading the instance")
    assert "raise `time_limit_s`" in str(error)
    assert "raise --time-limit-s" in error.render(flag)
    assert "raise --placement-time-limit-s" in too_large_for_limit("placing", "placement_time_limit_s").render(flag)


def test_a_file_field_keeps_its_name():
    """A field of a file is not an argument: `placement` of a plan file stays `placement`."""
    error = InputError("plan.json", "placement", "no placement list")
    assert error.render(flag) == "plan.json: placement: no placement list"
    assert InputError(None, "placement", "unknown method").render(flag) == "--placement: unknown method"


@pytest.mark.parametrize("path, shown", [("profiles synthesize", "--gpu-type-name"), ("profiles import", "--gpu-type")])
def test_one_command_may_spell_an_argument_its_own_way(path, shown, files, monkeypatch):
    def refuse(*args: object, **kwargs: object) -> None:
        raise InputError(None, "gpu_type", "is empty", "give a GPU type name")

    monkeypatch.setattr(api, COMMANDS[path][0], refuse)
    result = runner.invoke(app, path.split() + [a.format(tmp=files) for a in COMMANDS[path][1]])
    assert result.exit_code == 2 and result.output.startswith(f"error: {shown}: is empty; fix:"), result.output


def test_every_error_renders():
    """The CLI's renderer works for every error class (no message loses its text)."""
    for error in (ScepsyError("plain `rates`"), InputError(None, None, "bare")):
        assert error.render(flag) in ("plain --rates", "bare")
