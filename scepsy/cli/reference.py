"""The command reference, docs/cli.md, generated from the command line itself so that it cannot
drift from `scepsy COMMAND --help` (tests/test_docs.py regenerates it and compares):

    python -m scepsy.cli.reference docs/cli.md
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from pathlib import Path
from typing import Any, Iterator

import typer

import scepsy.cli  # noqa: F401 - registers every command
from scepsy.cli.app import app

REGENERATE = "python -m scepsy.cli.reference docs/cli.md"

HEADER = f"""# Command reference

Generated from the command line (`{REGENERATE}`);
`scepsy COMMAND --help` prints the same. Every command is one function of the Python API
(`scepsy/api/`, named under each command), so a notebook does what a command does.
`python -m scepsy` is the same command.
"""

BEHAVIOUR = """## Exit codes, output and inputs

Every command prints readable tables by default and machine output with `--json`; `--out` writes
the JSON (or the table, the profile, the manifests) to a file.

- `0` success.
- `2` bad input, with one plain line naming the file, the field (or the option) and the fix; also
  an LLM whose weights cannot fit the memory any configuration gives it (the instance asks for the
  impossible). A command whose optional dependency is missing says which extra to install.
- `3` no feasible plan or placement, with the binding reason (a throughput that cannot be met even
  with all GPUs, the GPUs the LLMs need together, an SLO, placement), or no plan within the time
  limit: `--time-limit-s` counts from the command's start, before the instance is read (reading
  the instance, loading its profiles and building the options are inside it); the line names the
  step, says the instance is too large for the limit and to raise it or plan a smaller instance
  (docs/model.md, "Time limits").
- `1` internal error (`SCEPSY_DEBUG=1` shows a traceback).

Inputs are read only from regular files (a FIFO or a device such as `/dev/zero` is refused) of at
most `SCEPSY_MAX_INPUT_MIB` MiB (default 1024); YAML and JSON keys must be unique and numbers
finite; an output path that is also an input of the command (`traces export X.db --out X.db`) or a
directory is refused. A simulation's memory does not grow with `--duration-s` (streamed
statistics, docs/simulation.md); its work is bounded to 100,000,000 LLM calls, and `--calls-out`
to 1,000,000 (a `--duration-s` past those is refused). The tracing proxy stores bodies up to
`--max-body-mib` (default 16; larger ones only by size) and answers 400 to an
`X-Workflow-Id`/`X-Workflow-Name` that is not short UTF-8 text.
"""

KINDS = {Path: "path", str: "text", int: "integer", float: "number", bool: "flag"}


def commands(group: Any = None, path: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """(path, command) of every command, in the order `scepsy --help` lists them."""
    group = typer.main.get_command(app) if group is None else group
    for name, command in group.commands.items():
        if hasattr(command, "commands"):
            yield from commands(command, path + (name,))
        else:
            yield " ".join(path + (name,)), command


def api_function(command: Any) -> str:
    """The scepsy.api function the command calls: its `api.NAME(` call of one of api.OPERATIONS
    (tests/test_cli_api.py checks there is exactly one)."""
    import ast
    import textwrap

    from scepsy.api import OPERATIONS

    source = textwrap.dedent(inspect.getsource(inspect.unwrap(command.callback)))
    called = [node.func.attr for node in ast.walk(ast.parse(source))
              if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "api"]
    return next((name for name in called if name in OPERATIONS), "-")


def _kind(annotation: Any) -> str:
    """What a parameter takes, from its Python type: path, text, integer, number or flag."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):  # Optional[X]: X
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    repeated = typing.get_origin(annotation) is list
    if repeated:
        annotation = typing.get_args(annotation)[0]
    kind = KINDS.get(annotation, getattr(annotation, "__name__", str(annotation)))
    return f"{kind}, repeatable" if repeated else kind


def _range(param: Any) -> str:
    low = getattr(param, "min", None)
    high = getattr(param, "max", None)
    if low is None and high is None:  # click keeps the range on the type
        low, high = getattr(getattr(param, "type", None), "min", None), getattr(getattr(param, "type", None), "max", None)
    if low is not None and high is not None:
        return f" {low:g} to {high:g}"
    return f" >= {low:g}" if low is not None else (f" <= {high:g}" if high is not None else "")


def _default(param: Any) -> str:
    if param.required:
        return "required"
    default = param.default
    if param.secondary_opts and isinstance(default, bool):
        return f"`{(param.opts if default else param.secondary_opts)[0]}`"
    if default is None or default is False or default == [] or default == ():
        return ""
    return f"`{default}`"


def _cell(text: str | None) -> str:
    return " ".join((text or "").split()).replace("|", "\\|")


def command_section(path: str, command: Any) -> str:
    hints = typing.get_type_hints(inspect.unwrap(command.callback))
    arguments = [p for p in command.params if p.param_type_name == "argument"]
    usage = " ".join(["scepsy", path, "[OPTIONS]"] + [p.name.upper() + ("..." if p.nargs == -1 else "") for p in arguments])
    rows = ["| argument or option | takes | default | what |", "|---|---|---|---|"]
    for param in command.params:
        name = param.name.upper() if param.param_type_name == "argument" else " / ".join(param.opts + param.secondary_opts)
        kind = "flag" if param.secondary_opts else _kind(hints.get(param.name)) + _range(param)
        rows.append(f"| `{name}` | {kind} | {_default(param)} | {_cell(param.help)} |")
    rows.append("| `--help` | flag | | Show the help and exit. |")
    return "\n".join([
        f"## `scepsy {path}`", "", _cell(command.help), "",
        "```", usage, "```", "",
        f"Python: `scepsy.api.{api_function(command)}`", "",
        *rows, "",
        *([_cell(command.epilog), ""] if command.epilog else []),  # what --help prints below the options
    ])


def reference() -> str:
    """docs/cli.md: what every command does, its options, and how commands end."""
    every = list(commands())
    index = ["| command | what it does |", "|---|---|"]
    index += [f"| [`scepsy {path}`](#scepsy-{path.replace(' ', '-')}) | {_cell(command.help)} |" for path, command in every]
    sections = [command_section(path, command) for path, command in every]
    return "\n".join([HEADER, *index, "", BEHAVIOUR, *sections]).rstrip("\n") + "\n"


def main(argv: list[str]) -> None:
    text = reference()
    if argv:
        Path(argv[0]).write_text(text)
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main(sys.argv[1:])
