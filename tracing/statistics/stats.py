"""Workflow statistics from traces: invocations n and request-level parallelism p (paper, section 4).

Definitions, for workflow w, LLM m and one workflow request r of w (the calls sharing a workflow
request id), with the calls' intervals [s_i, e_i] and durations d_i = e_i - s_i:

    N_rm = number of calls of m in r
    D_rm = sum_i d_i                           total call time of m in r, s
    U_rm = |union_i [s_i, e_i]|                time during which at least one call of m ran, s
    p_rm = D_rm / U_rm                         request-level parallelism of m in r

p_rm is the time-weighted mean number of concurrent calls of m while at least one of them runs:
with c(t) the number of calls of m running at t, D_rm = integral of c(t) dt and U_rm is the
measure of {t : c(t) > 0}. Three calls that run side by side give p = 3; a fan-out of k calls that
an engine serves one after the other (the proxy sees them all open, finishing one by one) gives
(k + 1) / 2, which is what the pipeline needs: see below.

The workflow statistics over the R_w requests of w are

    n_wm = (1 / R_w) sum_r N_rm                (requests that never call m count as 0)
    p_wm = sum_r D_rm / sum_r U_rm             (pooled over the requests that call m)

Why pooled: the Aggregate LLM Pipeline predicts m's latency contribution as L_m * n_wm / p_wm with
L_m the mean call latency. With L_m = sum_r D_rm / sum_r N_rm, that product is exactly
(1/R_w) sum_r U_rm: the mean time per workflow request during which m is busy. So on the traced
load the pipeline reproduces the traced mean workflow latency whenever the LLMs of a request do not
overlap each other and non-LLM time is negligible (both reported: `llm_time_fraction`). The mean of
the per-request p_rm is reported too (`parallelism.request_mean`), with its spread.

Time shares (the paper's Fig. 3): per request, m's busy time U_rm and its share
U_rm / sum_m' U_rm'. Their coefficients of variation (std / mean) across requests measure how stable
each is; `stability_ratio` = cv(absolute) / cv(share) > 1 means the relative share is the more
stable statistic, the premise of the pipeline.

Critical path (models/instance/statistic.py): per request, the time C_rm of m on the request's critical
path; f_wm = sum_r C_rm / sum_r U_rm (`critical_path` of a stage; 1 when the request's LLMs never
run at the same time, so serial workflows predict as before). Tails: `latency_ratios`, the p50,
p90 and p99 of the requests' end-to-end latency over its mean (docs/model.md, section 3).

Only completed calls (outcome ok, HTTP 2xx) count; calls without a workflow request id cannot be
grouped and are skipped. Both are counted in the result.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from scepsy.models.instance.instance import Stage
from scepsy.models.instance.statistic import InvocationStatistic, critical_time_s, request_use, union_length

from scepsy.tracing.capture.records import CallRecord
from scepsy.tracing.capture.span_calls import SpanSummary

DEFAULT_WORKFLOW = "workflow"


def _cv(values: np.ndarray) -> float | None:
    if len(values) < 2:
        return None
    mean = float(values.mean())
    return float(values.std(ddof=1)) / mean if mean > 0 else None


def _summary(values: np.ndarray) -> dict:
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return {"mean": None, "std": None, "min": None, "max": None}
    return {
        "mean": float(values.mean()),
        "std": float(values.std(ddof=1)) if len(values) > 1 else 0.0,
        "min": float(values.min()),
        "max": float(values.max()),
    }


@dataclass(frozen=True)
class LlmStats:
    llm: str
    invocations: float  # n_wm
    parallelism: float  # p_wm (pooled)
    invocations_summary: dict  # per-request N_rm: mean, std, min, max
    parallelism_summary: dict  # per-request p_rm: mean, std, min, max
    requests_calling: int
    calls: int
    call_latency_s: dict  # mean, p50, p90, p99 of d_i
    busy_time_s: dict  # per-request U_rm: mean, std, min, max
    busy_time_cv: float | None
    time_share: dict  # per-request share: mean, std, min, max
    time_share_cv: float | None
    prompt_tokens_mean: float | None
    completion_tokens_mean: float | None
    critical_path: float = 1.0  # f_wm: share of U_rm on the request's critical path (models/instance/statistic.py)

    @property
    def stability_ratio(self) -> float | None:
        if self.busy_time_cv is None or not self.time_share_cv:
            return None
        return self.busy_time_cv / self.time_share_cv

    def stage(self) -> Stage:
        return Stage(self.llm, self.invocations, self.stage_parallelism, self.stage_critical_path)

    @property
    def stage_critical_path(self) -> float:
        """f for an instance's stage, to 6 digits: exactly 1 where the LLMs never overlap."""
        return float(f"{self.critical_path:.6g}")

    @property
    def stage_parallelism(self) -> float:
        """p for an instance's stage: at least 1, and at most max(n, 1) (what models/instance/instance.py
        accepts). The pooled p exceeds n only when requests that skip the LLM sit beside requests
        that fan out to it; capping it there keeps n/p >= 1 call's latency, a slight overestimate."""
        return min(max(self.parallelism, 1.0), max(self.invocations, 1.0))


