"""The one writer of output files: every path a command writes goes through `writing` (or
`write_text`), so an unwritable path is one line and exit code 2, never a traceback."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from scepsy.models.errors import InputError


@contextmanager
def writing(path: Path | str, option: str = "--out") -> Iterator[Path]:
    """Create the parent folders, yield the path; an OSError inside becomes an InputError naming
    the path and the option to change."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        yield target
    except OSError as exc:
        raise InputError(str(target), None, f"cannot write ({exc.strerror or exc})", f"choose a writable {option} path") from None


def write_text(path: Path | str, text: str, option: str = "--out") -> Path:
    with writing(path, option) as target:
        target.write_text(text)
    return target
