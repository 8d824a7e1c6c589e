"""Input files, read the same way by every command (output paths: models/output.py).

Inputs are read with a size bound and only when they are regular files: a FIFO would block the
command forever and `/dev/zero` would never end, so both are refused before they are opened. The
bound is `SCEPSY_MAX_INPUT_MIB` mebibytes (default 1024), checked on the file's size and again while
reading (a file that grows under us). YAML is parsed safely with duplicate keys refused (YAML says
keys are unique; PyYAML keeps the last one silently) and a nesting too deep to follow is an input
error, not a RecursionError. JSON is parsed with duplicate keys, NaN and Infinity refused.

Every problem is an `InputError` (exit code 2) naming the file, the field and the fix.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Iterator

import yaml

from scepsy.models.errors import InputError, check_deadline

DEFAULT_MAX_INPUT_MIB = 1024
MAX_INPUT_ENV = "SCEPSY_MAX_INPUT_MIB"


def max_input_bytes() -> int:
    """The input size bound in bytes (SCEPSY_MAX_INPUT_MIB, default 1024 MiB)."""
    text = os.environ.get(MAX_INPUT_ENV)
    if text is None:
        return DEFAULT_MAX_INPUT_MIB * 2**20
    try:
        mib = float(text)
    except ValueError:
        mib = -1.0
    if not 0 < mib < 2**40:
        raise InputError(None, MAX_INPUT_ENV, f"{text!r} is not a positive number of MiB", "unset it or write e.g. 4096")
    return int(mib * 2**20)


def kind_of(path: Path | str) -> str:
    """"file", "dir", "missing" or "other" (an over-long or unreadable name is "missing": the
    pathlib tests raise OSError for it instead of answering)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return "missing"
    return "file" if stat.S_ISREG(mode) else "dir" if stat.S_ISDIR(mode) else "other"


def check_input(path: Path | str, fix: str = "check the path") -> int:
    """Refuse a missing, unreadable, non-regular or too large input before opening it; its size in bytes."""
    source = str(path)
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise InputError(source, None, "file not found", fix) from None
    except (OSError, ValueError) as exc:
        raise InputError(source, None, f"cannot read the file ({getattr(exc, 'strerror', None) or exc})", fix) from None
    if stat.S_ISDIR(info.st_mode):
        raise InputError(source, None, "is a directory, not a file", fix)
    if not stat.S_ISREG(info.st_mode):
        raise InputError(source, None, "not a regular file (a device, FIFO or socket)", "pass a regular file")
    _check_size(source, info.st_size)
    return info.st_size


def _check_size(source: str, size: int) -> None:
    limit = max_input_bytes()
    if size > limit:
        raise InputError(
            source, None, f"the file has more than {limit / 2**20:g} MiB, the input size limit",
            f"pass a smaller file, or raise the limit with {MAX_INPUT_ENV}",
        )


def read_bytes(path: Path | str, fix: str = "check the path") -> bytes:
    """The whole file, at most the size bound (read once)."""
    check_input(path, fix)
    limit = max_input_bytes()
    try:
        with open(path, "rb") as handle:
            data = handle.read(limit + 1)
    except OSError as exc:
        raise InputError(str(path), None, f"cannot read the file ({exc.strerror or exc})", fix) from None
    _check_size(str(path), len(data))
    return data


def read_text(path: Path | str, fix: str = "check the path") -> str:
    """The file as UTF-8 text (universal newlines), at most the size bound."""
    data = read_bytes(path, fix)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(str(path), f"byte {exc.start}", "not UTF-8 text", "save the file as UTF-8") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


