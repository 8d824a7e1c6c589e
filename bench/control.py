"""The controller against its baselines on the shipped Azure traces (docs/control.md, "Measured").

    python bench/control.py [--scenario azure] [--instance instances/combined-8xh100.yaml] [--peaks 0.8,1.0]
                            [--startups 60,180,420] [--start-min 0] [--minutes 60]
                            [--systems scepsy-control,static-peak,...] [--out bench/control.jsonl]
    python bench/control.py --table [--out bench/control.jsonl]

Scenarios (--scenario), on an instance planned at its rates (default instances/combined-8xh100.yaml:
beam 20, rag 40 req/s); every workflow's SLO is twice its planned latency:

    azure     the shipped Azure hours: the conv trace drives beam search (or the instance's first
              workflow), the code trace RAG (the second), both cut to [start-min, start-min +
              minutes) (default: the whole hour) and scaled (control/simulation.py
              scale_arrivals) so that each workflow's peak 5-minute rate is PEAK times its
              planned rate
    ramp      Poisson arrivals rising x3 over 10 minutes, then held (control/simulation.py SHAPES)
    step      x2 at minute 5
    burst     1.5x for two minutes from minute 5
    dip       falling to 10% for minutes 5-15, and back
    constant  70% of the cluster's maximum

The synthetic shapes peak at PEAK times the cluster's maximum: the highest multiple of the planned
rates at which the controller's planner has a plan predicted to meet the planning SLOs.

Every system but static-peak and k8s-hpa starts from the plan for the first 5 minutes' rate
(control/simulation.py opening_plan; `--start peak`: from the plan for the arrivals' peak 5-minute
rate, static-peak's); `static`, the start plan, is left out by default, as is `oracle`, for CPU
time.
One line of JSON per scenario and run goes to --out (the systems' documents, the scenario, the
wall and CPU time); systems of one scenario may run in separate invocations (--systems picks
them): --table merges the lines of a scenario and prints the table and the checks of
docs/control.md.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console

from scepsy.control.policy import (ControllerState, ControlSettings, Observation, PolicyContext, decide, make_context,
                                   meets_planning_slos)
from scepsy.control.report import control_document, control_table
from scepsy.control.simulation import (SHAPES, ClosedLoopSettings, opening_plan, peak_rates, rate_bins, run_systems,
                                      shaped_arrivals, trace_arrivals)
from scepsy.models.instance.allocation import Allocation, Placement
from scepsy.models.instance.instance import Instance, load_instance
from scepsy.planner.allocation.planning import make_plan
from scepsy.planner.allocation.search import PlanSettings

REPO = Path(__file__).resolve().parents[1]
INSTANCE = REPO / "instances" / "combined-8xh100.yaml"
DRIVERS = ("conv", "code")  # the shipped Azure trace that drives the instance's first and second workflow
SCENARIOS = ("azure", *SHAPES)
CONSTANT_SHARE = 0.7  # the constant scenario's load: this share of the cluster's maximum


def checks(systems: list[dict], minutes: float, bound_gpu_hours: float | None = None) -> dict[str, bool | None]:
    """The targets of docs/control.md for one scenario, from the systems' JSON documents
    (control/report.py) and the free-and-instant bound (`bound_gpu_hours`); None where a system
    or the bound was not run."""
    by = {system["name"]: system for system in systems}
    ours = by.get("scepsy-control")
    if ours is None:
        return {}

    def misses(system: dict) -> int:
        return sum(w["slo_miss_minutes"] for w in system["workflows"])

    out: dict[str, bool | None] = {}
    hpa, peak, sat, oracle = by.get("k8s-hpa"), by.get("static-peak"), by.get("saturation"), by.get("oracle")
    out["SLO-miss minutes at most static-peak's plus 2"] = None if peak is None else misses(ours) <= misses(peak) + 2
    out["GPU-hours within 1.15x of the free-and-instant bound"] = None if bound_gpu_hours is None else (
        ours["gpu_hours"] <= 1.15 * bound_gpu_hours + 1e-9)
    out["10% fewer GPU-hours than static-peak where the bound is 25% below it"] = None if peak is None or bound_gpu_hours is None else (
        bound_gpu_hours > 0.75 * peak["gpu_hours"] or ours["gpu_hours"] <= 0.9 * peak["gpu_hours"] + 1e-9)
    out["half the SLO-miss minutes of k8s-hpa at no more GPU-hours"] = None if hpa is None else (
        misses(ours) <= 0.5 * misses(hpa) and ours["gpu_hours"] <= hpa["gpu_hours"] + 1e-9)
    out["dominates saturation (no more SLO-miss minutes, no more GPU-hours)"] = None if sat is None else (
        misses(ours) <= misses(sat) and ours["gpu_hours"] <= sat["gpu_hours"] + 1e-9)
    out["nothing unfinished"] = all(w["requests_unfinished"] == 0 for w in ours["workflows"])
    out["at most one flap per LLM per 10 minutes"] = ours["flaps_max_per_llm"] <= max(minutes / 10, 1)
    out["moves within 1.2x of the lower bound"] = ours["replicas_moved"] <= 1.2 * ours["replicas_moved_lower_bound"] + 1e-9
    out["the oracle meets the SLO"] = None if oracle is None else misses(oracle) == 0
    return out


def free_and_instant_gpu_hours(instance: Instance, context: PolicyContext, arrivals: dict[str, list[float]],
                               minutes: float) -> float:
    """The free-and-instant bound: per minute, the GPUs (share units / fractions_per_gpu) of the
    controller's planner's plan for that minute's arrival rate, held for exactly that minute (no
    start-up, no margin); where no plan meets the planning SLO at a minute's rate, its best plan."""
    bins = rate_bins(arrivals, minutes * 60, 60.0)
    fractions = instance.cluster.fractions_per_gpu
    total = 0.0
    for k in range(len(next(iter(bins.values())))):
        plan = context.replanner.allocation({w: float(r[k]) for w, r in bins.items()})
        total += (plan.units if plan is not None else 0) / fractions / 60.0
    return total


