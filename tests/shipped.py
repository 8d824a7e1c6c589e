"""Regenerate every shipped example and golden output, or check that they reproduce.

    python tests/shipped.py                       # rewrite the default targets in place
    python tests/shipped.py --check               # regenerate them into a temporary folder, compare
    python tests/shipped.py --check --only config-aic
    python tests/shipped.py --list                # the targets, what they own, what they cost

A target owns files of the repository and knows how to write them (into the repository, or into a
temporary folder laid out like it). `--check` compares the two: JSON files after dropping timing
fields (TIMING_KEYS: solver wall times, which differ from run to run), every other file byte for
byte, and a file only on one side is a difference. Exit code 1 lists the differences. The
expensive targets (EXPENSIVE: the shipped instances' profiles and the evidence figures, tens of
minutes to hours on two cores) run only when named with `--only`. docs/regenerating.md says when to run
which.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
TIMING_KEYS = ("wall_time_s",)  # the solvers' wall times, in a plan JSON's solver sections
EXAMPLE = Path("docs", "examples", "config-aic")
# the evidence figures' tables (the PNG files are drawn from them; their bytes depend on matplotlib)
FIGURE_INSTANCES = ("beam-4xa6000", "beam-8xa6000", "beam-16xa6000", "rag-4xa6000", "rag-8xa6000", "rag-16xa6000")


def _run(args: list[str], cwd: Path) -> None:
    """A command with this interpreter's environment first on PATH (`scepsy`, `python`)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} (in {cwd}) exited {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")


def _golden():
    sys.path.insert(0, str(ROOT / "tests"))
    from k8s_support import regenerate  # tests/golden/regenerate.py

    return regenerate


def cli_reference(root: Path) -> None:
    (root / "docs").mkdir(parents=True, exist_ok=True)
    _run([sys.executable, "-m", "scepsy.cli.reference", str(root / "docs" / "cli.md")], ROOT)


def golden_plans(root: Path) -> None:
    regenerate = _golden()
    folder = root / regenerate.PLANS.relative_to(ROOT)
    folder.mkdir(parents=True, exist_ok=True)
    for case in regenerate.plan_cases():
        (folder / regenerate.plan_path(case).name).write_text(regenerate.plan_text(case))


def golden_manifests(root: Path) -> None:
    """The golden manifests, emitted from the stored golden plans (golden-plans checks those)."""
    regenerate = _golden()
    for case in regenerate.CASES:
        out = root / "tests" / "golden" / case.name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir(parents=True)
        for name, text in regenerate.emit(case).items():
            (out / name).write_text(text)


def config_aic(root: Path) -> None:
    """docs/examples/config-aic/run.sh, run from `root` (its inputs copied there first)."""
    here = root / EXAMPLE
    if root != ROOT:
        here.mkdir(parents=True, exist_ok=True)
        for name in ("run.sh", "instance.yaml", "models"):
            source = ROOT / EXAMPLE / name
            if source.is_dir():
                shutil.copytree(source, here / name)
            else:
                shutil.copy2(source, here / name)
        (here / "profiles").mkdir()
    _run(["bash", str(EXAMPLE / "run.sh")], root)


def instance_profiles(root: Path) -> None:
    _run([sys.executable, str(ROOT / "instances" / "generate_profiles.py"), "--out", str(root / "instances" / "profiles")], ROOT)


def figures(root: Path) -> None:
    out = root / "docs" / "figures"
    out.mkdir(parents=True, exist_ok=True)
    _run([sys.executable, str(ROOT / "bench" / "prediction_accuracy.py"), "--duration-s", "600",
          "--out", str(out / "prediction-accuracy.csv")], ROOT)
    for instance in FIGURE_INSTANCES:
        _run([sys.executable, str(ROOT / "bench" / "baselines.py"), str(ROOT / "instances" / f"{instance}.yaml"),
              "--out-dir", str(out)], ROOT)


@dataclass(frozen=True)
class Target:
    name: str
    write: Callable[[Path], None]
    owns: tuple[str, ...]  # files and folders (every file under them), relative to the repository
    cost: str  # what a run takes, for --list
    needs: str | None = None  # a module the target imports (an optional extra)
    pattern: str = "*"  # the files of an owned folder that the target writes


