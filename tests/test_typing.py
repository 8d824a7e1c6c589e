"""Static typing: mypy checks every module of ours and pyright (basedpyright, in pyright's own
"standard" mode) the whole tree, product code, tests, benchmarks, examples and notebooks, with the
configuration in pyproject.toml (no blanket ignores), and a script outside the checkout gets our
types through the installed package (py.typed; the editable install is a plain path entry, not an
import hook tools cannot follow)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from conftest import REPO

pytest.importorskip("mypy")


def mypy(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mypy", *args], capture_output=True, text=True, cwd=cwd)


@pytest.mark.slow
def test_mypy_passes_on_our_modules():
    result = mypy(cwd=REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success" in result.stdout


def test_no_blanket_ignores_on_our_modules():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["mypy"]
    overrides = config.get("overrides", [])
    assert "ignore_errors" not in config and not any("ignore_errors" in o or "follow_imports" in o for o in overrides)
    ours = ("scepsy", "models", "tracing", "planner", "placement", "k8s")
    assert not [m for o in overrides for m in o["module"] if m.split(".")[0] in ours], overrides
    for package in ("models", "tracing", "planner", "placement", "k8s", "scepsy"):
        for path in (REPO / package).rglob("*.py"):
            assert "type: ignore" not in path.read_text(), path


# folders of ours that hold Python (the scepsy/<package> symlinks are checked as their targets)
CHECKED = (
    "scepsy", "models", "tracing", "planner", "placement", "k8s", "control", "bench", "examples", "instances", "notebooks", "tests",
)


def test_pyright_checks_the_whole_tree_in_standard_mode_with_narrow_ignores_only():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["basedpyright"]
    assert config["typeCheckingMode"] == "standard"  # pyright's default rule set, no rule switched off
    assert not [key for key in config if key.startswith("report")], config
    assert set(config["include"]) == set(CHECKED)
    with_python = {d.name for d in REPO.iterdir() if d.is_dir() and not d.name.startswith(".") and next(d.rglob("*.py"), None)}
    assert with_python - {"build", "dist"} <= set(CHECKED), with_python - set(CHECKED)  # a new folder is checked too
    for folder in CHECKED:
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            assert not re.search(r"#\s*pyright:\s*(basic|off|strict|report)", text), path  # no file-level switches
            assert not re.search(r"pyright:\s*ignore(?!\[)", text), path  # every ignore names its rule


def _pyright() -> list[str] | None:
    """The basedpyright command of this Python's environment (the `test` extra installs it)."""
    beside = Path(sys.executable).parent / "basedpyright"
    found = str(beside) if beside.exists() else shutil.which("basedpyright")
    return [found, "--pythonpath", sys.executable] if found else None


@pytest.mark.slow
@pytest.mark.skipif(_pyright() is None, reason="basedpyright is not installed (pip install -e '.[test]')")
def test_pyright_passes_on_the_whole_tree():
    command = _pyright()
    assert command is not None
    result = subprocess.run(command, capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stdout[-20000:] + result.stderr
    assert "0 errors" in result.stdout, result.stdout


@pytest.mark.slow
def test_a_script_outside_the_checkout_gets_our_types(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        "from scepsy import plan\n"
        "from scepsy.placement.feasibility.packing import max_replicas\n"
        "gpus: int = max_replicas  # wrong on purpose: a function is not an int\n"
        "latency: float = plan('beam.yaml').objective_value\n"
    )
    # the checkout's cache, which the test above fills: the installed package's modules are checked
    # again (another path), the libraries' stubs are not
    result = mypy("--python-executable", sys.executable, "--cache-dir", str(REPO / ".mypy_cache"), str(script), cwd=tmp_path)
    assert "import-not-found" not in result.stdout, result.stdout
    assert result.stdout.count("error:") == 1 and "user.py:3" in result.stdout, result.stdout