@dataclass(frozen=True)
class WorkflowStats:
    name: str
    requests: int
    calls: int
    latency_s: dict  # end-to-end per request (first call start to last call end): mean, std, min, max
    llm_time_fraction: float | None  # mean over requests of union of all LLM calls / end-to-end
    llms: tuple[LlmStats, ...]
    latency_ratios: dict | None = None  # p50, p90, p99 of the end-to-end latency over its mean

    def stages(self) -> tuple[Stage, ...]:
        return tuple(s.stage() for s in self.llms)


@dataclass(frozen=True)
class TraceStats:
    workflows: tuple[WorkflowStats, ...]
    calls_total: int
    calls_untagged: int  # no workflow request id
    calls_failed: int  # not outcome ok / HTTP 2xx
    spans: SpanSummary | None = None  # what OpenTelemetry spans held besides the calls (None: no spans read)

    @property
    def warnings(self) -> tuple[str, ...]:
        """One line each, naming its fix (tracing/capture/span_calls.py)."""
        return self.spans.warnings if self.spans is not None else ()

    def workflow(self, name: str) -> WorkflowStats:
        return next(w for w in self.workflows if w.name == name)


def _round(value):
    if isinstance(value, float):
        return float(f"{value:.6g}") if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _round(v) for k, v in value.items()}
    return value


def _llm_stats(llm: str, all_requests: list[list[CallRecord]]) -> LlmStats:
    statistic = InvocationStatistic()
    counts, unions, parallel, shares, durations, critical = [], [], [], [], [], []
    prompt, completion = [], []
    for calls in all_requests:
        mine = [c for c in calls if c.llm == llm]
        use = request_use([(c.start_s, c.end_s) for c in mine])
        statistic.add(use)
        counts.append(use.calls)
        if not mine:
            continue
        union = use.busy_s
        unions.append(union)
        if union > 0:
            parallel.append(use.call_time_s / union)
        per_llm = defaultdict(list)
        for c in calls:
            per_llm[c.llm].append((c.start_s, c.end_s))
        busy_all = sum(union_length(v) for v in per_llm.values())
        critical.append(critical_time_s(per_llm)[llm])
        if busy_all > 0:
            shares.append(union / busy_all)
        durations += [c.latency_s for c in mine]
        prompt += [c.prompt_tokens for c in mine if c.prompt_tokens is not None]
        completion += [c.completion_tokens for c in mine if c.completion_tokens is not None]
    d = np.asarray(durations, dtype=float)
    latency = {
        "mean": float(d.mean()),
        "p50": float(np.percentile(d, 50)),
        "p90": float(np.percentile(d, 90)),
        "p99": float(np.percentile(d, 99)),
    }
    return LlmStats(
        llm=llm,
        invocations=statistic.invocations,
        parallelism=statistic.parallelism(without_calls=1.0),
        invocations_summary=_summary(np.asarray(counts)),
        parallelism_summary=_summary(np.asarray(parallel)),
        requests_calling=len(unions),
        calls=len(durations),
        call_latency_s=latency,
        busy_time_s=_summary(np.asarray(unions)),
        busy_time_cv=_cv(np.asarray(unions, dtype=float)),
        time_share=_summary(np.asarray(shares)),
        time_share_cv=_cv(np.asarray(shares, dtype=float)),
        prompt_tokens_mean=float(np.mean(prompt)) if prompt else None,
        completion_tokens_mean=float(np.mean(completion)) if completion else None,
        critical_path=min(sum(critical) / statistic.busy_s, 1.0) if statistic.busy_s > 0 else 1.0,
    )


