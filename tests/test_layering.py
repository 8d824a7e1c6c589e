"""The layering of the packages (README, "Layout"): data flows one way and nothing imports the CLI."""

from __future__ import annotations

import ast

import pytest

from conftest import REPO

ALLOWED = {
    "models": set(),
    "tracing": {"models"},
    "planner": {"models"},
    "placement": {"models", "planner", "tracing"},
    "k8s": {"models", "planner", "placement", "tracing"},
}


def imported_packages(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "scepsy" and len(parts) > 1:
                yield parts[1]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_lower_layers(package):
    for path in sorted((REPO / package).glob("*.py")):
        for imported in imported_packages(path):
            assert imported != "cli", f"{path.name} imports the CLI"
            if imported != package:
                assert imported in ALLOWED[package], f"{package}/{path.name} imports scepsy.{imported}"


def test_relative_imports_stay_inside_the_package():
    for package in ALLOWED:
        for path in (REPO / package).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level > 1:
                    pytest.fail(f"{path} uses a relative import that leaves its package")
