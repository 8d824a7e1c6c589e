"""Checks of the arguments of a call (the API's keyword arguments, the command line's options):
each mistake is an InputError naming the argument (`field`, as the API spells it) and the fix."""

from __future__ import annotations

from typing import Iterable

from scepsy.models.errors import InputError

MAX_NUMBER = 1e9  # rates, load factors, seconds: beyond it lies no real workload, only overflow


def check_finite(value: float | None, field: str) -> None:
    """Refuse nan, inf and numbers too large to compute with (None: not given)."""
    if value is not None and not -MAX_NUMBER <= value <= MAX_NUMBER:
        raise InputError(None, field, f"{value!r} is not a finite number up to {MAX_NUMBER:g}", "give a finite value")


def check_fraction(fraction: float, field: str = "fraction") -> None:
    """A GPU share per shard: in (0, 1]."""
    if not 0 < fraction <= 1:
        raise InputError(None, field, f"{fraction:g} is not in (0, 1]", "give the GPU share per shard, e.g. 0.5")


def check_gpu_type(value: str, field: str = "gpu_type") -> None:
    """A GPU type label of profile rows: a name, as an instance's cluster.gpu_types spells it
    (not empty, no spaces around it, no control characters: the profile CSV must read it back)."""
    if not value.strip() or value != value.strip() or not value.isprintable():
        raise InputError(None, field, f"{value!r} is not a GPU type name",
                         "give the name the instance's cluster.gpu_types uses, e.g. A6000")


def check_choice(value: str, choices: Iterable[str], field: str, what: str) -> None:
    """`value` is one of `choices` (`what` names the kind of thing, e.g. "arrival process")."""
    listed = tuple(choices)
    if value not in listed:
        raise InputError(None, field, f"unknown {what} {value!r}", f"use one of: {', '.join(listed)}")