def latency_ratios(latencies: np.ndarray) -> dict | None:
    """A workflow's request latency percentiles over their mean (the pipeline's tail estimate,
    docs/model.md section 3)."""
    if len(latencies) < 2 or not latencies.mean() > 0:
        return None
    mean = float(latencies.mean())
    return {q: float(np.percentile(latencies, int(q[1:]))) / mean for q in ("p50", "p90", "p99")}


def aggregate(calls: Iterable[CallRecord], default_workflow: str = DEFAULT_WORKFLOW) -> TraceStats:
    """Per-workflow, per-LLM statistics of traced calls (see the module docstring)."""
    calls = list(calls)
    good = [c for c in calls if c.outcome == "ok" and 200 <= c.status < 300]
    tagged = [(c, c.workflow_id) for c in good if c.workflow_id]
    by_request: dict[str, dict[str, list[CallRecord]]] = defaultdict(lambda: defaultdict(list))
    for call, request_id in tagged:
        by_request[call.workflow or default_workflow][request_id].append(call)
    workflows = []
    for name in sorted(by_request):
        requests = [sorted(by_request[name][rid], key=lambda c: (c.start_s, c.call_id)) for rid in sorted(by_request[name])]
        llms = sorted({c.llm for r in requests for c in r})
        e2e, coverage = [], []
        for r in requests:
            span = max(c.end_s for c in r) - min(c.start_s for c in r)
            e2e.append(span)
            if span > 0:
                coverage.append(union_length((c.start_s, c.end_s) for c in r) / span)
        workflows.append(
            WorkflowStats(
                name=name,
                requests=len(requests),
                calls=sum(len(r) for r in requests),
                latency_s=_summary(np.asarray(e2e)),
                llm_time_fraction=float(np.mean(coverage)) if coverage else None,
                llms=tuple(_llm_stats(m, requests) for m in llms),
                latency_ratios=latency_ratios(np.asarray(e2e)),
            )
        )
    return TraceStats(
        workflows=tuple(workflows),
        calls_total=len(calls),
        calls_untagged=len(good) - len(tagged),
        calls_failed=len(calls) - len(good),
    )


