"""Fuzz suite: mutated copies of the shipped instances, plans, allocations, profiles, traces,
benchmark results, NVML answers and kubeconfigs, each run through the command that reads it; every
case must keep the README's promise (tests/hostile.py: exit 0 with valid output, 2 with one plain
line, or 3; never 1, never a traceback). Every test run samples SCEPSY_FUZZ_EXAMPLES cases per
target (default 12, a fixed derandomised sample), the exhaustive run 25; bench/fuzz.py walks every
path and mutation.
"""

from __future__ import annotations

import os
import random

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from fuzz_targets import TARGETS, check, command, mutated_copy
from hostile import HOSTILE_VALUES, STRUCTURAL, dump, load_document, mutate, paths, text_mutation, workspace

EXAMPLES = int(os.environ.get("SCEPSY_FUZZ_EXAMPLES", "12"))
EXHAUSTIVE_EXAMPLES = 25


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    directory = workspace(tmp_path_factory.mktemp("fuzz"))
    here = os.getcwd()
    os.chdir(directory)  # the targets name the shipped inputs relative to the workspace
    yield directory
    os.chdir(here)


@st.composite
def mutated_text(draw, target):
    source = target.source
    with open(source) as handle:
        original = handle.read()
    if not target.tree or draw(st.integers(0, 4)) == 0:
        return text_mutation(original, random.Random(draw(st.integers(0, 2**32 - 1))))
    document = load_document(__import__("pathlib").Path(source))
    where = paths(document)
    path = where[draw(st.integers(0, len(where) - 1))]
    mutation = draw(st.sampled_from(HOSTILE_VALUES + STRUCTURAL))
    return dump(mutate(document, path, mutation), "." + source.rsplit(".", 1)[-1])


@pytest.mark.parametrize("examples", [pytest.param(EXAMPLES, id="sample"),
                                      pytest.param(EXHAUSTIVE_EXAMPLES, id="wide", marks=pytest.mark.exhaustive)])
@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_mutated_inputs_keep_the_promise(ws, target, examples):
    counter = iter(range(10**9))

    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
    @given(st.data())
    def case(data):
        text = data.draw(mutated_text(target))
        tag = f"{target.name}-{next(counter)}"
        check(ws, command(ws, target, mutated_copy(ws, target, text, tag), tag))

    case()


def test_the_shipped_inputs_themselves_pass(ws):
    """The unmutated inputs: exit 0 for every target (the mutations start from valid input)."""
    for target in TARGETS:
        if target.name.startswith("deploy"):
            continue  # no cluster here: exit 2, checked by the promise in the mutated runs
        original = ws / target.source
        result = check(ws, unhurried(command(ws, target, original, f"{target.name}-original")))
        assert result.code == 0, (target.name, result.err)


LIMIT_FLAGS = ("--time-limit-s", "--placement-time-limit-s")


def unhurried(argv: list[str]) -> list[str]:
    """The command with generous time limits: the short ones keep mutated cases quick, but a
    shipped input must plan (exit 0) however loaded the machine is, not exit 3 when a 2 s limit
    expires while a busy machine still builds the options."""
    return [("60" if i > 0 and argv[i - 1] in LIMIT_FLAGS else part) for i, part in enumerate(argv)]
