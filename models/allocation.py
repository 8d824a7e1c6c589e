"""Allocations (what each LLM gets) and placements (where each shard runs): the planner's decisions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError
from .instance import parse_yaml


@dataclass(frozen=True, order=True)
class LlmAllocation:
    """d replicas of one LLM, each with `tp` shards of `share` units (1/F of a GPU) on one gpu type."""

    llm: str
    gpu_type: str
    tp: int
    share: int
    replicas: int

    @property
    def shape(self) -> tuple[str, int, int]:
        """What placement needs to know of a replica: (gpu_type, tp, share units per shard)."""
        return (self.gpu_type, self.tp, self.share)

    @property
    def units(self) -> int:
        return self.tp * self.share * self.replicas


@dataclass(frozen=True)
class Allocation:
    fractions_per_gpu: int
    llms: tuple[LlmAllocation, ...]

    def of(self, llm: str) -> LlmAllocation:
        for choice in self.llms:
            if choice.llm == llm:
                return choice
        raise KeyError(llm)

    @property
    def units(self) -> int:
        return sum(c.units for c in self.llms)

    def gpus(self) -> float:
        return self.units / self.fractions_per_gpu


@dataclass(frozen=True, order=True)
class Shard:
    gpu: int  # index of the GPU within its node
    units: int


@dataclass(frozen=True, order=True)
class ReplicaPlacement:
    llm: str
    replica: int
    node: str
    shards: tuple[Shard, ...]


@dataclass(frozen=True)
class Placement:
    fractions_per_gpu: int
    replicas: tuple[ReplicaPlacement, ...]

    def to_json(self) -> list[dict]:
        f = self.fractions_per_gpu
        return [
            {
                "llm": r.llm,
                "replica": r.replica,
                "node": r.node,
                "shards": [{"gpu": s.gpu, "fraction": round(s.units / f, 9)} for s in r.shards],
            }
            for r in self.replicas
        ]


# What an allocation record may hold: its own fields, plus those of a plan JSON's `llms` entries
# (models/plan.py, prediction_to_json), so that a plan is an allocation too.
ALLOCATION_FIELDS = ("name", "gpu_type", "tp", "fraction", "replicas")
RECORD_FIELDS = frozenset(ALLOCATION_FIELDS + ("llm", "model", "gpus", "per_replica_rate", "offered_rate_rps", "latency_s",
                                               "capacity_rps", "utilization", "overloaded"))
MAX_REPLICAS = 1_000_000


def allocation_from_records(records: list, fractions_per_gpu: int, source: str, known: dict[str, set[str]]) -> Allocation:
    """Build an allocation from `llms:` records ({name|llm, gpu_type, tp, fraction, replicas}).

    `known` maps each LLM name to its usable gpu types; a plan JSON's `llms` list is such a list.
    """
    choices = []
    for i, record in enumerate(records):
        where = f"llms[{i}]"
        if not isinstance(record, dict):
            raise InputError(source, where, "expected a mapping", "write {name, gpu_type, tp, fraction, replicas}")
        name = record.get("name", record.get("llm"))
        if not isinstance(name, str) or name not in known:
            raise InputError(source, f"{where}.name", f"unknown llm {name!r}", f"use one of: {', '.join(sorted(known))}")
        unknown = sorted(str(k) for k in record if k not in RECORD_FIELDS)
        if unknown:
            raise InputError(source, f"{where} ({name}).{unknown[0]}", "unknown field",
                             "remove it or correct its spelling: name, gpu_type, tp, fraction, replicas")
        missing = [k for k in ("gpu_type", "tp", "fraction", "replicas") if k not in record]
        if missing:
            raise InputError(source, f"{where} ({name}).{missing[0]}", "missing field", "add it")
        if not isinstance(record["gpu_type"], str) or record["gpu_type"] not in known[name]:
            raise InputError(
                source, f"{where} ({name}).gpu_type", f"unknown gpu type {record['gpu_type']!r}", f"use one of: {', '.join(sorted(known[name]))}"
            )
        tp, replicas, fraction = record["tp"], record["replicas"], record["fraction"]
        for key, value in (("tp", tp), ("replicas", replicas)):
            if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_REPLICAS:
                raise InputError(source, f"{where} ({name}).{key}", f"{value!r} is not a whole number in 1..{MAX_REPLICAS}",
                                 "write a whole number such as 1 or 2")
        if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not math.isfinite(fraction):
            raise InputError(source, f"{where} ({name}).fraction", f"{fraction!r} is not a number", "write e.g. 0.5")
        share = round(fraction * fractions_per_gpu) if 0 < fraction <= 1 else 0
        if not 0 < fraction <= 1 or abs(share - fraction * fractions_per_gpu) > 1e-6:
            raise InputError(
                source,
                f"{where} ({name}).fraction",
                f"fraction {fraction:g} is not a multiple of 1/{fractions_per_gpu} in (0, 1]",
                f"use k/{fractions_per_gpu} for an integer k",
            )
        choices.append(LlmAllocation(name, record["gpu_type"], tp, share, replicas))
    names = [c.llm for c in choices]
    for name in known:
        if name not in names:
            raise InputError(source, "llms", f"llm {name} has no allocation", "add an entry for it")
    if len(set(names)) != len(names):
        raise InputError(source, "llms", "an llm is listed twice", "list each llm once")
    return Allocation(fractions_per_gpu, tuple(choices))


def load_allocation(path: Path | str, fractions_per_gpu: int, known: dict[str, set[str]]) -> Allocation:
    """Read an allocation YAML (or a plan JSON): a top-level `llms:` list of records."""
    raw = parse_yaml(Path(path))
    if not isinstance(raw, dict) or not isinstance(raw.get("llms"), list):
        raise InputError(str(path), "llms", "missing the `llms:` list", "write llms: [{name, gpu_type, tp, fraction, replicas}, ...]")
    return allocation_from_records(raw["llms"], fractions_per_gpu, str(path), known)
