"""The policy's knobs as an operator sets them: a settings file (YAML mapping, knob -> value) and
NAME=VALUE items (the command line's `--setting`), read into one ControlSettings, which validates
them (control/policy.py: its fields are the knobs, its defaults the defaults).

Order, later wins: ControlSettings' defaults, the file, the NAME=VALUE items. A value is read as
YAML (`0.2`, `ewma`, `null`) and converted to the field's type; an unknown knob, a value of the
wrong type or one ControlSettings refuses is an InputError naming the file (or `setting`) and the
knob.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path

import yaml

from scepsy.control.policy import ControlSettings, SettingError
from scepsy.models.errors import InputError
from scepsy.models.inputs import load_yaml

SETTING_ARGUMENT = "setting"  # the argument NAME=VALUE items come from (the CLI: --setting)


@functools.cache
def knob_types() -> dict[str, object]:
    """Knob -> its declared type (ControlSettings' annotations)."""
    hints = typing.get_type_hints(ControlSettings)
    return {f.name: hints[f.name] for f in dataclasses.fields(ControlSettings)}


def defaults() -> dict[str, object]:
    """Knob -> default, in ControlSettings' order."""
    return {f.name: f.default for f in dataclasses.fields(ControlSettings)}


def describe_defaults() -> str:
    """One line: every knob with its default (`sustain_s=300, headroom=0.1, ...`)."""
    def shown(value: object) -> str:
        return "null" if value is None else f"{value:g}" if isinstance(value, float) else str(value)

    return ", ".join(f"{name}={shown(value)}" for name, value in defaults().items())


def _convert(name: str, value: object, where: str | None, argument: bool) -> object:
    """`value` as the knob's type (an int is a float; a whole float is an int; null only where the
    knob may be null)."""
    kind = knob_types()[name]
    allowed = typing.get_args(kind) or (kind,)
    if value is None and type(None) in allowed:
        return None
    if isinstance(value, bool):
        value = str(value).lower()  # `yes` and `true` read as booleans, never as a number
    if float in allowed and isinstance(value, (int, float)):
        return float(value)
    if int in allowed and isinstance(value, (int, float)) and float(value).is_integer():
        return int(value)
    if str in allowed and isinstance(value, (str, int, float)):
        return str(value)
    wanted = " or ".join("null" if t is type(None) else getattr(t, "__name__", str(t)) for t in allowed)
    example = {float: "0.2", int: "2", str: "ewma"}.get(next((t for t in allowed if t is not type(None)), str), "0.2")
    raise InputError(where, name, f"{value!r} is not a {wanted}", f"give e.g. {name}: {example}", argument=argument)


def _unknown(name: object, where: str | None, argument: bool) -> InputError:
    return InputError(where, str(name), "no such knob of the controller",
                      f"use one of: {', '.join(defaults())}", argument=argument)


def read_file(path: Path | str) -> dict[str, object]:
    """The knobs of a settings file (a YAML mapping; an empty file sets none)."""
    source = str(path)
    data = load_yaml(path, "pass a YAML file of knob: value lines (scepsy control --help lists the knobs)")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(source, None, "not a mapping of knob: value", "write e.g. headroom: 0.2, one knob per line")
    out: dict[str, object] = {}
    for name, value in data.items():
        if name not in knob_types():
            raise _unknown(name, source, False)
        out[str(name)] = _convert(str(name), value, source, False)
    return out


def parse_items(items: Iterable[str]) -> dict[str, object]:
    """NAME=VALUE items (repeated names: the last wins)."""
    out: dict[str, object] = {}
    for item in items:
        name, sep, text = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise InputError(None, SETTING_ARGUMENT, f"{item!r} is not NAME=VALUE", "write e.g. headroom=0.2")
        if name not in knob_types():
            raise _unknown(name, None, True)
        try:
            value = yaml.safe_load(text) if text.strip() else None
        except yaml.YAMLError:
            value = text
        out[name] = _convert(name, value, None, True)
    return out


def control_settings(base: Mapping[str, object], file: Path | str | None = None, items: Iterable[str] = ()) -> ControlSettings:
    """ControlSettings of `base` (knob -> value: the command's own options), then the file's knobs,
    then the NAME=VALUE items; validated once, by ControlSettings."""
    values: dict[str, object] = dict(base)
    origin: dict[str, str | None] = {name: None for name in values}
    if file is not None:
        found = read_file(file)
        values.update(found)
        origin.update({name: str(file) for name in found})
    given = parse_items(items)
    values.update(given)
    origin.update({name: None for name in given})
    try:
        return ControlSettings(**values)  # type: ignore[arg-type]  # converted to each knob's type above
    except (ValueError, TypeError) as exc:
        name = exc.field if isinstance(exc, SettingError) else _named_knob(str(exc), values)
        where = origin.get(name) if name is not None else None
        raise InputError(where, name, str(exc), "change that knob (scepsy control --help lists each default)",
                         argument=where is None) from None


def _named_knob(message: str, values: Mapping[str, object]) -> str | None:
    """The knob a ControlSettings refusal is about: the first knob its message names."""
    positions = {name: message.find(name) for name in values if name in message}
    return min(positions, key=lambda name: positions[name]) if positions else None
