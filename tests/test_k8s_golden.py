"""The emitted manifests are byte-identical to the golden files and to themselves on a re-run.

The golden files are regenerated with `python tests/golden/regenerate.py` (see its docstring).
"""

from __future__ import annotations

import pytest

from k8s_support import CASES, GOLDEN, regenerate

from scepsy.k8s.manifests import write


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_manifests_match_golden_files(case):
    files = regenerate.emit(case)
    stored = {p.name: p.read_text() for p in sorted((GOLDEN / case.name).glob("*.yaml"))}
    assert sorted(files) == sorted(stored), "file set differs: run python tests/golden/regenerate.py --manifests-only and review"
    for name, text in files.items():
        assert text == stored[name], f"{case.name}/{name} differs from the golden file"


def test_rerun_is_byte_identical(tmp_path):
    case = next(c for c in CASES if c.sharing == "dra-mps")
    first, second = regenerate.emit(case), regenerate.emit(case)
    assert first == second
    write(first, tmp_path)
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == first


def test_write_removes_stale_generated_files_only(tmp_path):
    case = CASES[0]
    files = regenerate.emit(case)
    (tmp_path / "70-deployment-old-r9.yaml").write_text(next(iter(files.values())))  # generated earlier
    (tmp_path / "my-notes.yaml").write_text("# mine\n")
    write(files, tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert "70-deployment-old-r9.yaml" not in names
    assert "my-notes.yaml" in names
    assert set(files) <= names


def test_kustomization_lists_every_object_file():
    case = CASES[0]
    files = regenerate.emit(case)
    import yaml

    listed = yaml.safe_load(files["kustomization.yaml"])["resources"]
    assert listed == sorted(n for n in files if n != "kustomization.yaml")
