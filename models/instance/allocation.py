"""Allocations (what each LLM gets) and placements (where each shard runs): the planner's decisions."""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def gpus(self) -> tuple[int, ...]:
        return tuple(s.gpu for s in self.shards)


@dataclass(frozen=True)
class Placement:
    fractions_per_gpu: int
    replicas: tuple[ReplicaPlacement, ...]

    def busy_gpus(self) -> set[tuple[str, int]]:
        """(node, gpu) of every GPU hosting at least one shard."""
        return {(r.node, s.gpu) for r in self.replicas for s in r.shards}
