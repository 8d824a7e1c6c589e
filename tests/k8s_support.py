"""Helpers shared by the k8s tests: golden cases, loading emitted objects, the synthetic cluster."""

from __future__ import annotations

from pathlib import Path

import yaml

from scepsy.k8s.validate import SAFE_LOADER

from conftest import load_script

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"


regenerate = load_script("golden_regenerate", GOLDEN / "regenerate.py")
synthetic = load_script("synthetic_cluster", ROOT / "bench" / "synthetic_cluster.py")
CASES = regenerate.CASES


def objects_of(files: dict[str, str]) -> list[dict]:
    return [yaml.load(text, Loader=SAFE_LOADER) for name, text in sorted(files.items())]


def of_kind(objects: list[dict], kind: str) -> list[dict]:
    return [o for o in objects if o["kind"] == kind]


def engine_deployments(objects: list[dict]) -> list[dict]:
    return [o for o in of_kind(objects, "Deployment") if o["metadata"]["labels"]["app.kubernetes.io/component"] == "engine"]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def env_of(container: dict) -> dict[str, str]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}
