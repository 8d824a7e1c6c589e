"""The engine model against published measurements (the table in docs/engine-model.md).

    python bench/engine_validation.py

Prints one markdown row per reference of tests/support/engine_validation.py and the error summary
(in-bound references only; see the module doc for what is out of bound and why).
"""

from __future__ import annotations

import numpy as np

import paths  # noqa: F401, E402 - examples/ and tests/support/ on the import path
from support.engine_validation import compare


def main() -> None:
    comparisons = compare()
    print("| reference | GPU | model | TP | engine | quantity | published | model | error | source |")
    print("|---|---|---|---:|---|---|---:|---:|---:|---|")
    for c in comparisons:
        r = c.reference
        bound = "" if r.in_bound else " (not in bound)"
        print(f"| {r.key} | {r.gpu} | {r.model} | {r.tp} | {r.engine} | {r.note} | {r.published:.4g} {r.unit} | "
              f"{c.modelled:.4g} {r.unit} | {100 * c.error:+.1f}%{bound} | [link]({r.source}) |")
    inside = [abs(c.error) for c in comparisons if c.reference.in_bound]
    print(f"\nin-bound references: {len(inside)}, mean absolute error {100 * np.mean(inside):.1f}%, "
          f"largest {100 * max(inside):.1f}%")


if __name__ == "__main__":
    main()
