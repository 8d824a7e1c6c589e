"""The controller against its baselines on the shipped Azure traces (docs/control.md, "Measured").

    python bench/control.py [--peaks 0.8,1.0] [--startups 60,180,420] [--start-min 35] [--minutes 15]
                            [--systems scepsy-control,static-peak,...] [--out bench/control.jsonl]

Scenario: instances/combined-8xh100.yaml planned at its rates (beam 20, rag 40 req/s); the conv
trace drives beam search and the code trace drives RAG, both cut to [start-min, start-min +
minutes) and scaled (control/simulation.py scale_arrivals) so that each workflow's peak 5-minute
rate is PEAK times its planned rate; every workflow's SLO is twice its planned latency. One line of
JSON per scenario goes to --out (the systems' documents, the scenario, the wall and CPU time), and
the checks of docs/control.md are printed per scenario.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from rich.console import Console

from scepsy.control.policy import ControlSettings
from scepsy.control.report import control_document, control_table
from scepsy.control.simulation import SYSTEMS, ClosedLoopSettings, SystemRun, run_systems, trace_arrivals
from scepsy.models.instance.instance import load_instance
from scepsy.models.profiles.synthesize import find_azure_trace
from scepsy.placement.place import PlacementSettings, place
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings

REPO = Path(__file__).resolve().parents[1]
INSTANCE = REPO / "instances" / "combined-8xh100.yaml"
DRIVERS = {"beam": "conv", "rag": "code"}  # which Azure trace drives which workflow


def trace(kind: str) -> Path:
    path = find_azure_trace(kind, REPO)
    if path is None:
        raise SystemExit(f"the Azure {kind} trace is not in shared/data/azure-llm-inference-2023 beside the repository")
    return path


def checks(runs: list[SystemRun]) -> dict[str, bool | None]:
    """The measured claims of docs/control.md, for one scenario (None: a system was not run)."""
    by = {r.name: r for r in runs}
    ours = by.get("scepsy-control")
    if ours is None:
        return {}

    def misses(run: SystemRun) -> int:
        return sum(w.slo_miss_minutes for w in run.workflows)

    out: dict[str, bool | None] = {}
    hpa, peak, sat = by.get("k8s-hpa"), by.get("static-peak"), by.get("saturation")
    out["half the SLO-miss minutes of k8s-hpa at no more GPU-hours"] = None if hpa is None else (
        misses(ours) <= 0.5 * misses(hpa) and ours.gpu_hours <= hpa.gpu_hours + 1e-9)
    out["20% fewer GPU-hours than static-peak, at most 1 more SLO-miss minute"] = None if peak is None else (
        ours.gpu_hours <= 0.8 * peak.gpu_hours and misses(ours) <= misses(peak) + 1)
    out["dominates saturation"] = None if sat is None else (
        misses(ours) <= misses(sat) and ours.gpu_hours <= sat.gpu_hours + 1e-9
        and (misses(ours) < misses(sat) or ours.gpu_hours < sat.gpu_hours - 1e-9))
    minutes = max((s.time_s for s in ours.timeline), default=0.0) / 60
    out["at most one flap per LLM per 10 minutes"] = ours.flaps_max_per_llm <= max(minutes / 10, 1)
    out["moves within 1.2x of the lower bound"] = ours.replicas_moved <= 1.2 * ours.replicas_moved_lower_bound + 1e-9
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peaks", default="0.8,1.0")
    parser.add_argument("--startups", default="180,60,420")
    parser.add_argument("--start-min", type=float, default=35.0)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "control.jsonl")
    options = parser.parse_args()
    console = Console()
    instance = load_instance(INSTANCE)
    plan = make_plan(instance, PlanSettings(time_limit_s=60.0))
    placement = place(instance.cluster, plan.allocation, PlacementSettings()).placement
    systems = options.systems.split(",")
    for startup in (float(s) for s in options.startups.split(",")):
        for peak in (float(p) for p in options.peaks.split(",")):
            drivers = {w.name: (trace(DRIVERS[w.name]), peak * w.arrival_rate) for w in instance.workflows}
            arrivals = trace_arrivals(drivers, options.start_min * 60, options.minutes * 60, options.seed)
            settings = ClosedLoopSettings(ControlSettings(startup_s=startup), seed=options.seed)
            wall, cpu = time.perf_counter(), time.process_time()
            runs = run_systems(instance, plan.allocation, placement, arrivals, systems, settings)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            scenario = {"startup_s": startup, "peak": peak, "start_min": options.start_min, "minutes": options.minutes,
                        "seed": options.seed, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
            result = checks(runs)
            with options.out.open("a") as handle:
                handle.write(json.dumps({"scenario": scenario, **control_document(runs), "checks": result}) + "\n")
            console.print(f"startup {startup:g} s, peak {peak:g}: {wall:.0f} s wall, {cpu:.0f} s CPU")
            console.print(control_table(runs))
            for claim, ok in result.items():
                console.print(f"  {'n/a ' if ok is None else ('PASS' if ok else 'FAIL')}  {claim}")


if __name__ == "__main__":
    main()
