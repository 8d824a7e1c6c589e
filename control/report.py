"""What `scepsy control --simulate` prints: the JSON document, the table, and the plot over time.

JSON (`control_document`):

    {"systems": [{"name", "gpu_hours", "replicas_moved", "replicas_moved_lower_bound", "flaps",
                  "flaps_max_per_llm", "decision_p99_s",
                  "workflows": [{"name", "slo_s", "slo_miss_minutes", "requests", "requests_unfinished",
                                 "latency_mean_s", "latency_p99_s"}]}]}

decision_p99_s is the wall time of the decision function (its 99th percentile over the periods):
the one field that is not the same from run to run. The plot has one column per system and three
rows: the arrival rate per workflow, the replicas per LLM (serving; starting ones hatched), and the
latency per workflow against its SLO.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from scepsy.control.simulation import SystemRun
from scepsy.models.output import json_number

if TYPE_CHECKING:
    from rich.table import Table


def system_document(run: SystemRun) -> dict:
    return {
        "name": run.name,
        "gpu_hours": json_number(run.gpu_hours, 6),
        "replicas_moved": run.replicas_moved,
        "replicas_moved_lower_bound": run.replicas_moved_lower_bound,
        "flaps": run.flaps,
        "flaps_max_per_llm": run.flaps_max_per_llm,
        "decision_p99_s": json_number(run.decision_p99_s, 6),
        "workflows": [
            {
                "name": w.name,
                "slo_s": json_number(w.slo_s, 6),
                "slo_miss_minutes": w.slo_miss_minutes,
                "requests": w.requests,
                "requests_unfinished": w.requests_unfinished,
                "latency_mean_s": json_number(w.latency_mean_s, 6),
                "latency_p99_s": json_number(w.latency_p99_s, 6),
            }
            for w in run.workflows
        ],
    }


def control_document(runs: Sequence[SystemRun]) -> dict:
    """The `--json` document (module docstring)."""
    return {"systems": [system_document(run) for run in runs]}


def control_table(runs: Sequence[SystemRun]) -> Table:
    """The same as a table: one row per system and workflow."""
    from rich.table import Table

    table = Table(title="closed loop")
    for column in ("system", "gpu_hours", "moved / bound", "flaps", "decision_p99_s", "workflow", "slo_miss_minutes",
                   "unfinished", "latency_mean_s", "latency_p99_s"):
        table.add_column(column, justify="left" if column in ("system", "workflow") else "right")
    for run in runs:
        for k, w in enumerate(run.workflows):
            first = k == 0
            table.add_row(
                run.name if first else "",
                f"{run.gpu_hours:.3f}" if first else "",
                f"{run.replicas_moved} / {run.replicas_moved_lower_bound}" if first else "",
                str(run.flaps) if first else "",
                f"{run.decision_p99_s:.3f}" if first else "",
                w.name,
                str(w.slo_miss_minutes),
                str(w.requests_unfinished),
                _seconds(w.latency_mean_s),
                _seconds(w.latency_p99_s),
            )
    return table


def _seconds(value: float) -> str:
    return "-" if not math.isfinite(value) else f"{value:.3f}"


def plot_runs(runs: Sequence[SystemRun], path: Path | str) -> Path:
    """Rate, replicas per LLM and latency over time, one column per system (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = max(len(runs), 1)
    figure, axes = plt.subplots(3, columns, figsize=(4.2 * columns, 8), sharex=True, squeeze=False)
    for j, run in enumerate(runs):
        minutes = [s.time_s / 60 for s in run.timeline]
        workflows = [w.name for w in run.workflows]
        llms = sorted(run.timeline[0].ready) if run.timeline else []
        for w in workflows:
            axes[0][j].plot(minutes, [s.rate_rps.get(w, 0.0) for s in run.timeline], label=w)
            axes[2][j].plot(minutes, [s.latency_s.get(w, math.nan) for s in run.timeline], label=w)
            axes[2][j].axhline(run.workflow(w).slo_s, linestyle="--", linewidth=0.8, color="grey")
        for m in llms:
            axes[1][j].step(minutes, [s.ready.get(m, 0) + s.starting.get(m, 0) for s in run.timeline], where="post",
                            label=m, linewidth=1.0)
        axes[0][j].set_title(run.name)
        axes[2][j].set_yscale("log")
        axes[2][j].set_xlabel("time (min)")
    axes[0][0].set_ylabel("arrival rate (req/s)")
    axes[1][0].set_ylabel("replicas (serving + starting)")
    axes[2][0].set_ylabel("latency (s), SLO dashed")
    for row in range(3):
        axes[row][0].legend(fontsize="x-small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return Path(path)
