"""Regenerate the golden plans and manifests: `python tests/golden/regenerate.py` (from anywhere).

Plans (tests/golden/plans/*.json) are solved and placed from the shipped instances, as `scepsy plan`
does (wall times left out so they are byte-stable); manifests (tests/golden/<case>/) are emitted from those plans. Run this after the
shipped instances, profiles or the planner change, then review the diff. `--manifests-only` keeps the
plans and re-emits the manifests. tests/test_golden_plans.py re-solves every plan and
tests/test_k8s_golden.py re-emits every manifest, both byte for byte against these files.

The matrix: every shipped instance with the defaults (vllm, hami); the combined instance with both
engines on hami and dra-mps; a whole-GPU plan of beam-4xa6000 with both engines on `none`; and an
equal-halves plan of beam-4xa6000 (every GPU split into two 0.5 shares, a fixed allocation) with both
engines on device-plugin-mps, the only backend that needs equal shares; and the combined instance
with both engines on hami routed through the Gateway API Inference Extension
(`--router inference-gateway`); with the controller's own objects (`--controller`), the
workflow entry (`--entry-image`) and the PodMonitors (`--prometheus`), beam-4xa6000 on hami and its equal-halves plan on
device-plugin-mps (whose config ConfigMap lies in another namespace: a Role there).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from dataclasses import dataclass, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PLANS = HERE / "plans"
INSTANCES = ROOT / "instances"
SHIPPED = ("beam-4xa6000", "beam-8xa6000", "beam-16xa6000", "rag-4xa6000", "rag-8xa6000", "rag-16xa6000", "combined-8xh100")


@dataclass(frozen=True)
class Case:
    instance: str
    plan_kind: str  # optimal | whole | halves
    engine: str
    sharing: str
    router: str = "sglang"
    controller: bool = False

    @property
    def plan_name(self) -> str:
        return f"{self.instance}-{self.plan_kind}"

    @property
    def name(self) -> str:
        kind = "" if self.plan_kind == "optimal" else f"-{self.plan_kind}"
        router = "" if self.router == "sglang" else f"-{self.router}"
        controller = "-controller" if self.controller else ""
        return f"{self.instance}{kind}-{self.engine}-{self.sharing}{router}{controller}"


CASES = (
    *(Case(i, "optimal", "vllm", "hami") for i in SHIPPED),
    Case("combined-8xh100", "optimal", "sglang", "hami"),
    Case("combined-8xh100", "optimal", "vllm", "dra-mps"),
    Case("combined-8xh100", "optimal", "sglang", "dra-mps"),
    Case("beam-4xa6000", "whole", "vllm", "none"),
    Case("beam-4xa6000", "whole", "sglang", "none"),
    Case("beam-4xa6000", "halves", "vllm", "device-plugin-mps"),
    Case("beam-4xa6000", "halves", "sglang", "device-plugin-mps"),
    Case("combined-8xh100", "optimal", "vllm", "hami", "inference-gateway"),
    Case("combined-8xh100", "optimal", "sglang", "hami", "inference-gateway"),
    Case("beam-4xa6000", "optimal", "vllm", "hami", controller=True),
    Case("beam-4xa6000", "halves", "vllm", "device-plugin-mps", controller=True),
)
# the controller's Deployment settings of the controller cases (an image the operator builds)
CONTROLLER_IMAGE = "registry.example.com/scepsy:0.1.0"
CONTROLLER_PROMETHEUS = ("http://prometheus.monitoring:9090", 'namespace="scepsy"')


def plan_path(case: Case) -> Path:
    return PLANS / f"{case.plan_name}.json"


def plan_cases() -> list[Case]:
    """One case per golden plan (the first that uses it), by plan name."""
    return [next(c for c in CASES if c.plan_name == name) for name in sorted({c.plan_name for c in CASES})]


def _halves_plan(instance):
    """beam-4xa6000 with every GPU split into two halves: gen x3 and ver x5, tp 1, share 0.5."""
    from scepsy.models.instance.allocation import Allocation, LlmAllocation
    from scepsy.models.performance.alp import predict
    from scepsy.models.plan.plan import Plan, SolverInfo
    from scepsy.placement.place import place

    f = instance.cluster.fractions_per_gpu
    gpu_type = instance.cluster.used_gpu_types()[0]
    allocation = Allocation(f, (LlmAllocation("gen", gpu_type, 1, f // 2, 3), LlmAllocation("ver", gpu_type, 1, f // 2, 5)))
    prediction = predict(instance, allocation)
    placed = place(instance.cluster, allocation)
    latency = max(w.latency_s for w in prediction.workflows)
    solver = SolverInfo(backend="fixed", wall_time_s=0.0, notes=("fixed allocation for the device-plugin-mps golden",))
    return Plan(
        "feasible", instance.objective, latency, latency, 0.0, solver, allocation, prediction, placed.placement,
        placement_info=placed.info, fragmentation=placed.fragmentation,
    )


def solve(case: Case) -> dict:
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.plan.document import plan_json
    from scepsy.pipeline import plan_and_place
    from scepsy.planner.allocation.options import SearchSpace
    from scepsy.planner.allocation.search import PlanSettings

    instance_file = INSTANCES / f"{case.instance}.yaml"
    instance = load_instance(instance_file)
    if case.plan_kind == "halves":
        plan = _halves_plan(instance)
    else:
        space = SearchSpace(whole_gpus_only=case.plan_kind == "whole")
        plan = plan_and_place(instance, PlanSettings(time_limit_s=120.0, space=space))
    data = plan_json(plan, include_wall_time=False)
    # relative to the plan file, so that the golden plans work from any directory
    data["instance"] = str(Path("..", "..", "..", "instances", instance_file.name))
    return data


def plan_text(case: Case) -> str:
    """The golden plan file's text (tests/test_golden_plans.py compares it byte for byte)."""
    return json.dumps(solve(case), indent=2) + "\n"


def emit(case: Case) -> dict[str, str]:
    from scepsy.k8s.controller import ControllerSettings
    from scepsy.k8s.manifests import ManifestSettings, emit as emit_files
    from scepsy.k8s.plan_input import load_placed_plan

    controller = ControllerSettings(CONTROLLER_IMAGE, *CONTROLLER_PROMETHEUS) if case.controller else None
    # every case has the default workflow entry (the controller cases with the controller's image);
    # the controller cases deploy PodMonitors for the entry and the engines, which the controller reads
    settings = ManifestSettings(engine=case.engine, gpu_sharing=case.sharing, router=case.router, prometheus=case.controller)
    if case.controller:
        settings = replace(settings, entry_image=CONTROLLER_IMAGE)
    return emit_files(load_placed_plan(plan_path(case)), settings, controller)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--manifests-only", action="store_true", help="keep the stored plans, re-emit the manifests")
    args = parser.parse_args()
    PLANS.mkdir(exist_ok=True)
    if not args.manifests_only:
        for case in plan_cases():
            print(f"solving {case.plan_name}", flush=True)
            plan_path(case).write_text(plan_text(case))
    for case in CASES:
        out = HERE / case.name
        if out.exists():
            shutil.rmtree(out)
        out.mkdir()
        for name, text in emit(case).items():
            (out / name).write_text(text)
        print(f"wrote {out.relative_to(ROOT)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
