"""Helpers shared by the k8s tests: golden cases, loading emitted objects, the synthetic cluster."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"


def _load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None, path
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


regenerate = _load_module("golden_regenerate", GOLDEN / "regenerate.py")
synthetic = _load_module("synthetic_cluster", ROOT / "bench" / "synthetic_cluster.py")
CASES = regenerate.CASES


def objects_of(files: dict[str, str]) -> list[dict]:
    return [yaml.safe_load(text) for name, text in sorted(files.items())]


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def engine_deployments(objects: list[dict]) -> list[dict]:
    return [o for o in of_kind(objects, "Deployment") if o["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}
