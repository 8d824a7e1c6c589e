"""The golden plans (tests/golden/plans/*.json) are what the planner answers today, byte for byte.

Each plan is solved again from its shipped instance by tests/golden/regenerate.py's own functions,
exactly as `python tests/golden/regenerate.py` writes it. A change that moves a plan (its
allocation, placement, objective value or bound) fails here until the golden files are regenerated
on purpose and the diff reviewed; the manifests emitted from them are checked by
tests/test_k8s_golden.py.
"""

from __future__ import annotations

import pytest

from k8s_support import regenerate

PLAN_CASES = regenerate.plan_cases()


def test_every_stored_plan_is_covered():
    stored = sorted(p.name for p in regenerate.PLANS.glob("*.json"))
    assert stored == sorted(regenerate.plan_path(c).name for c in PLAN_CASES)


@pytest.mark.parametrize("case", PLAN_CASES, ids=lambda c: c.plan_name)
def test_plan_matches_golden_file(case):
    stored = regenerate.plan_path(case).read_text()
    assert regenerate.plan_text(case) == stored, (
        f"{case.plan_name} differs from tests/golden/plans: run python tests/golden/regenerate.py and review the diff"
    )
