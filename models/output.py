"""The one writer of output files, and the checks of output paths, used by every command.

An output is never one of the call's inputs (exporting a trace store onto itself would replace it)
and never a directory where a file is wanted; an OSError while writing is an input error naming
the path and the argument that gave it (`field`, e.g. `out`; exit code 2), never a traceback.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from scepsy.models.errors import InputError
from scepsy.models.inputs import kind_of


def same_file(a: Path | str, b: Path | str) -> bool:
    """Whether two paths name one file (links and relative paths resolved; a missing file: by path)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_output(out: Path | str, inputs: Iterable[Path | str | None] = (), field: str = "out") -> Path:
    """Refuse an output file that is a directory or one of the inputs (writing would destroy it)."""
    out = Path(out)
    if kind_of(out) == "dir":
        raise InputError(str(out), field, "is a directory", f"give `{field}` a file path", argument=True)
    for given in inputs:
        if given is not None and same_file(out, given):
            raise InputError(str(out), field, f"is also an input ({given}); writing it would destroy that input",
                             f"give `{field}` another path", argument=True)
    return out


def check_output_dir(out: Path | str, inputs: Iterable[Path | str | None] = (), field: str = "out") -> Path:
    """Refuse an output directory that is an existing file or an input."""
    out = Path(out)
    if kind_of(out) not in ("dir", "missing"):
        raise InputError(str(out), field, "is a file, not a directory", f"give `{field}` a directory path", argument=True)
    for given in inputs:
        if given is not None and same_file(out, given):
            raise InputError(str(out), field, f"is also an input ({given})", f"give `{field}` another path", argument=True)
    return out


@contextmanager
def writing(path: Path | str, field: str = "out") -> Iterator[Path]:
    """Create the parent folders, yield the path; an OSError inside becomes an InputError naming
    the path and the argument to change."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        yield target
    except OSError as exc:
        raise InputError(str(target), field, f"cannot write ({exc.strerror or exc})", f"choose a writable `{field}` path",
                         argument=True) from None


def write_text(path: Path | str, text: str, field: str = "out") -> Path:
    """Write a text output (after check_output, when the caller has inputs to protect)."""
    check_output(path, (), field)
    with writing(path, field) as target:
        target.write_text(text)
    return target
