"""The documentation is for users and says what is true now: no issue numbers, commit ids or
"before" figures in the docs, the READMEs or code comments (history belongs in commit messages);
every repository path it names exists; the command reference is generated from the command line;
the README is a front door with the two set-up commands CI runs."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path
from typing import Iterator

import pytest

from scepsy.cli.reference import REGENERATE, reference

from conftest import REPO

HISTORY = {
    "an issue number": re.compile(r"(?i)\b(?:issues?|PR|pull request)\s*#?\d+"),
    "an issue reference": re.compile(r"(?<![\w/.-])#\d{1,5}\b"),  # owner/repo#123 of another project is fine
    "a commit id": re.compile(r"(?<![\w/.:@=-])(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w/-])"
                              r"|(?i:\b(?:commit|main(?: at)?)\s+[0-9a-f]{7,40}\b)"),
    "a before figure": re.compile(r"(?i)\(before[:,)]|\bbefore: |\bbefore / now\b|\bas before:"),
    "a previous version": re.compile(r"(?i)\bpreviously\b|\bprevious (?:model|measurement|run|figures?|profiles|split)\b"),
    "a was-now figure": re.compile(r"(?i)\bwas [^;:]{1,40}?, now\b|,\s*was\s+[-+]?\d"),
    "a change history": re.compile(r"(?i)\b(?:before|after) (?:the|this|that) (?:fix|change|regeneration|merge)\b"
                                   r"|\bbefore issue\b|\bbefore (?:the|this|that|it)\b[^.;]{0,50}\b(?:was|were) (?:streamed|fixed|added)\b"),
}

# Paths of other projects that the docs cite in the form the path takes there.
OTHER_PROJECTS = {"docs/supported_models/rerank_models.md"}  # SGLang's documentation
PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)+[\w.-]+\.(?:py|md))\b")
TOP_FOLDERS = {"models", "planner", "placement", "k8s", "tracing", "scepsy", "docs", "tests", "bench", "instances",
               "notebooks", "examples", ".ci", "control"}


def documents() -> list[Path]:
    return sorted(REPO.glob("docs/**/*.md")) + [REPO / "README.md"] + sorted(REPO.glob("*/README.md"))


def python_files() -> list[Path]:
    """Our Python files, each once (scepsy/models and the like are links to the top-level folders)."""
    skip = {".venv", "build", "dist", ".git"}
    files = []
    for path in sorted(REPO.rglob("*.py")):
        parts = path.relative_to(REPO).parts
        if parts[0] in skip or parts[0].startswith(".") and parts[0] != ".ci" or "site-packages" in parts:
            continue
        if parts[0] == "scepsy" and len(parts) > 2 and (REPO / "scepsy" / parts[1]).is_symlink():
            continue
        files.append(path)
    return files


def comments_and_docstrings(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of every comment and docstring line of a Python file."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            docstring = ast.get_docstring(node, clean=False)
            if docstring:
                first = node.body[0].lineno
                for offset, line in enumerate(docstring.splitlines()):
                    yield first + offset, line


def prose() -> Iterator[tuple[str, int, str]]:
    """(file, line, text) of the docs, the READMEs, and the comments and docstrings of the code."""
    for path in documents():
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            yield str(path.relative_to(REPO)), number, line
    for path in python_files():
        for number, line in comments_and_docstrings(path):
            yield str(path.relative_to(REPO)), number, line


def history_in(text: str) -> list[str]:
    return [f"{what} ({match.group(0)!r})" for what, pattern in HISTORY.items() for match in [pattern.search(text)] if match]


def test_the_history_patterns_catch_history_and_leave_facts():
    caught = [
        "## 4. Unprofiled GPU fractions (issue 13)", "as issue 12 found", "see #1257", "main fd64b59",
        "Before that regeneration (commit 8926863)", "26 solved (before: 39, 13, 28)", "keeping every call, as before: 55",
        "the previous model: 13.7%", "previously 4.2 s", "at 80%: 10.5 requests/s, was 10.8, now 10.5", "(beam-4xa6000 at 80%: 10.5 requests/s, was 10.8)",
        "before this change (main at fd64b59) and now", "it went to /dev/null before the fix",
        "Before the statistics were streamed, every call was kept",
    ]
    facts = [
        "kubernetes-sigs/dra-driver-nvidia-gpu#534 (merged 2025-09-04)", "`@sha256:" + "ab12" * 16 + "`",
        "GPU-5e2c0000-7d1a-4c3b-9f0e-1a2b3c4d0000", "before the command's clock starts", "the previous scenario's optimum",
        "decoded 512 tokens before the deadline", "a request 1.25x apart", "uid 4b6f1c1e-0000-4000", "#!/usr/bin/env bash",
    ]
    assert [text for text in caught if not history_in(text)] == []
    assert {text: history_in(text) for text in facts if history_in(text)} == {}


def test_no_history_in_the_docs_the_readmes_or_code_comments():
    found = [f"{where}:{number}: {', '.join(history_in(text))}: {text.strip()[:100]}"
             for where, number, text in prose() if history_in(text)]
    assert not found, "say what is true now (history belongs in commit messages):\n" + "\n".join(found)


def test_every_repository_path_the_docs_and_docstrings_name_exists():
    missing = []
    for path in documents() + python_files():
        text = path.read_text() if path.suffix == ".md" else "\n".join(line for _, line in comments_and_docstrings(path))
        for match in PATH.finditer(text):
            named = match.group(1)
            if named.split("/")[0] in TOP_FOLDERS and named not in OTHER_PROJECTS and not (REPO / named).exists():
                missing.append(f"{path.relative_to(REPO)}: {named}")
    assert not missing, "paths that do not exist:\n" + "\n".join(sorted(set(missing)))


def test_the_command_reference_is_generated_from_the_command_line():
    written = (REPO / "docs" / "cli.md").read_text()
    assert written == reference(), f"docs/cli.md differs from the command line; regenerate it with `{REGENERATE}`"


def test_the_command_reference_names_every_command_and_option():
    """The generator is no stub: every command's section lists each of its options."""
    from scepsy.cli.reference import commands

    text = reference()
    for path, command in commands():
        section = text.split(f"## `scepsy {path}`\n", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            name = param.name.upper() if param.param_type_name == "argument" else param.opts[0]
            assert f"`{name}" in section, (path, name)


README = (REPO / "README.md").read_text()


def test_the_readme_is_a_front_door():
    lines = README.splitlines()
    assert len(lines) <= 130, f"the README has {len(lines)} lines; details belong in docs/"
    assert not [line for line in lines if line.startswith("| `scepsy ")], "the command table belongs in docs/cli.md"
    for section in ("## Set up", "## From traces to a running deployment", "## A worked example", "## Where to read on"):
        assert section in README
    assert "docs/cli.md" in README


def _commands_in_bash_blocks(text: str) -> list[str]:
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


@pytest.mark.parametrize("which", ["install and plan", "test"])
def test_the_readme_sets_up_with_two_commands_ci_runs_the_second(which):
    blocks = _commands_in_bash_blocks(README.split("## Set up", 1)[1].split("\n## ", 1)[0])
    assert len(blocks) == 2 and all("\n" not in block for block in blocks), blocks
    install, test = blocks
    if which == "install and plan":
        assert install.startswith("python3 -m venv .venv") and "pip install -e ." in install and "scepsy plan instances/" in install
    else:
        ci = (REPO / ".ci" / "run").read_text()
        assert test in ci, ".ci/run must run the README's test command exactly"
