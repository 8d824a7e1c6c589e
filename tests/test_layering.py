"""The layering of the packages (docs/layout.md): data flows one way, nothing imports the CLI, and no
module imports itself back, inside a package or across packages.

The allowed imports are read from the "Imports" list of docs/layout.md, so the documented layering
and the enforced one cannot drift apart.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from conftest import REPO

PACKAGES = ("models", "tracing", "placement", "planner", "k8s", "control")
TOP = "scepsy"  # the public API, the pipeline and the CLI: may import every package


def documented_layers() -> dict[str, set[str]]:
    """docs/layout.md: the lines '- `planner` imports `models`, `placement`' under 'Imports'."""
    text = (REPO / "docs" / "layout.md").read_text()
    section = text.split("Imports (enforced by tests/test_layering.py", 1)[1].split("\n\n", 1)[0]
    layers = {}
    for line in section.splitlines():
        match = re.match(r"- `(\w+)` imports (.*)", line.strip())
        if match:
            layers[match.group(1)] = set(re.findall(r"`(\w+)`", match.group(2)))
    return layers


def module_name(path: Path) -> str:
    """scepsy.<package>.<sub>... for a file of a package folder (the folders install under scepsy)."""
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] != TOP:
        parts.insert(0, TOP)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def source_files() -> list[Path]:
    files = [path for package in PACKAGES for path in sorted((REPO / package).rglob("*.py"))]
    files += [path for path in sorted((REPO / TOP).rglob("*.py")) if not path.is_symlink()
              and path.relative_to(REPO / TOP).parts[0] not in PACKAGES]
    return files


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """Every module of ours that `path` imports (at the top or inside a function)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            candidates = [f"{base}.{alias.name}" for alias in node.names] + [base]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        for candidate in candidates:
            while candidate and candidate not in modules:
                candidate = candidate.rpartition(".")[0]
            if candidate and candidate != name:
                found.add(candidate)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    files = source_files()
    modules = {module_name(path) for path in files}
    return {module_name(path): imports_of(path, modules) for path in files}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PACKAGES else TOP


def test_rules_are_the_documented_ones():
    layers = documented_layers()
    assert set(layers) == set(PACKAGES) | {TOP}
    assert layers[TOP] == set(PACKAGES)


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_lower_layers(graph, package):
    allowed = documented_layers()[package]
    for module, imported in sorted(graph.items()):
        if layer(module) != package:
            continue
        for target in sorted(imported):
            assert not target.startswith("scepsy.cli"), f"{module} imports the CLI"
            assert layer(target) in allowed | {package}, f"{module} imports {target}"


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the directed graph, or None (iterative depth-first search)."""
    state: dict[str, int] = {}
    for root in sorted(edges):
        if root in state:
            continue
        stack = [(root, iter(sorted(edges.get(root, ()))))]
        path = [root]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif child not in state:
                state[child] = 1
                path.append(child)
                stack.append((child, iter(sorted(edges.get(child, ())))))
    return None


def test_no_module_import_cycles(graph):
    cycle = _cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_no_cycles_between_sub_packages(graph):
    """The sub-packages (models.instance, planner.allocation, ...) form a flow too."""
    def folder(module: str) -> str:
        return ".".join(module.split(".")[:3])
    edges: dict[str, set[str]] = defaultdict(set)
    for module, imported in graph.items():
        for target in imported:
            if folder(target) != folder(module):
                edges[folder(module)].add(folder(target))
    cycle = _cycle(edges)
    assert cycle is None, "sub-package cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_cycles():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def python_files() -> list[Path]:
    """Every Python file of the checkout: the packages, the CLI, tests, benchmarks, examples, notebooks."""
    skip = {".venv", "build", "dist", ".git", "node_modules"}  # rglob does not enter symlinks (scepsy/models, src/)
    return sorted(path for path in REPO.rglob("*.py") if not skip & set(path.relative_to(REPO).parts))


def relative_imports(path: Path) -> list[int]:
    """The line numbers of `from . import x` / `from .module import x` in one file."""
    return [node.lineno for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ImportFrom) and node.level > 0]


def test_imports_are_absolute():
    """One import style: `from scepsy.<package>... import`, never relative."""
    found = {str(path.relative_to(REPO)): lines for path in python_files() if (lines := relative_imports(path))}
    offenders = sorted(f"{name}:{lines[0]}" for name, lines in found.items())
    assert not offenders, "relative imports (write from scepsy.<package>... import): " + ", ".join(offenders)


def test_the_import_check_sees_relative_imports(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom scepsy.models import errors\nfrom . import names\nfrom ..k8s.names import x\n")
    assert relative_imports(sample) == [3, 4]