def stats_to_dict(stats: TraceStats) -> dict:
    """The YAML/JSON form; each workflow's `stages` list drops into an instance's workflow."""
    workflows = []
    for w in stats.workflows:
        workflows.append(
            {
                "name": w.name,
                "requests": w.requests,
                "calls": w.calls,
                "stages": [
                    {"llm": s.llm, "invocations": _round(s.invocations), "parallelism": _round(s.stage_parallelism),
                     # only where LLMs of a request run at the same time (1 is the default)
                     **({"critical_path": s.stage_critical_path} if s.stage_critical_path < 1 else {})}
                    for s in w.llms
                ],
                **({"latency_ratios": _round(w.latency_ratios)} if w.latency_ratios else {}),
                "latency_s": _round(w.latency_s),
                "llm_time_fraction": _round(w.llm_time_fraction),
                "statistics": [
                    {
                        "llm": s.llm,
                        "calls": s.calls,
                        "requests_calling": s.requests_calling,
                        "invocations": _round(s.invocations_summary),
                        "parallelism": _round({"pooled": s.parallelism, "request_mean": s.parallelism_summary["mean"],
                                               "std": s.parallelism_summary["std"], "min": s.parallelism_summary["min"],
                                               "max": s.parallelism_summary["max"]}),
                        "call_latency_s": _round(s.call_latency_s),
                        "busy_time_s": _round(s.busy_time_s),
                        "busy_time_cv": _round(s.busy_time_cv),
                        "time_share": _round(s.time_share),
                        "time_share_cv": _round(s.time_share_cv),
                        "stability_ratio": _round(s.stability_ratio),
                        "prompt_tokens_mean": _round(s.prompt_tokens_mean),
                        "completion_tokens_mean": _round(s.completion_tokens_mean),
                    }
                    for s in w.llms
                ],
            }
        )
    return {
        "calls_total": stats.calls_total,
        "calls_skipped_untagged": stats.calls_untagged,
        "calls_skipped_failed": stats.calls_failed,
        **({"spans": stats.spans.to_json()} if stats.spans is not None else {}),
        "workflows": workflows,
    }


def write_stats(stats: TraceStats, out: Path | str, traces: Iterable[Path | str]) -> None:
    """The statistics as YAML (`stats_to_dict`), headed by the traces they come from."""
    import yaml

    from scepsy.models.output import write_text

    header = f"# scepsy aggregate {' '.join(map(str, traces))}\n"
    write_text(out, header + yaml.safe_dump(stats_to_dict(stats), sort_keys=False))


def stats_view(stats: TraceStats):
    """Readable tables (rich): one row per workflow and LLM."""
    from rich.console import Group
    from rich.table import Table

    from scepsy.models.plan.report import name_cell

    def fmt(value, digits=3):
        return "-" if value is None else f"{value:.{digits}f}"

    table = Table(title="Workflow statistics")
    columns = ("workflow", "requests", "llm", "n_mean", "n_std", "p_pooled", "p_req_mean", "call_latency_mean_s",
               "busy_s_mean", "busy_cv", "share_mean", "share_cv", "stability_ratio")
    for column in columns:
        table.add_column(column, justify="left" if column in ("workflow", "llm") else "right")
    for w in stats.workflows:
        for s in w.llms:
            table.add_row(
                name_cell(w.name), str(w.requests), name_cell(s.llm), fmt(s.invocations, 2), fmt(s.invocations_summary["std"], 2),
                fmt(s.parallelism, 2), fmt(s.parallelism_summary["mean"], 2), fmt(s.call_latency_s["mean"]),
                fmt(s.busy_time_s["mean"]), fmt(s.busy_time_cv, 2), fmt(s.time_share["mean"], 3),
                fmt(s.time_share_cv, 2), fmt(s.stability_ratio, 2),
            )
    lines = [
        f"{name_cell(w.name)}: {w.requests} requests, end-to-end latency_s mean {fmt(w.latency_s['mean'])} "
        f"(std {fmt(w.latency_s['std'])}), LLM time fraction {fmt(w.llm_time_fraction, 3)}"
        for w in stats.workflows
    ]
    skipped = f"calls: {stats.calls_total} total, {stats.calls_untagged} without workflow id and {stats.calls_failed} failed (skipped)"
    if stats.spans is not None:
        lines.append(span_line(stats.spans))
    return Group(table, *lines, skipped)


def span_line(summary: SpanSummary) -> str:
    """What the spans held, in one line: calls counted, spans skipped by kind, duplicates."""
    skipped = ", ".join(f"{kind} {count}" for kind, count in sorted(summary.skipped.items())) or "none"
    return (f"spans: {summary.spans} read, {summary.llm_calls} LLM calls in {summary.requests} requests; skipped: {skipped}; "
            f"{summary.duplicate_calls} calls recorded twice and {summary.repeated_spans} spans read twice counted once")
