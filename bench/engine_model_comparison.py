"""The built-in engine model against AIConfigurator on a grid, and its recalibration (the tables of
docs/engine-model.md, "Against AIConfigurator").

    pip install 'scepsy[aiconfigurator]'
    python bench/engine_model_comparison.py [--backend vllm]

Grid (models/performance/engine_comparison.py): Llama-3.1-8B, Llama-3.1-70B, Qwen3-8B and Qwen3-30B-A3B (MoE,
from their config.json) x A100-80G, H100-SXM, H200, B200, L40S, RTX PRO 6000 x TP 1, 2, 4 x decode
(batch 1, 8, 32, 64 at 1,024 tokens of context) and prefill (one prompt of 512 or 2,048 tokens),
where the model fits. Errors are builtin / AIConfigurator - 1 per iteration. The calibration is fitted
on the training half of the points and reported on the held-out half.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from scepsy.models.performance.aiconfigurator import package_version
from scepsy.models.performance.engine_comparison import (
    calibrated_errors, compare, default_models, fit_calibration, grid_points, training_points,
)

ROOT = Path(__file__).resolve().parents[1]
KEEP = ("H100-SXM",)  # the shipped profiles carry H100 rows: its numbers stay (docs/engine-model.md)


def _group(comparisons):
    groups = {}
    for c in comparisons:
        groups.setdefault((c.point.gpu, c.point.phase), []).append(c.error)
    return groups


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
    held_out = calibrated_errors(by_name, comparisons, calibration, training=False)
    training = training_points(comparisons)
    before, after = _group(comparisons), _group(held_out)
    before_held = _group([c for c in comparisons if c.point not in training])
    print(f"AIConfigurator {package_version()}, {args.backend} database; {len(comparisons)} points "
          f"({len(training)} training)\n")
    print("| GPU | phase | points | built-in error, mean (all points) | mean abs | held-out mean abs, before | held-out mean abs, recalibrated |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for key in sorted(before):
        errors = np.array(before[key])
        print(f"| {key[0]} | {key[1]} | {len(errors)} | {100 * errors.mean():+.1f}% | {100 * np.abs(errors).mean():.1f}% | "
              f"{100 * np.abs(before_held[key]).mean():.1f}% | {100 * np.abs(after[key]).mean():.1f}% |")
    all_before = np.abs([c.error for c in comparisons])
    held_before = np.abs([c.error for c in comparisons if c.point not in training])
    held_after = np.abs([c.error for c in held_out])
    print(f"\nall points: mean abs error {100 * all_before.mean():.1f}%; held-out: {100 * held_before.mean():.1f}% "
          f"before, {100 * held_after.mean():.1f}% recalibrated (largest {100 * held_after.max():.1f}%)")
    by_model = {}
    for c, h in zip([c for c in comparisons if c.point not in training], held_out):
        by_model.setdefault(c.point.model, []).append((abs(c.error), abs(h.error)))
    for name, pairs in sorted(by_model.items()):
        b, a = np.mean(pairs, axis=0)
        print(f"  {name}: held-out mean abs {100 * b:.1f}% -> {100 * a:.1f}%")
    print(f"\nmoe_efficiency = {calibration.moe_efficiency}")
    print("| GPU | compute_scale | memory_scale | link_scale |")
    print("|---|---:|---:|---:|")
    for name, (compute, memory, link) in sorted(calibration.scales.items()):
        print(f"| {name} | {compute:g} | {memory:g} | {link:g} |")
    for line in skipped:
        print(f"skipped: {line}")


if __name__ == "__main__":
    main()
