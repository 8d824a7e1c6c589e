"""scepsy: GPU capacity planning for multi-LLM agentic workflows.

The public API (scepsy/api/): `from scepsy import plan, place, predict, simulate`. It is
imported on first use, so that `import scepsy.models...` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["plan", "place", "predict", "simulate"]

if TYPE_CHECKING:
    from scepsy.api import place, plan, predict, simulate


def __getattr__(name: str) -> Any:
    if name in __all__:
        from scepsy import api

        return getattr(api, name)
    raise AttributeError(f"module 'scepsy' has no attribute {name!r}")