def _golden_case_folders() -> tuple[str, ...]:
    return tuple(f"tests/golden/{case.name}" for case in _golden().CASES)


TARGETS = (
    Target("cli-reference", cli_reference, ("docs/cli.md",), "seconds"),
    Target("golden-plans", golden_plans, ("tests/golden/plans",), "minutes (nine CP-SAT solves)"),  # before the manifests, which are emitted from these plans
    Target("golden-manifests", golden_manifests, (), "seconds"),  # owns: every golden case folder (below)
    Target("config-aic", config_aic, (f"{EXAMPLE}/profiles", f"{EXAMPLE}/plan.json", f"{EXAMPLE}/manifests"),
           "about a minute", needs="aiconfigurator_core"),
    Target("instance-profiles", instance_profiles, ("instances/profiles",),
           "hours on two cores (instances/generate_profiles.py --resume DIR can stop and go on)"),
    Target("figures", figures, ("docs/figures",), "over an hour (one process after another)", pattern="*.csv"),
)
EXPENSIVE = ("instance-profiles", "figures")


def owned(target: Target) -> tuple[str, ...]:
    return _golden_case_folders() if target.name == "golden-manifests" else target.owns


def files_of(root: Path, target: Target) -> set[str]:
    found = set()
    for name in owned(target):
        path = root / name
        if path.is_dir():
            found |= {p.relative_to(root).as_posix() for p in path.rglob(target.pattern) if p.is_file()}
        elif path.is_file():
            found.add(name)
    return found


def _without_timing(value: object) -> object:
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if k not in TIMING_KEYS}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def differences(shipped: Path, produced: Path, names: set[str]) -> list[str]:
    """One entry per file that differs between the two trees (beyond timing fields), with the
    first lines of its diff."""
    found = []
    for name in sorted(names):
        a, b = shipped / name, produced / name
        if not a.is_file() or not b.is_file():
            found.append(f"{name}: only in the {'regenerated output' if b.is_file() else 'repository'}")
            continue
        old, new = a.read_bytes(), b.read_bytes()
        if old == new:
            continue
        if name.endswith(".json"):
            try:
                if _without_timing(json.loads(old)) == _without_timing(json.loads(new)):
                    continue
            except ValueError:
                pass
        diff = difflib.unified_diff(old.decode(errors="replace").splitlines(), new.decode(errors="replace").splitlines(),
                                    "shipped", "regenerated", n=0, lineterm="")
        found.append(f"{name}:\n    " + "\n    ".join(line[:200] for line in list(diff)[2:12]))
    return found


def check(targets: list[Target]) -> list[str]:
    problems = []
    with tempfile.TemporaryDirectory(prefix="scepsy-shipped-") as folder:
        for target in targets:
            root = Path(folder) / target.name
            root.mkdir()
            target.write(root)
            found = differences(ROOT, root, files_of(ROOT, target) | files_of(root, target))
            print(f"{target.name}: {'reproduces' if not found else f'{len(found)} files differ'}", flush=True)
            problems += found
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--check", action="store_true", help="regenerate into a temporary folder and compare")
    parser.add_argument("--only", default=None, help="comma-separated targets (default: all but " + ", ".join(EXPENSIVE) + ")")
    parser.add_argument("--list", action="store_true", help="list the targets")
    args = parser.parse_args(argv)
    by_name = {t.name: t for t in TARGETS}
    if args.list:
        for t in TARGETS:
            print(f"{t.name:18} {t.cost:32} {', '.join(owned(t))}")
        return 0
    names = args.only.split(",") if args.only else [t.name for t in TARGETS if t.name not in EXPENSIVE]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        parser.error(f"unknown target(s) {', '.join(unknown)}; use one of: {', '.join(by_name)}")
    targets = [by_name[n] for n in names]
    for target in targets:
        if target.needs:
            import importlib.util

            if importlib.util.find_spec(target.needs) is None:
                parser.error(f"{target.name} needs {target.needs} (pip install -e '.[test]')")
    if not args.check:
        for target in targets:
            target.write(ROOT)
            print(f"{target.name}: rewritten", flush=True)
        return 0
    problems = check(targets)
    for problem in problems:
        print(problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
