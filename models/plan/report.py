"""Readable tables of plans and predictions (rich). Every number's unit is in its column label."""

from __future__ import annotations

import math

from rich.console import Group, RenderableType
from rich.table import Table

from scepsy.models.instance.allocation import Placement
from scepsy.models.performance.alp import Prediction
from scepsy.models.plan.fragmentation import GpuTypeFragmentation
from scepsy.models.plan.plan import PlacementInfo, Plan


MAX_NAME_CHARS = 48


def name_cell(name: str | None, limit: int = MAX_NAME_CHARS) -> str:
    """A user-given name (workflow, LLM, node) as a table cell: one line, at most `limit`
    characters. Rich lays a cell out in time that grows faster than its length, and a traced
    workflow name comes from any client."""
    if name is None:
        return "-"
    text = " ".join(str(name).split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _fmt(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if not math.isfinite(value):
        return "overloaded"
    return f"{value:.{digits}f}"


def workflow_table(prediction: Prediction) -> Table:
    table = Table(title="Workflows")
    for column in ("workflow", "arrival_rps", "latency_s", "max_throughput_rps", "recovery_limit_rps", "recovery_limit_fcfs_rps",
                   "bottleneck", "slo_s", "meets_slo"):
        table.add_column(column, justify="left" if column in ("workflow", "bottleneck") else "right")
    for w in prediction.workflows:
        meets = "-" if w.meets_slo is None else ("yes" if w.meets_slo else "NO")
        table.add_row(
            w.name,
            _fmt(w.arrival_rate_rps),
            _fmt(w.latency_s),
            _fmt(w.max_throughput_rps),
            _fmt(w.recovery_limit_rps),
            _fmt(w.recovery_limit_fcfs_rps),
            w.bottleneck,
            _fmt(w.latency_slo_s),
            meets,
        )
    return table


def stage_table(prediction: Prediction) -> Table:
    table = Table(title="Latency contributions")
    for column in ("workflow", "llm", "invocations", "parallelism", "contribution_s", "share_%"):
        table.add_column(column, justify="left" if column in ("workflow", "llm") else "right")
    for w in prediction.workflows:
        for s in w.stages:
            share = 100 * s.latency_contribution_s / w.latency_s if w.latency_s and math.isfinite(w.latency_s) else None
            table.add_row(
                w.name, s.llm, _fmt(s.invocations, 2), _fmt(s.parallelism, 2), _fmt(s.latency_contribution_s), _fmt(share, 1)
            )
    return table


def llm_table(prediction: Prediction) -> Table:
    table = Table(title="LLM allocation")
    columns = (
        "llm", "gpu_type", "tp", "fraction", "replicas", "gpus", "offered_rps", "per_replica_rps",
        "capacity_rps", "utilization_%", "headroom_%", "latency_s", "entry_limit",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("llm", "gpu_type") else "right")
    for p in prediction.llms:
        table.add_row(
            p.llm,
            p.gpu_type,
            str(p.tp),
            _fmt(p.fraction, 2) + ("*" if p.profile_derived_from else ""),
            str(p.replicas),
            _fmt(p.gpus, 2),
            _fmt(p.offered_rate_rps),
            _fmt(p.per_replica_rate_rps),
            _fmt(p.capacity_rps),
            _fmt(100 * p.utilization, 1),
            _fmt(100 * p.headroom, 1),
            _fmt(p.latency_s),
            "-" if p.entry_limit is None else str(p.entry_limit),
        )
    captions = []
    if prediction.llms:
        # the margin every LLM keeps: the same max_utilization that the workflows' max_throughput_rps applies
        margin = 1 - prediction.llms[0].max_utilization
        captions.append(f"headroom_%: capacity left free; max_utilization {prediction.llms[0].max_utilization:g} "
                        f"keeps at least {100 * margin:.0f}% free on every LLM, and max_throughput_rps is "
                        "the load at which the bottleneck reaches it; recovery_limit_rps is the highest load "
                        "a workflow returns to its steady latency from within 5 minutes of 2 minutes at 150% of "
                        "max_throughput_rps behind the workflow entry, as scepsy manifests deploys it (engines "
                        "that serve older workflows first); recovery_limit_fcfs_rps the same without the entry "
                        "(engines first come first served; 0: none claimed, where calls continue "
                        "earlier prompts); entry_limit: the calls in flight the workflow entry lets through to the "
                        "LLM (the workflow entry's max_in_flight), which keeps that recovery behind routers "
                        "that drop a call's priority")
    derived = [p for p in prediction.llms if p.profile_derived_from]
    if derived:
        captions.append("* unprofiled fraction, curve derived from the measured fractions " + "; ".join(
            f"{p.llm}: {', '.join(f'{f:g}' for f in p.profile_derived_from)}" for p in derived
        ))
    if captions:
        table.caption = "\n".join(captions)
    return table


def placement_table(placement: Plan | Placement) -> Table:
    placement = placement.placement if isinstance(placement, Plan) else placement
    table = Table(title="Placement")
    for column in ("llm", "replica", "node", "gpus", "fraction_per_gpu"):
        table.add_column(column, justify="left" if column in ("llm", "node", "gpus") else "right")
    f = placement.fractions_per_gpu
    for r in placement.replicas:
        table.add_row(r.llm, str(r.replica), r.node, ",".join(str(s.gpu) for s in r.shards), _fmt(r.shards[0].units / f, 2))
    return table


def fragmentation_table(report: tuple[GpuTypeFragmentation, ...]) -> Table:
    """What the placement leaves free, per gpu type (models/plan/fragmentation.py)."""
    table = Table(title="Free after placement")
    columns = (
        "gpu_type", "gpus", "free_gpus", "nvlink_domains", "free_domains", "free_capacity_gpus",
        "stranded_capacity_gpus", "largest_tp_whole_gpu", "largest_tp_half_gpu",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "gpu_type" else "right")
    for r in report:
        table.add_row(
            r.gpu_type, str(r.gpus), str(r.free_gpus), str(r.domains), str(r.free_domains), _fmt(r.free_capacity_gpus, 1),
            _fmt(r.stranded_capacity_gpus, 1), str(r.largest_tp_whole_gpu), str(r.largest_tp_half_gpu),
        )
    return table


def placement_summary(info: PlacementInfo) -> str:
    o = info.objective
    parts = [
        f"placement: {info.method} ({info.status})",
        f"free_domains: {o.free_domains}",
        f"free_gpus: {o.free_gpus}",
        f"shared_gpus: {o.shared_gpus}",
    ]
    if o.moved_shards is not None:
        parts += [f"moved_shards: {o.moved_shards}", f"kept_replicas: {o.kept_replicas}"]
    if info.gap is not None:
        parts.append(f"gap: {100 * info.gap:.1f}% ({info.gap_stage})")
    parts.append(f"wall_time_s: {info.wall_time_s:.3f}")
    return "   ".join(parts) + "".join(f"\nnote: {n}" for n in info.notes)


def plan_summary(plan: Plan) -> str:
    gap = "-" if plan.gap is None or not math.isfinite(plan.gap) else f"{100 * plan.gap:.3f}%"
    bound = "-" if not math.isfinite(plan.bound) else f"{plan.bound:.6g}"
    return (
        f"status: {plan.status}   objective: {plan.objective} = {plan.objective_value:.6g}   bound: {bound}   "
        f"gap: {gap}   backend: {plan.solver.backend}   wall_time_s: {plan.solver.wall_time_s:.3f}   "
        f"gpu_equivalents: {plan.allocation.gpus():g}   gpus_in_use: {plan.gpus_in_use}"
    )


def plan_view(plan: Plan) -> Group:
    parts: list[RenderableType] = [
        plan_summary(plan),
        workflow_table(plan.prediction),
        stage_table(plan.prediction),
        llm_table(plan.prediction),
        placement_table(plan),
    ]
    if plan.placement_info is not None:
        parts.insert(1, placement_summary(plan.placement_info))
    if plan.fragmentation:
        parts.append(fragmentation_table(plan.fragmentation))
    return Group(*parts)


def placement_view(placement: Placement, info: PlacementInfo, report: tuple[GpuTypeFragmentation, ...]) -> Group:
    return Group(placement_summary(info), placement_table(placement), fragmentation_table(report))


def prediction_view(prediction: Prediction) -> Group:
    return Group(workflow_table(prediction), stage_table(prediction), llm_table(prediction))


def simulation_view(result, prediction=None, rate_rps: float | None = None) -> Group:
    """Tables of one simulation (models/simulation/simulator.py `SimulationResult`), with the Aggregate LLM
    Pipeline prediction of the same allocation beside it when given."""
    head = (
        f"simulated {result.duration_s:g} s (measured after {result.warmup_s:g} s), seed {result.seed}, "
        f"engines scheduling {result.scheduling}"
        + (", entry holding " + ", ".join(f"{llm} at {n}" for llm, n in result.entry_limits) if result.entry_limits else "")
        + (f", rate {rate_rps:g} requests/s per workflow" if rate_rps is not None else "")
        + f", gpus_mean {result.gpus_mean:.2f}"
        + (f", clipped_calls {result.clipped_calls}" if result.clipped_calls else "")
    )
    workflows = Table(title="Simulated workflows")
    columns = ("workflow", "offered_rps", "throughput_rps", "completed", "unfinished", "mean_s", "p50_s", "p90_s",
               "p99_s", "predicted_s")
    for column in columns:
        workflows.add_column(column, justify="left" if column == "workflow" else "right")
    for w in result.workflows:
        predicted = prediction.workflow(w.name).latency_s if prediction is not None else None
        workflows.add_row(
            w.name, _fmt(w.offered_rate_rps), _fmt(w.throughput_rps), str(w.completed), str(w.unfinished),
            _fmt(w.latency_mean_s), _fmt(w.latency_p50_s), _fmt(w.latency_p90_s), _fmt(w.latency_p99_s), _fmt(predicted),
        )
    stages = Table(title="Measured statistics per LLM (n: calls per request, p: parallelism)")
    for column in ("workflow", "llm", "n", "p", "call_latency_s", "time_share_%"):
        stages.add_column(column, justify="left" if column in ("workflow", "llm") else "right")
    for w in result.workflows:
        for s in w.stages:
            stages.add_row(w.name, s.llm, _fmt(s.invocations, 2), _fmt(s.parallelism, 2), _fmt(s.mean_call_latency_s),
                           _fmt(100 * s.time_share, 1))
    llms = Table(title="LLM replicas")
    for column in ("llm", "gpu_type", "tp", "fraction", "replicas", "utilization_%", "calls", "mean_batch",
                   "prefix_hit_%", "preemptions"):
        llms.add_column(column, justify="left" if column in ("llm", "gpu_type") else "right")
    for m in result.llms:
        llms.add_row(
            m.name, m.gpu_type, str(m.tp), _fmt(m.fraction, 2), _fmt(m.replicas_mean, 2), _fmt(100 * m.utilization, 1),
            str(m.calls), _fmt(m.mean_batch, 1), _fmt(100 * m.prefix_hit_rate, 1), str(m.preemptions),
        )
    return Group(head, workflows, stages, llms)


def comparison_table(comparisons) -> Table:
    """Peak throughput and equal-throughput latency ratios of scepsy against each baseline."""
    table = Table(title="scepsy against baselines")
    for column in ("workflow", "baseline", "peak_throughput_ratio", "latency_ratio_min", "latency_ratio_median",
                   "latency_ratio_max"):
        table.add_column(column, justify="left" if column in ("workflow", "baseline") else "right")
    for c in comparisons:
        table.add_row(c.workflow, c.baseline, _fmt(c.peak_throughput_ratio, 2), _fmt(c.latency_ratio_min, 2),
                      _fmt(c.latency_ratio_median, 2), _fmt(c.latency_ratio_max, 2))
    return table
