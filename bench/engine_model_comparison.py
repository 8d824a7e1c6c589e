"""The built-in engine model against AIConfigurator on a grid, and its recalibration (the tables of
docs/engine-model.md, "Against AIConfigurator").

    pip install 'scepsy[aiconfigurator]'
    python bench/engine_model_comparison.py [--backend vllm]

Grid (models/performance/engine_comparison.py): Llama-3.1-8B, Llama-3.1-70B, Qwen3-8B and Qwen3-30B-A3B (MoE,
from their config.json) x A100-80G, H100-SXM, H200, B200, L40S, RTX PRO 6000 x TP 1, 2, 4 x decode
(batch 1, 8, 32, 64 at 1,024 tokens of context) and prefill (one prompt of 512 or 2,048 tokens),
where the model fits. Errors are builtin / AIConfigurator - 1 per iteration. The calibration is fitted
on the fit half of the points (every other point of each model x GPU x phase group sorted by batch,
length and TP) and reported on the held-out half: mean absolute errors per (GPU, phase) and per
(GPU, TP, phase), each half before (the model uncalibrated) and after the fit; then the same fit on
every fixed split (SPLITS), and the fitted B200 all-reduce against AIConfigurator's own table.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from scepsy.models.catalog.catalog import gpu, model
from scepsy.models.performance.aiconfigurator import SYSTEMS, measured_allreduce_ms, package_version
from scepsy.models.performance.engine import Engine
from scepsy.models.performance.engine_comparison import (
    SPLITS, calibrated_errors, compare, default_models, fit_calibration, grid_points, training_points,
)

ROOT = Path(__file__).resolve().parents[1]
KEEP = ("H100-SXM",)  # the shipped profiles carry H100 rows: its numbers stay (docs/engine-model.md)


def _mean_abs(errors) -> float:
    return 100 * float(np.abs(errors).mean()) if len(errors) else float("nan")


def _groups(comparisons, with_tp: bool):
    groups = {}
    for c in comparisons:
        key = (c.point.gpu, c.point.tp, c.point.phase) if with_tp else (c.point.gpu, c.point.phase)
        groups.setdefault(key, []).append(c.error)
    return groups


def _table(comparisons, recalibrated, training, with_tp: bool) -> None:
    """Mean absolute error per group: training and held-out halves, before and after the fit."""
    halves = {}
    for side, chosen in (("fit", True), ("held", False)):
        halves[side, "before"] = _groups([c for c in comparisons if (c.point in training) == chosen], with_tp)
        halves[side, "after"] = _groups([c for c in recalibrated if (c.point in training) == chosen], with_tp)
    every = _groups(comparisons, with_tp)
    label = "| GPU | TP | phase" if with_tp else "| GPU | phase"
    print(f"{label} | points | built-in error, mean | fit half, before | fit half, recalibrated | "
          "held-out, before | held-out, recalibrated |")
    print("|---" * (len(label.split("|")) - 1) + "|---:" * 6 + "|")
    for key in sorted(every):
        cells = " | ".join(f"{_mean_abs(halves[h][key] if key in halves[h] else []):.1f}%" for h in
                           (("fit", "before"), ("fit", "after"), ("held", "before"), ("held", "after")))
        print(f"| {' | '.join(map(str, key))} | {len(every[key])} | {100 * np.mean(every[key]):+.1f}% | {cells} |")
    print()


def _splits_table(by_name, comparisons) -> None:
    """The same fit on every fixed split: held-out errors (is the stated split a lucky one?)."""
    print("| split | fit points | held-out points | held-out mean | B200 prefill (TP 1 / 2 / 4) | largest group | "
          "groups above 15% | B200 bulk all-reduce |")
    print("|---|---:|---:|---:|---|---|---|---|")
    for split in SPLITS:
        calibration = fit_calibration(by_name, comparisons, keep=KEEP, split=split)
        held = calibrated_errors(by_name, comparisons, calibration, training=False, split=split)
        groups = {key: _mean_abs(errors) for key, errors in _groups(held, with_tp=False).items()}
        per_tp = _groups([c for c in held if c.point.gpu == "B200" and c.point.phase == "prefill"], with_tp=True)
        tps = " / ".join(f"{_mean_abs(per_tp[key]):.1f}%" for key in sorted(per_tp))
        worst = max(groups, key=lambda key: groups[key])
        above = ", ".join(" ".join(key) for key, error in sorted(groups.items()) if error > 15) or "none"
        b200 = calibration.gpus.get("B200", {})
        bulk = f"{b200.get('nvlink_bulk_latency_us')} us, link scale {b200.get('bulk_link_scale')}"
        print(f"| {split} | {len(comparisons) - len(held)} | {len(held)} | {_mean_abs([c.error for c in held]):.1f}% | "
              f"{groups[('B200', 'prefill')]:.1f}% ({tps}) | {' '.join(worst)} {groups[worst]:.1f}% | {above} | {bulk} |")
    print()


def _allreduce_table(name: str = "B200") -> None:
    """The fitted all-reduce against AIConfigurator's own measured table (not used in the fit)."""
    measured = measured_allreduce_ms(SYSTEMS[name])
    sizes = sorted({elements for _, elements in measured if 2**13 <= elements <= 2**24})[::2]
    print(f"{name} all-reduce, us: AIConfigurator's vLLM table / the fitted model (bf16 message)")
    print("| GPUs | " + " | ".join(f"{2 * n / 1e6:.3g} MB" for n in sizes) + " |")
    print("|---:" + "|---:" * len(sizes) + "|")
    for tp in (2, 4):
        engine = Engine(model("llama-3.1-8b"), gpu(name), tp)
        cells = [f"{1e3 * measured[tp, n]:.1f} / {1e6 * engine._allreduce_s(2 * n):.1f}" for n in sizes]
        print(f"| {tp} | " + " | ".join(cells) + " |")
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--backend", default="vllm")
    args = parser.parse_args()
    if package_version() is None:
        sys.exit("AIConfigurator is not installed: pip install 'scepsy[aiconfigurator]'")
    cards = default_models(ROOT / "tests" / "fixtures" / "model_configs")
    by_name = {c.name: c for c in cards}
    comparisons, skipped = compare(grid_points(cards), args.backend)
    calibration = fit_calibration(by_name, comparisons, keep=KEEP)
    recalibrated = calibrated_errors(by_name, comparisons, calibration)
    training = training_points(comparisons)
    print(f"AIConfigurator {package_version()}, {args.backend} database; {len(comparisons)} points "
          f"({len(training)} in the fit half)\n")
    _table(comparisons, recalibrated, training, with_tp=False)
    _table(comparisons, recalibrated, training, with_tp=True)
    held_before = [c.error for c in comparisons if c.point not in training]
    held_after = [c.error for c in recalibrated if c.point not in training]
    print(f"all points: mean abs error {_mean_abs([c.error for c in comparisons]):.1f}% before; held-out: "
          f"{_mean_abs(held_before):.1f}% before, {_mean_abs(held_after):.1f}% recalibrated "
          f"(largest {100 * np.abs(held_after).max():.1f}%)")
    by_model = {}
    for c, h in zip(comparisons, recalibrated):
        if c.point not in training:
            by_model.setdefault(c.point.model, []).append((abs(c.error), abs(h.error)))
    for name, pairs in sorted(by_model.items()):
        b, a = np.mean(pairs, axis=0)
        print(f"  {name}: held-out mean abs {100 * b:.1f}% -> {100 * a:.1f}%")
    print(f"\nmoe_efficiency = {calibration.moe_efficiency}")
    for name, fields in sorted(calibration.gpus.items()):
        print(f"{name}: " + ", ".join(f"{k}={v:g}" for k, v in fields.items()))
    for line in skipped:
        print(f"skipped: {line}")
    print()
    _splits_table(by_name, comparisons)
    _allreduce_table()


if __name__ == "__main__":
    main()
