"""The controller against its baselines on the shipped Azure traces (docs/control.md, "Measured").

    python bench/control.py [--peaks 0.8,1.0] [--startups 60,180,420] [--start-min 35] [--minutes 15]
                            [--systems scepsy-control,static-peak,...] [--out bench/control.jsonl]

Scenario: instances/combined-8xh100.yaml planned at its rates (beam 20, rag 40 req/s); the conv
trace drives beam search and the code trace drives RAG, both cut to [start-min, start-min +
minutes) and scaled (control/simulation.py scale_arrivals) so that each workflow's peak 5-minute
rate is PEAK times its planned rate; every workflow's SLO is twice its planned latency. Every system
starts from the plan for the trace's peak 5-minute rate (static-peak's; `static`, the same plan, is
left out by default, as is `oracle`, for CPU time). One line of
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
from scepsy.control.policy import make_context
from scepsy.control.simulation import ClosedLoopSettings, SystemRun, peak_rates, run_systems, trace_arrivals
from scepsy.models.instance.instance import load_instance
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings

REPO = Path(__file__).resolve().parents[1]
INSTANCE = REPO / "instances" / "combined-8xh100.yaml"
DRIVERS = {"beam": "conv", "rag": "code"}  # which shipped Azure trace drives which workflow (azure:conv, azure:code)


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


def markdown(path: Path) -> str:
    """The scenarios of a --out file as a markdown table (docs/control.md, "Measured")."""
    lines = ["| start-up | peak | system | GPU-hours | SLO-miss minutes (beam, rag) | unfinished | moved / bound | flaps (max per LLM) | decision p99 |",
             "|---|---|---|---|---|---|---|---|---|"]
    for line in path.read_text().splitlines():
        record = json.loads(line)
        scenario = record["scenario"]
        for system in record["systems"]:
            misses = ", ".join(str(w["slo_miss_minutes"]) for w in system["workflows"])
            unfinished = sum(w["requests_unfinished"] for w in system["workflows"])
            lines.append(f"| {scenario['startup_s']:g} s | {scenario['peak']:g} | {system['name']} | {system['gpu_hours']:.3f} | "
                         f"{misses} | {unfinished} | {system['replicas_moved']} / {system['replicas_moved_lower_bound']} | "
                         f"{system['flaps']} ({system['flaps_max_per_llm']}) | {system['decision_p99_s']:.2f} s |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peaks", default="0.8,1.0")
    parser.add_argument("--startups", default="180,60,420")
    parser.add_argument("--start-min", type=float, default=35.0)
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--systems", default="scepsy-control,static-peak,k8s-hpa,saturation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "control.jsonl")
    parser.add_argument("--table", action="store_true", help="only print the markdown table of --out's scenarios")
    options = parser.parse_args()
    if options.table:
        print(markdown(options.out))
        return
    console = Console()
    instance = load_instance(INSTANCE)
    plan = make_plan(instance, PlanSettings(time_limit_s=60.0))
    systems = options.systems.split(",")
    for startup in (float(s) for s in options.startups.split(",")):
        for peak in (float(p) for p in options.peaks.split(",")):
            drivers = {w.name: (f"azure:{DRIVERS[w.name]}", peak * w.arrival_rate) for w in instance.workflows}
            arrivals = trace_arrivals(drivers, options.start_min * 60, options.minutes * 60, options.seed)
            settings = ClosedLoopSettings(ControlSettings(startup_s=startup), seed=options.seed)
            wall, cpu = time.perf_counter(), time.process_time()
            # every workflow's SLO: twice its latency in the plan at the instance's rates
            slos = {w.name: 2 * plan.prediction.workflow(w.name).latency_s for w in instance.workflows}
            # what runs at the start (and `static`): the plan for the trace's peak, as an operator without a controller would run
            context = make_context(instance, settings.control, slos)
            peak_rps = peak_rates(arrivals, options.minutes * 60)
            start = context.replanner.allocation({w: r * (1 + settings.control.headroom) for w, r in peak_rps.items()})
            assert start is not None, "no plan meets the SLOs at the peak"
            placement = context.replanner.place(start, None)
            assert placement is not None
            runs = run_systems(instance, start, placement, arrivals, systems, settings, slos)
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
