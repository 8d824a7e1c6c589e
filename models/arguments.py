"""Checks of the arguments of a call (the API's keyword arguments, the command line's options):
each mistake is an InputError naming the argument (`field`, as the API spells it) and the fix."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Iterable, Mapping, TypeVar

from scepsy.models.errors import InputError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

T = TypeVar("T", bound="DataclassInstance")

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


def settings_with(kind: type[T], settings: T | None, overrides: Mapping[str, Any], what: str) -> T:
    """`settings` (default: `kind()`, every default of that frozen dataclass) with `overrides` of
    its fields, checked by the settings themselves; an override that is no field is an InputError
    naming it and the fields there are."""
    fields = {f.name for f in dataclasses.fields(kind)}
    for name in sorted(set(overrides) - fields):
        raise InputError(None, name, f"is not a {what}", f"use one of: {', '.join(sorted(fields))}", argument=True)
    if settings is None:
        return kind(**overrides)
    return dataclasses.replace(settings, **overrides) if overrides else settings
