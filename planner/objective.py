"""Objectives over the LLM latencies of an allocation, shared by every backend.

`min_latency` is lexicographic:
  one workflow:    minimise L_w (seconds);
  several:         minimise max_w L_w / ref_w (egalitarian; ref_w = latency_slo_s, else the
                   workflow's own optimum alone on the cluster), then the request-weighted mean
                   latency sum_w lambda_w L_w / sum_w lambda_w.
Every backend breaks remaining ties by the fewest GPU share units, so plans do not waste GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from scepsy.models.instance import Instance


@dataclass(frozen=True)
class LatencyObjective:
    coefficients: Mapping[str, Mapping[str, float]]  # workflow -> llm -> n_wm / p_wm
    arrival_rates: Mapping[str, float]  # workflow -> lambda_w, requests/s
    references: Mapping[str, float] | None = None  # workflow -> ref_w, s (several workflows only)

    @staticmethod
    def for_instance(instance: Instance, references: Mapping[str, float] | None = None) -> "LatencyObjective":
        coefficients = {
            w.name: {s.llm: s.invocations / s.parallelism for s in w.stages} for w in instance.workflows
        }
        rates = {w.name: w.arrival_rate for w in instance.workflows}
        return LatencyObjective(coefficients, rates, references if len(instance.workflows) > 1 else None)

    @property
    def egalitarian(self) -> bool:
        return self.references is not None

    @property
    def stage_names(self) -> tuple[str, ...]:
        return ("max_latency_ratio", "mean_latency_s") if self.egalitarian else ("latency_s",)

    def workflow_latencies(self, latency_by_llm: Mapping[str, float]) -> dict[str, float]:
        return {
            w: sum(c * latency_by_llm[m] for m, c in coefs.items()) for w, coefs in self.coefficients.items()
        }

    def mean_weights(self) -> dict[str, float]:
        total = sum(self.arrival_rates.values())
        return {w: rate / total for w, rate in self.arrival_rates.items()}

    def llm_weight(self, stage: int, llm: str) -> dict[str, float]:
        """Per-workflow weight of one LLM's latency in a stage's expression (before the max over w)."""
        if not self.egalitarian:
            return {w: c.get(llm, 0.0) for w, c in self.coefficients.items()}
        if stage == 0:
            return {w: c.get(llm, 0.0) / self.references[w] for w, c in self.coefficients.items()}
        weights = self.mean_weights()
        return {"mean": sum(weights[w] * c.get(llm, 0.0) for w, c in self.coefficients.items())}

    def values(self, latency_by_llm: Mapping[str, float]) -> tuple[float, ...]:
        latencies = self.workflow_latencies(latency_by_llm)
        if not self.egalitarian:
            (only,) = latencies.values()
            return (only,)
        weights = self.mean_weights()
        ratio = max(latencies[w] / self.references[w] for w in latencies)
        return (ratio, sum(weights[w] * latencies[w] for w in latencies))
