"""docs/profiles.md, "End to end from real data": the committed example plans as the page says."""

from __future__ import annotations

from conftest import REPO
from scepsy.models.instance.instance import load_instance
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.allocation.planning import make_plan

EXAMPLE = REPO / "docs" / "examples" / "config-aic"


def test_the_example_plans_the_moe_judge_on_h100_and_the_drafter_on_l40s():
    plan = make_plan(load_instance(EXAMPLE / "instance.yaml"), PlanSettings())
    draft, judge = plan.allocation.of("draft"), plan.allocation.of("judge")
    assert (draft.gpu_type, draft.replicas, judge.gpu_type, judge.replicas) == ("L40S", 8, "H100", 2)
    assert sorted(p.name for p in (EXAMPLE / "manifests").iterdir())[-1] == "kustomization.yaml"
