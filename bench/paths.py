"""Import paths of the benchmarks: the repository root (examples/) and tests/ (tests/support/),
which are not part of the installed package. Import this module before those."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
for folder in (REPO / "tests", REPO):
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
