"""Every command's help is printed as written: the extras it names (`pip install 'scepsy[tracing]'`)
reach the terminal, not taken for markup and dropped."""

from __future__ import annotations

import re
import tomllib
from typing import Any, Iterator

import pytest
import typer
from typer.testing import CliRunner

import scepsy.cli  # noqa: F401 - registers every command
from conftest import REPO
from scepsy.cli.app import app

EXTRAS = sorted(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group under `command`, with the words that invoke it (typer vendors click:
    a group is what has commands)."""
    yield path, command
    if hasattr(command, "commands"):
        for name, sub in sorted(command.commands.items()):
            yield from commands(sub, path + (name,))


COMMANDS = list(commands(typer.main.get_command(app)))


def source_help(command: Any) -> str:
    """The help as the source writes it: the command's own and its parameters'."""
    texts = [command.help or "", command.epilog or ""]
    texts += [getattr(param, "help", None) or "" for param in command.params]
    return " ".join(texts)


def mentions(text: str, extra: str) -> int:
    return len(re.findall(rf"(?<![\w-]){re.escape(extra)}(?![\w-])", text))


def test_every_command_is_walked():
    names = {" ".join(path) for path, _ in COMMANDS}
    assert {"", "plan", "profiles", "profiles synthesize", "traces export", "aggregate"} <= names
    assert "aiconfigurator" in EXTRAS and "tracing" in EXTRAS


@pytest.mark.parametrize("path,command", COMMANDS, ids=[" ".join(path) or "scepsy" for path, _ in COMMANDS])
def test_help_shows_every_extra_it_names(path, command):
    result = CliRunner().invoke(app, [*path, "--help"], terminal_width=100)
    assert result.exit_code == 0, result.output
    rendered = " ".join(result.stdout.split())
    written = " ".join(source_help(command).split())
    for extra in EXTRAS:
        assert mentions(rendered, extra) >= mentions(written, extra), (extra, rendered)
    for install in re.findall(r"scepsy\[[\w,]+\]", written):
        assert install in rendered, (install, rendered)


def test_the_engine_model_help_says_what_to_install():
    rendered = " ".join(CliRunner().invoke(app, ["profiles", "synthesize", "--help"], terminal_width=100).stdout.split())
    assert "pip install 'scepsy[aiconfigurator]'" in rendered
