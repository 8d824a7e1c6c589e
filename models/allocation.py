"""Allocations (what each LLM gets) and placements (where each shard runs): the planner's decisions."""

from __future__ import annotations

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
        if name not in known:
            raise InputError(source, f"{where}.name", f"unknown llm {name!r}", f"use one of: {', '.join(sorted(known))}")
        missing = [k for k in ("gpu_type", "tp", "fraction", "replicas") if k not in record]
        if missing:
            raise InputError(source, f"{where} ({name}).{missing[0]}", "missing field", "add it")
        if record["gpu_type"] not in known[name]:
            raise InputError(
                source, f"{where} ({name}).gpu_type", f"unknown gpu type {record['gpu_type']!r}", f"use one of: {', '.join(sorted(known[name]))}"
            )
        try:
            tp, replicas, fraction = int(record["tp"]), int(record["replicas"]), float(record["fraction"])
        except (TypeError, ValueError):
            raise InputError(source, f"{where} ({name})", "tp, replicas and fraction must be numbers", "fix the values") from None
        if tp < 1 or replicas < 1:
            raise InputError(source, f"{where} ({name})", "tp and replicas must be >= 1", "fix the values")
        share = round(fraction * fractions_per_gpu)
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
