"""Static typing: mypy checks every module of ours with the configuration in pyproject.toml (no
blanket ignores), and a script outside the checkout gets our types through the installed package
(py.typed; the editable install is a plain path entry, not an import hook tools cannot follow)."""

from __future__ import annotations

import subprocess
import sys

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
    config = (REPO / "pyproject.toml").read_text().split("[tool.mypy]", 1)[1]
    assert "ignore_errors" not in config and "scepsy" not in config.split("packages = ", 1)[1].split("\n", 1)[1]
    for package in ("models", "tracing", "planner", "placement", "k8s", "scepsy"):
        for path in (REPO / package).rglob("*.py"):
            assert "type: ignore" not in path.read_text(), path


@pytest.mark.slow
def test_a_script_outside_the_checkout_gets_our_types(tmp_path):
    script = tmp_path / "user.py"
    script.write_text(
        "from scepsy import plan\n"
        "from scepsy.placement.feasibility.packing import max_replicas\n"
        "gpus: int = max_replicas  # wrong on purpose: a function is not an int\n"
        "latency: float = plan('beam.yaml').objective_value\n"
    )
    result = mypy("--python-executable", sys.executable, "--cache-dir", str(tmp_path / "cache"), str(script), cwd=tmp_path)
    assert "import-not-found" not in result.stdout, result.stdout
    assert result.stdout.count("error:") == 1 and "user.py:3" in result.stdout, result.stdout
