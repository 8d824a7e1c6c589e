"""Tail latency: predicted p90 and p99 workflow latency against simulated, two estimators.

    python bench/tail_accuracy.py [--duration-s 300]

For every shipped instance: plan it (CP-SAT, mean latency), keep the allocation, and at 10%..80% of
its capacity (as bench/prediction_accuracy.py) simulate it (seed 0) and compare the simulated p90
and p99 workflow latency with
  * `sum`: the sum of per-call percentiles, sum_m n/p * f * L_m^q (latency_metric: pq, the
    instance's latency_ratios removed), and
  * `ratio`: the traces' own request-level spread, latency_ratios[q] * sum_m n/p * f * L_m^mean,
    where latency_ratios[q] = pq / mean of the traced requests' latency (docs/model.md, section 3).
The traces are the workflows run alone at light load on one whole GPU per LLM
(instances/generate_profiles.py's setup: 0.5 requests/s, 400 requests), and the ratios are what
`scepsy aggregate` reports for them (`latency_ratios`).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

import numpy as np

from scepsy.models.instance.allocation import Allocation, LlmAllocation
from scepsy.models.performance.alp import predict
from scepsy.models.instance.instance import load_instance
from scepsy.models.simulation.simulator import SimulationSettings, simulate
from scepsy.planner.allocation.search import PlanSettings
from scepsy.planner.allocation.planning import make_plan

ROOT = Path(__file__).resolve().parent.parent
INSTANCES = sorted((ROOT / "instances").glob("*.yaml"))
LOADS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
TRACE_RATE_RPS = 0.5
TRACE_REQUESTS = 400


def traced_ratios(instance) -> dict[str, dict[str, float]]:
    """latency_ratios per workflow from a light-load trace: each workflow alone, one whole GPU
    (of the cluster's first type, the smallest TP degree that holds it) per LLM."""
    gpu_type = instance.cluster.used_gpu_types()[0]
    memory = instance.cluster.gpu_types[gpu_type].memory_gib
    f = instance.cluster.fractions_per_gpu
    ratios = {}
    for workflow in instance.workflows:
        alone = instance.only_workflow(workflow.name).with_arrival_rates({workflow.name: TRACE_RATE_RPS})
        choices = []
        for llm in alone.llms:
            tp = next(t for t in llm.tp_degrees if t * memory >= llm.memory_need_gib)
            choices.append(LlmAllocation(llm.name, gpu_type, tp, f, 1))
        settings = SimulationSettings(duration_s=TRACE_REQUESTS / TRACE_RATE_RPS, warmup_s=0.0, seed=0)
        stats = simulate(alone, Allocation(f, tuple(choices)), settings).workflow(workflow.name)
        ratios[workflow.name] = {q: getattr(stats, f"latency_{q}_s") / stats.latency_mean_s for q in ("p50", "p90", "p99")}
    return ratios


def estimator_instances(instance, ratios: dict[str, dict[str, float]]):
    """The instance each estimator predicts with: `sum` without any latency_ratios (the shipped
    instances carry some), `ratio` with the traced `ratios`."""
    def with_ratios(of):
        return replace(instance, workflows=tuple(replace(w, latency_ratios=of(w)) for w in instance.workflows))

    return with_ratios(lambda w: None), with_ratios(lambda w: ratios[w.name])


def run(path: Path, duration_s: float) -> list[dict]:
    instance = load_instance(path)
    plan = make_plan(instance, PlanSettings())
    capacity = min(w.max_throughput_rps / w.arrival_rate_rps for w in plan.prediction.workflows)
    without_ratios, with_ratios = estimator_instances(instance, traced_ratios(instance))
    rows = []
    for load in LOADS:
        loaded = instance.scaled(load * capacity)
        result = simulate(loaded, plan.allocation, SimulationSettings(duration_s=duration_s, seed=0))
        for q in ("p90", "p99"):
            by_sum = predict(replace(without_ratios.scaled(load * capacity), latency_metric=q), plan.allocation)
            by_ratio = predict(replace(with_ratios.scaled(load * capacity), latency_metric=q), plan.allocation)
            for w in result.workflows:
                simulated = getattr(w, f"latency_{q}_s")
                rows.append({
                    "instance": path.stem, "workflow": w.name, "load": load, "quantile": q, "simulated_s": simulated,
                    "sum_s": by_sum.workflow(w.name).latency_s, "ratio_s": by_ratio.workflow(w.name).latency_s,
                })
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--duration-s", type=float, default=300.0)
    parser.add_argument("--only", default=None, help="only the instances whose file name starts with this")
    args = parser.parse_args()
    paths = [p for p in INSTANCES if args.only is None or p.name.startswith(args.only)]
    rows = [row for path in paths for row in run(path, args.duration_s)]
    print("| instance | workflow | quantile | sum: MAPE | sum: worst | ratio: MAPE | ratio: worst |")
    print("|---|---|---|---:|---:|---:|---:|")
    keys = sorted({(r["instance"], r["workflow"], r["quantile"]) for r in rows})
    for key in keys:
        part = [r for r in rows if (r["instance"], r["workflow"], r["quantile"]) == key]
        cells = []
        for estimator in ("sum_s", "ratio_s"):
            errors = np.array([(r[estimator] - r["simulated_s"]) / r["simulated_s"] for r in part])
            worst = errors[np.argmax(np.abs(errors))]
            cells += [f"{100 * np.mean(np.abs(errors)):.1f}%", f"{100 * worst:+.1f}%"]
        print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    print("\nper point (rates as in bench/prediction_accuracy.py; latencies in s):\n")
    print("| instance | workflow | load | quantile | simulated_s | sum_s | ratio_s |")
    print("|---|---|---:|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['instance']} | {r['workflow']} | {r['load']:.0%} | {r['quantile']} | {r['simulated_s']:.3f} | "
              f"{r['sum_s']:.3f} | {r['ratio_s']:.3f} |")


if __name__ == "__main__":
    main()
