"""Exhaustive fuzzing of every command's inputs: each path of each shipped input (tests/fuzz_targets.py)
with each hostile value and structural mutation, plus seeded raw-text mutations; every case must
keep the README's promise (exit 0 with valid output, 2 with one plain line, or 3; never 1, never a
traceback, never a hang). tests/test_fuzz.py samples the same cases in CI.

    python bench/fuzz.py [--targets plan-instance,aggregate-traces] [--text-cases 20] [--hang-s 60]

Prints per target the cases run, the exit codes seen and every violation (the first line of the
failure and the command); exits 1 if there is any. A case still running after --hang-s seconds is
a hang (SIGALRM interrupts it in this process).
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fuzz_targets import TARGETS, check, command, mutated_copy  # noqa: E402
from hostile import HOSTILE_VALUES, STRUCTURAL, dump, load_document, mutate, paths, text_mutation, workspace  # noqa: E402


class Hang(Exception):
    pass


def _alarm(signum, frame):
    raise Hang()


def cases(target, text_cases: int):
    """(tag, mutated text) of every tree mutation and `text_cases` seeded text mutations."""
    source = Path(target.source)
    original = source.read_text()
    if target.tree:
        document = load_document(source)
        for p, path in enumerate(paths(document)):
            for m, mutation in enumerate(HOSTILE_VALUES + STRUCTURAL):
                yield f"p{p}m{m}", dump(mutate(document, path, mutation), source.suffix)
    for seed in range(text_cases):
        yield f"t{seed}", text_mutation(original, random.Random(seed))


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--targets", default="", help="comma-separated target names (default: all)")
    parser.add_argument("--text-cases", type=int, default=20)
    parser.add_argument("--hang-s", type=float, default=60.0)
    parser.add_argument("--limit", type=int, default=0, help="at most this many cases per target (0: all)")
    args = parser.parse_args()
    chosen = [t for t in TARGETS if not args.targets or t.name in args.targets.split(",")]
    directory = workspace(Path(tempfile.mkdtemp(prefix="scepsy-fuzz-")))
    os.chdir(directory)
    signal.signal(signal.SIGALRM, _alarm)
    violations = 0
    start = time.perf_counter()
    for target in chosen:
        codes: Counter = Counter()
        failures: list[str] = []
        for number, (tag, text) in enumerate(cases(target, args.text_cases)):
            if args.limit and number >= args.limit:
                break
            tag = f"{target.name}-{tag}"
            argv = command(directory, target, mutated_copy(directory, target, text, tag), tag)
            signal.setitimer(signal.ITIMER_REAL, args.hang_s)
            try:
                codes[check(directory, argv).code] += 1
            except Hang:
                codes["hang"] += 1
                failures.append(f"hang: {' '.join(argv)}")
            except AssertionError as exc:
                codes["broken"] += 1
                failures.append(f"{str(exc).splitlines()[0][:300]} | {str(exc).splitlines()[1][:200] if len(str(exc).splitlines()) > 1 else ''}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
        violations += len(failures)
        total = sum(codes.values())
        print(f"{target.name}: {total} cases, exit codes {dict(sorted(codes.items(), key=str))}, {len(failures)} violations", flush=True)
        for failure in failures:
            print(f"  {failure}", flush=True)
    print(f"total: {violations} violations in {time.perf_counter() - start:.0f} s")
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
