"""The package as users get it: an sdist built from the checkout, a wheel built from that sdist,
installed into a fresh virtual environment, run from an empty directory.

The new environment has no pip and no dependencies of its own: a .pth line puts this environment's
site-packages behind its own, so the dependencies import, while this environment's editable install
of scepsy (a .pth file in that folder, which Python does not process there) does not leak in. Every
command runs in an empty directory, with no PYTHONPATH, so nothing of the checkout is in reach but
the shipped instance passed by its path.
"""

from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from conftest import INSTANCES, REPO

LEAKED = ("models", "tracing", "planner", "placement", "k8s")  # top-level folders, sub-packages of scepsy only
SKIPPED = {".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", ".ipynb_checkpoints", "out"}


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    if check:
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
    return done


def _copy_checkout(into: Path) -> Path:
    """The checkout's files (tracked and untracked, not ignored: what a fresh clone plus the work in
    progress holds), symlinks kept."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, check=False)
    if listed.returncode == 0:
        for name in sorted({n for n in listed.stdout.decode().split("\0") if n}):
            source, target = REPO / name, into / name
            if not os.path.lexists(source):  # deleted in the work tree, not yet committed
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if source.is_symlink():
                target.symlink_to(os.readlink(source))
            else:
                shutil.copy2(source, target)
    else:  # not a git checkout (an unpacked archive): everything but the usual build and cache folders
        shutil.copytree(REPO, into, symlinks=True, dirs_exist_ok=True,
                        ignore=lambda folder, names: [n for n in names if n in SKIPPED or n.endswith(".egg-info")])
    return into


def _build(backend_call: str, cwd: Path, out: Path) -> Path:
    """Run one PEP 517 hook of setuptools (this environment's, no build isolation) in `cwd`."""
    out.mkdir(parents=True, exist_ok=True)
    code = f"import sys; from setuptools import build_meta as b; print(b.{backend_call}(sys.argv[1]))"
    done = _run([sys.executable, "-c", code, str(out)], cwd)
    return out / done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, Path]:
    """An sdist of the checkout, a wheel built from the unpacked sdist, and a fresh venv holding only
    that wheel (dependencies from this environment's site-packages)."""
    root = tmp_path_factory.mktemp("packaging")
    checkout = _copy_checkout(root / "checkout")
    sdist = _build("build_sdist", checkout, root / "sdist")
    with tarfile.open(sdist) as archive:
        archive.extractall(root / "unpacked", filter="data")
    (unpacked,) = (root / "unpacked").iterdir()
    wheel = _build("build_wheel", unpacked, root / "wheel")
    venv = root / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], root)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", "--no-index", str(wheel)], root)
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], root).stdout.strip())
    ours = sorted({p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()})
    (site / "_scepsy_test_dependencies.pth").write_text("".join(f"{p}\n" for p in ours))
    empty = root / "empty"
    empty.mkdir()
    return {"sdist": sdist, "wheel": wheel, "venv": venv, "python": python, "scepsy": venv / "bin" / "scepsy", "empty": empty}


def test_the_wheel_holds_the_package_and_its_data_the_sdist_no_tests(installed):
    import zipfile

    names = set(zipfile.ZipFile(installed["wheel"]).namelist())
    for data in ("scepsy/models/data/AzureLLMInferenceTrace_conv.csv.xz", "scepsy/models/data/AzureLLMInferenceTrace_code.csv.xz",
                 "scepsy/models/data/LICENSE.md", "scepsy/k8s/crds/SOURCES", "scepsy/py.typed"):
        assert data in names
    crds = {p.name for p in (REPO / "k8s" / "crds").glob("*.yaml")}
    assert crds and {n.rpartition("/")[2] for n in names if n.startswith("scepsy/k8s/crds/") and n.endswith(".yaml")} == crds
    # every file the package folders hold that is not Python ships (data the code reads)
    for package in LEAKED:
        for path in (REPO / package).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc",):
                assert f"scepsy/{path.relative_to(REPO).as_posix()}" in names, path
    assert {n.split("/")[0] for n in names} == {"scepsy", "scepsy-0.1.0.dist-info"}
    with tarfile.open(installed["sdist"]) as archive:
        members = archive.getnames()
    assert not [m for m in members if "/tests/" in m or m.endswith("conftest.py")]


def test_only_scepsy_is_importable_from_the_wheel(installed):
    code = (
        "import importlib, json, scepsy, scepsy.models.errors as errors\n"
        "leaked = []\n"
        f"for name in {LEAKED!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "        leaked.append(name)\n"
        "    except ModuleNotFoundError:\n"
        "        pass\n"
        "print(json.dumps({'file': scepsy.__file__, 'leaked': leaked, 'error': errors.InputError.__module__}))\n"
    )
    found = json.loads(_run([str(installed["python"]), "-c", code], installed["empty"]).stdout)
    assert found["leaked"] == [] and found["error"] == "scepsy.models.errors"
    assert Path(found["file"]).is_relative_to(installed["venv"])  # the wheel's, not the checkout's
    refused = _run([str(installed["python"]), "-c", "import models"], installed["empty"], check=False)
    assert refused.returncode == 1 and "No module named 'models'" in refused.stderr


