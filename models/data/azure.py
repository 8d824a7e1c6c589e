"""The Azure LLM inference trace (2023), shipped with the package: `azure:conv` and `azure:code`.

Two production request traces of Azure's LLM inference services (about one hour each, 2023-11-16),
one row per request: TIMESTAMP (invocation time), ContextTokens (prompt length), GeneratedTokens
(output length). The files are the dataset's CSVs unchanged, compressed with xz; LICENSE.md beside
them gives the source, the licence (CC BY 4.0) and the attribution the dataset asks for.
"""

from __future__ import annotations

import lzma
from importlib import resources

AZURE_TRACES = {"conv": "AzureLLMInferenceTrace_conv.csv.xz", "code": "AzureLLMInferenceTrace_code.csv.xz"}


def azure_trace_text(kind: str) -> str:
    """The CSV text of the Azure trace `kind` (conv or code); KeyError for another kind."""
    packed = resources.files("scepsy.models.data").joinpath(AZURE_TRACES[kind]).read_bytes()
    return lzma.decompress(packed).decode("utf-8")
