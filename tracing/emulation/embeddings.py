"""Embeddings and scores of the emulated encoders: deterministic, and similar for texts that share
words (feature hashing of the token units)."""

from __future__ import annotations

import hashlib

import numpy as np

from scepsy.tracing.emulation.tokenizer import token_units


def text_features(item) -> list[str]:
    """The units of an input (text, or token ids) as embedding features (case-folded)."""
    if isinstance(item, str):
        return [unit.strip().lower() for unit in token_units(item)]
    return [f"#{int(token)}" for token in item]


def hashed_embedding(features: list[str], width: int) -> np.ndarray:
    """Feature hashing: each feature adds +-1 at a hashed position, so cosine similarity grows
    with shared words; a small hash of the whole input keeps distinct inputs apart."""
    vector = np.zeros(width, dtype=np.float64)
    for feature in features:
        digest = int.from_bytes(hashlib.blake2b(feature.encode(), digest_size=8).digest(), "big")
        vector[digest % width] += 1.0 if (digest >> 32) & 1 else -1.0
    whole = np.random.default_rng(int.from_bytes(hashlib.blake2b("\x00".join(features).encode(), digest_size=8).digest(), "big"))
    return vector + 0.05 * whole.standard_normal(width)


def unit_vector(vector: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(vector)
    return vector / norm if norm else vector