def test_only_scepsy_is_importable_from_this_install(tmp_path):
    """This environment's install (editable in development and CI) puts only scepsy on sys.path."""
    for name in LEAKED:
        done = _run([sys.executable, "-c", f"import {name}"], tmp_path, check=False)
        assert done.returncode == 1 and f"No module named '{name}'" in done.stderr, name
    _run([sys.executable, "-c", "import scepsy.models.errors"], tmp_path)


def test_the_wheel_synthesizes_plans_and_writes_manifests_from_an_empty_directory(installed):
    """The default request source (the shipped Azure trace), a shipped instance planned, and
    manifests for the Gateway API inference extension, whose objects pass the vendored CRDs."""
    scepsy, here = str(installed["scepsy"]), installed["empty"]
    done = _run([scepsy, "profiles", "synthesize", "--model", "llama-3.2-1b", "--gpu", "A6000", "--tp", "1",
                 "--fractions", "1.0", "--requests-per-point", "60", "--out", "gen.csv", "--json"], here)
    summary = json.loads(done.stdout)
    assert summary["requests"] == "azure:conv" and summary["rows"] >= 15 and (here / "gen.csv").is_file()
    _run([scepsy, "plan", str(INSTANCES / "rag-4xa6000.yaml"), "--json", "--out", "plan.json"], here)
    assert json.loads((here / "plan.json").read_text())["placement"]
    _run([scepsy, "manifests", "plan.json", "--router", "inference-gateway", "--out", "manifests"], here)
    routed = sorted(p for p in (here / "manifests").glob("*.yaml") if yaml.safe_load(p.read_text())["kind"] in ("InferencePool", "HTTPRoute"))
    assert len(routed) == 6  # an InferencePool and an HTTPRoute per LLM
    check = ("import json, sys, yaml; from scepsy.k8s.validate import CRD_DIR, validate_custom_resource\n"
             "objects = [yaml.safe_load(open(p)) for p in sys.argv[1:]]\n"
             "print(json.dumps({'crds': str(CRD_DIR), 'problems': [str(p) for o in objects for p in validate_custom_resource(o)]}))\n")
    found = json.loads(_run([str(installed["python"]), "-c", check, *map(str, routed)], here).stdout)
    assert found["problems"] == [] and Path(found["crds"]).is_relative_to(installed["venv"])


def test_one_class_per_error():
    """Every exception class of the package is defined once (by name, across all modules)."""
    defined: dict[str, list[str]] = {}
    for package in (*LEAKED, "scepsy"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.is_symlink() or (package == "scepsy" and path.relative_to(REPO / "scepsy").parts[0] in LEAKED):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ClassDef) and any(
                    (b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else "").endswith(("Error", "Exception", "Warning"))
                    for b in node.bases
                ):
                    defined.setdefault(node.name, []).append(str(path.relative_to(REPO)))
    assert "InputError" in defined and {name: where for name, where in defined.items() if len(where) > 1} == {}


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(instruction, arguments) of the repository's Dockerfile, comments and blank lines left out."""
    lines = (REPO / "Dockerfile").read_text().splitlines()
    steps = [line.strip().partition(" ") for line in lines if line.strip() and not line.lstrip().startswith("#")]
    return [(op, args.strip()) for op, _, args in steps]


def test_the_dockerfile_builds_the_entry_image_the_manifests_name(installed):
    """The image the manifests' workflow entry runs by default: its tag is the package's version
    and the Dockerfile's build command; it installs the extras the entry (tracing) and the
    controller (k8s, control) import, runs `scepsy` as the user the pods ask for and exposes the
    entry's port; and `scepsy proxy --workflow-priority`, the entry's command, starts from a wheel
    install (its --help, with the extras' modules importable)."""
    import tomllib

    from scepsy.k8s import entry

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert entry.DEFAULT_ENTRY_IMAGE.rsplit(":", 1)[1] == project["version"]
    assert f"docker build -t {entry.DEFAULT_ENTRY_IMAGE} ." in (REPO / "Dockerfile").read_text()
    steps = _dockerfile_instructions()
    (install,) = [args for op, args in steps if op == "RUN" and "pip install" in args]
    extras = install.split("[", 1)[1].split("]", 1)[0].split(",")
    assert set(extras) == {"tracing", "k8s", "control"} <= set(project["optional-dependencies"])
    objects = entry.entry_objects(_any_placed_plan(), "scepsy", entry.DEFAULT_ENTRY_IMAGE)
    pod = objects[0]["spec"]["template"]["spec"]
    user = f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    assert ("USER", user) in steps and ("EXPOSE", str(entry.PORT)) in steps
    assert ("ENTRYPOINT", json.dumps(pod["containers"][0]["command"])) in steps
    helped = _run([str(installed["scepsy"]), "proxy", "--help"], installed["empty"])
    assert "--workflow-priority" in helped.stdout and "--max-in-flight" in helped.stdout
    _run([str(installed["python"]), "-c", "import aiohttp, kubernetes, filterpy, scepsy.tracing.capture.proxy"], installed["empty"])


def _any_placed_plan():
    from scepsy.k8s.plan_input import load_placed_plan

    return load_placed_plan(REPO / "tests" / "golden" / "plans" / "beam-4xa6000-optimal.json", None)