def scenarios(path: Path) -> list[tuple[dict, list[dict], list[dict]]]:
    """The lines of a --out file merged per scenario: (scenario, systems, the runs' scenario
    records with their CPU time), in the order first seen; a system run twice keeps its last run."""
    merged: dict[tuple, tuple[dict, dict[str, dict], list[dict]]] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        scenario = record["scenario"]
        key = tuple(scenario.get(k) for k in ("shape", "instance", "start", "startup_s", "peak", "start_min", "minutes", "seed")) + tuple(
            scenario.get("settings", ()))
        entry = merged.setdefault(key, (scenario, {}, []))
        for system in record["systems"]:
            entry[1][system["name"]] = system
        entry[2].append(scenario)
    return [(scenario, list(systems.values()), runs) for scenario, systems, runs in merged.values()]


def markdown(path: Path) -> str:
    """The scenarios of a --out file as a markdown table, and their checks (docs/control.md, "Measured")."""
    lines = ["| scenario | start-up | peak | minutes | system | GPU-hours | SLO-miss minutes (per workflow) | unfinished | moved / bound | flaps (max per LLM) | decision p99 |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    notes = []
    for scenario, systems, runs in scenarios(path):
        head = f"| {scenario.get('shape', 'azure')} | {scenario['startup_s']:g} s | {scenario['peak']:g} | {scenario['start_min']:g}-{scenario['start_min'] + scenario['minutes']:g} |"
        for system in systems:
            misses = ", ".join(str(w["slo_miss_minutes"]) for w in system["workflows"])
            unfinished = sum(w["requests_unfinished"] for w in system["workflows"])
            lines.append(f"{head} {system['name']} | {system['gpu_hours']:.3f} | "
                         f"{misses} | {unfinished} | {system['replicas_moved']} / {system['replicas_moved_lower_bound']} | "
                         f"{system['flaps']} ({system['flaps_max_per_llm']}) | {system['decision_p99_s']:.2f} s |")
        cpu = sum(r.get("cpu_s", 0.0) for r in runs)
        bound = next((r["bound_gpu_hours"] for r in runs if r.get("bound_gpu_hours") is not None), None)
        bound_text = "" if bound is None else f", free-and-instant bound {bound:.3f} GPU-hours"
        notes.append(f"{scenario.get('shape', 'azure')}, start-up {scenario['startup_s']:g} s, peak {scenario['peak']:g}: {cpu:.0f} s CPU{bound_text}")
        for claim, ok in checks(systems, scenario["minutes"], bound).items():
            notes.append(f"  {'n/a ' if ok is None else ('PASS' if ok else 'FAIL')}  {claim}")
    return "\n".join(lines + [""] + notes)


def plan_level(instance: Instance, arrivals: dict[str, list[float]], context: PolicyContext, start: Allocation,
               placement: Placement, minutes: float) -> dict:
    """The policy on the trace's 1-minute rates without the simulator (--plans-only): each minute's
    workflow rates become exact per-LLM observations, the replicas the target's; the share units
    of the targets per minute against the start plan's. `bound`: per minute the
    fewest units of a plan for the centered 5-minute mean rate plus headroom, the least any
    controller that plans for a 5-minute rate holds with free, instant changes."""
    bins = rate_bins(arrivals, minutes * 60, 60.0)
    state = ControllerState.initial(start, placement)
    units: list[int] = []
    bound: list[int] = []
    changes: list[dict] = []
    count = len(next(iter(bins.values())))
    for k in range(count):
        rates = {w: float(r[k]) for w, r in bins.items()}
        at = instance.with_arrival_rates(rates)
        observed: dict[str, float | None] = {m.name: at.offered_rate_rps(m.name) for m in instance.llms}
        ready = {c.llm: c.replicas for c in state.allocation.llms}
        state, decision = decide(state, Observation(60.0 * (k + 1), observed, ready), context)
        units.append(state.allocation.units)
        if decision.action == "replan":
            changes.append({"minute": k + 1, "reason": decision.reason, "units": state.allocation.units})
        centered = {w: float(np.mean(r[max(k - 2, 0):k + 3])) * (1 + context.settings.headroom) for w, r in bins.items()}
        best = context.replanner.allocation(centered)
        bound.append(best.units if best is not None else start.units)
    return {"start_units": start.units, "mean_units": float(np.mean(units)), "bound_mean_units": float(np.mean(bound)),
            "ratio": float(np.mean(units)) / start.units, "bound_ratio": float(np.mean(bound)) / start.units,
            "units_per_minute": units, "changes": changes}


def peak_plan(context: PolicyContext, arrivals: dict[str, list[float]]) -> tuple[Allocation, Placement]:
    """The plan for the arrivals' peak 5-minute rate plus headroom (static-peak's)."""
    duration = max((max(t) for t in arrivals.values() if t), default=0.0) + 1e-9
    peak = peak_rates(arrivals, duration)
    start = context.replanner.allocation({w: r * (1 + context.settings.headroom) for w, r in peak.items()})
    assert start is not None, "no plan meets the SLOs at the peak"
    placement = context.replanner.place(start, None)
    assert placement is not None
    return start, placement


def maximum_scale(instance: Instance, context: PolicyContext) -> float:
    """The cluster's maximum: the highest multiple of the instance's rates at which the
    controller's planner has a plan predicted to meet every workflow's planning SLO
    (latency_slo_s * slo_margin) with no LLM overloaded (bisection to 1%). Past it the planner
    only has its min_latency plan, which no system could hold to the SLO."""
    low, high = 0.0, 1.0
    while _meets_slos(instance, context, high) and high < 64:
        low, high = high, high * 2
    while high - low > 0.01 * high:
        middle = (low + high) / 2
        if _meets_slos(instance, context, middle):
            low = middle
        else:
            high = middle
    return low


def _meets_slos(instance: Instance, context: PolicyContext, scale: float) -> bool:
    rates = {w.name: w.arrival_rate * scale for w in instance.workflows}
    allocation = context.replanner.allocation(rates)
    return allocation is not None and meets_planning_slos(context, allocation, rates)


def scenario_arrivals(instance: Instance, context: PolicyContext, shape: str, peak: float, start_min: float, minutes: float,
                      seed: int) -> dict[str, list[float]]:
    """The arrivals of one scenario (module docstring)."""
    if shape == "azure":
        drivers = {w.name: (f"azure:{DRIVERS[k % len(DRIVERS)]}", peak * w.arrival_rate) for k, w in enumerate(instance.workflows)}
        return trace_arrivals(drivers, start_min * 60, minutes * 60, seed)
    if shape == "constant":
        scale = CONSTANT_SHARE * maximum_scale(instance, context)
    else:
        top = max(SHAPES[shape](m / 10.0) for m in range(int(minutes * 10) + 1))
        scale = peak * maximum_scale(instance, context) / top
    return shaped_arrivals({w.name: w.arrival_rate * scale for w in instance.workflows}, shape, minutes, seed)


def control_settings(startup_s: float, overrides: list[str]) -> ControlSettings:
    """The controller's settings: the defaults with start-up `startup_s` and each NAME=VALUE of
    `overrides` (the value converted to the default's type)."""
    defaults = ControlSettings(startup_s=startup_s)
    changes: dict[str, Any] = {}
    for item in overrides:
        name, _, value = item.partition("=")
        if not hasattr(defaults, name):
            raise SystemExit(f"--setting {item}: no knob {name!r} in ControlSettings")
        kind = type(getattr(defaults, name))
        changes[name] = value if kind is str else kind(float(value)) if kind is int else float(value)
    return replace(defaults, **changes)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--scenario", choices=SCENARIOS, default="azure")
    parser.add_argument("--instance", type=Path, default=INSTANCE)
    parser.add_argument("--start", choices=("opening", "peak"), default="opening",
                        help="the plan every system starts from: the first 5 minutes' rate, or the peak 5-minute rate")
    parser.add_argument("--peaks", default="0.8,1.0")
    parser.add_argument("--startups", default="180,60,420")
    parser.add_argument("--start-min", type=float, default=0.0)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--systems", default="scepsy-control,static-peak,k8s-hpa,saturation")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--setting", action="append", default=[], metavar="NAME=VALUE",
                        help="a ControlSettings knob other than its default (repeatable), e.g. --setting predictor=ewma")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "control.jsonl")
    parser.add_argument("--table", action="store_true", help="only print the markdown table of --out's scenarios")
    parser.add_argument("--plans-only", action="store_true",
                        help="run the policy on the trace's 1-minute rates without the simulator; print share units against static-peak")
    options = parser.parse_args()
    if options.table:
        print(markdown(options.out))
        return
    console = Console()
    instance = load_instance(options.instance)
    plan = make_plan(instance, PlanSettings(time_limit_s=60.0))
    systems = options.systems.split(",")
    for startup in (float(s) for s in options.startups.split(",")):
        for peak in (float(p) for p in options.peaks.split(",")):
            settings = ClosedLoopSettings(control_settings(startup, options.setting), seed=options.seed)
            wall, cpu = time.perf_counter(), time.process_time()
            # every workflow's SLO: twice its latency in the plan at the instance's rates
            slos = {w.name: 2 * plan.prediction.workflow(w.name).latency_s for w in instance.workflows}
            context = make_context(instance, settings.control, slos)
            arrivals = scenario_arrivals(instance, context, options.scenario, peak, options.start_min, options.minutes, options.seed)
            # what runs at the start (and `static`): the plan for the first 5 minutes' rate, as an operator plans for today's load
            start, placement = opening_plan(context, arrivals) if options.start == "opening" else peak_plan(context, arrivals)
            if options.plans_only:
                level = plan_level(instance, arrivals, context, start, placement, options.minutes)
                cpu = time.process_time() - cpu
                console.print(f"startup {startup:g} s, peak {peak:g}: {cpu:.0f} s CPU")
                console.print(json.dumps({k: v for k, v in level.items() if k != "units_per_minute"}))
                console.print(" ".join(str(u) for u in level["units_per_minute"]))
                continue
            runs = run_systems(instance, start, placement, arrivals, systems, settings, slos, opening=False)
            bound = free_and_instant_gpu_hours(instance, context, arrivals, options.minutes)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            scenario = {"shape": options.scenario, "instance": options.instance.name, "start": options.start, "startup_s": startup, "peak": peak, "start_min": options.start_min, "minutes": options.minutes,
                        "seed": options.seed, "settings": sorted(options.setting), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1),
                        "bound_gpu_hours": round(bound, 6)}
            document = control_document(runs)
            result = checks(document["systems"], options.minutes, bound)
            with options.out.open("a") as handle:
                handle.write(json.dumps({"scenario": scenario, **document, "checks": result}) + "\n")
            console.print(f"startup {startup:g} s, peak {peak:g}: {wall:.0f} s wall, {cpu:.0f} s CPU; free-and-instant bound {bound:.3f} GPU-hours")
            console.print(control_table(runs))
            for claim, ok in result.items():
                console.print(f"  {'n/a ' if ok is None else ('PASS' if ok else 'FAIL')}  {claim}")


if __name__ == "__main__":
    main()