# ---------------------------------------------------------------------------------------------
# YAML and JSON


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (merge keys `<<` still override),
    and stops at `deadline` (perf_counter seconds; None: never): a large instance file takes
    seconds to parse, and a command's time limit covers reading it."""

    deadline: float | None = None
    source = "the YAML file"

    def compose_node(self, parent, index):
        check_deadline(self.deadline, f"reading {self.source}")
        return super().compose_node(parent, index)


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # an unhashable key: construct_mapping reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def _load_single(text: str, source: str, deadline: float | None) -> object:
    """yaml.load with the loader stopping at `deadline` (TimeLimitError)."""
    loader = _UniqueKeyLoader(text)
    loader.source = source
    loader.deadline = deadline
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def parse_yaml_text(text: str, source: str, deadline: float | None = None) -> object:
    """Parse YAML text safely; malformed, duplicate-key or too deeply nested YAML is an InputError;
    past `deadline` (perf_counter seconds) a TimeLimitError."""
    try:
        return _load_single(text, source, deadline)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else None
        problem = getattr(exc, "problem", None) or "malformed YAML"
        fix = "give each key once" if str(problem).startswith("duplicate key") else "fix the YAML syntax there"
        raise InputError(source, where, f"malformed YAML: {problem}", fix) from None
    except RecursionError:
        raise InputError(source, None, "YAML nested too deeply to read", "flatten the structure") from None


def load_yaml(path: Path | str, fix: str = "check the path", deadline: float | None = None) -> object:
    """Read (bounded) and parse one YAML file (stopping at `deadline`, perf_counter seconds)."""
    return parse_yaml_text(read_text(path, fix), str(path), deadline)


def load_yaml_documents(path: Path | str, fix: str = "check the path") -> list:
    """Read (bounded) and parse a YAML stream of several documents (`---`)."""
    source = str(path)
    text = read_text(path, fix)
    try:
        return list(yaml.load_all(text, Loader=_UniqueKeyLoader))  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InputError(source, None, f"malformed YAML ({getattr(exc, 'problem', None) or exc})", fix) from None
    except RecursionError:
        raise InputError(source, None, "YAML nested too deeply to read", fix) from None


def _unique_object(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise ValueError(f"{text} is too large a number")
    return value


def parse_json_text(text: str, source: str, fix: str = "fix the JSON") -> object:
    """Parse JSON strictly: no duplicate keys, no NaN or Infinity (nor 1e999), nesting bounded."""
    try:
        return json.loads(text, object_pairs_hook=_unique_object, parse_constant=_no_constant, parse_float=_finite_float)
    except json.JSONDecodeError as exc:
        raise InputError(source, f"line {exc.lineno}", f"malformed JSON: {exc.msg}", fix) from None
    except ValueError as exc:
        raise InputError(source, None, f"malformed JSON: {exc}", fix) from None
    except RecursionError:
        raise InputError(source, None, "JSON nested too deeply to read", "flatten the structure") from None


def parse_json_values(text: str, source: str, fix: str = "fix the JSON") -> Iterator[tuple[int, object]]:
    """A sequence of JSON values (JSON Lines, or values written one after another, pretty-printed or
    not), each with the line it starts on; parsed as strictly as `parse_json_text`."""
    decoder = json.JSONDecoder(object_pairs_hook=_unique_object, parse_constant=_no_constant, parse_float=_finite_float)
    position, line, length = 0, 1, len(text)
    while True:
        start = position
        while position < length and text[position] in " \t\r\n":
            position += 1
        line += text.count("\n", start, position)
        if position == length:
            return
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            raise InputError(source, f"line {exc.lineno}", f"malformed JSON: {exc.msg}", fix) from None
        except ValueError as exc:
            raise InputError(source, f"line {line}", f"malformed JSON: {exc}", fix) from None
        except RecursionError:
            raise InputError(source, f"line {line}", "JSON nested too deeply to read", "flatten the structure") from None
        yield line, value
        line += text.count("\n", position, end)
        position = end


def load_json(path: Path | str, fix: str = "fix the JSON") -> object:
    """Read (bounded) and parse one JSON file."""
    return parse_json_text(read_text(path, fix), str(path), fix)
