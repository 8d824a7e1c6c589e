"""Workflow rates from per-LLM request rates, through the instance's invocation counts n.

The Aggregate LLM Pipeline says lambda_m = sum_w lambda_w * n_wm. Given the observed per-LLM rates
lambda_m, the workflow rates are the non-negative least-squares solution

    minimise || N lambda_w - lambda_m ||_2   subject to lambda_w >= 0      (N[m, w] = n_wm)

(scipy.optimize.nnls). Where no LLM is shared, each row has one workflow and this is lambda_m / n_wm
averaged over the workflow's LLMs (weighted by n_wm^2); where LLMs are shared, it is the one
split of the shared rates consistent with the workflows' own LLMs.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from scipy.optimize import nnls  # the `control` extra

from scepsy.models.instance.instance import Instance


def invocation_matrix(instance: Instance, llms: list[str]) -> np.ndarray:
    """N[m, w] = n_wm, rows in `llms` order, columns in the instance's workflow order."""
    matrix = np.zeros((len(llms), len(instance.workflows)))
    row = {name: i for i, name in enumerate(llms)}
    for j, workflow in enumerate(instance.workflows):
        for stage in workflow.stages:
            if stage.llm in row:
                matrix[row[stage.llm], j] += stage.invocations
    return matrix


def workflow_rates(instance: Instance, llm_rates_rps: Mapping[str, float]) -> dict[str, float]:
    """lambda_w (requests/s) per workflow from the observed lambda_m of the LLMs given (module
    docstring); LLMs the instance does not call are ignored, a workflow none of whose LLMs is
    observed gets 0."""
    called = {s.llm for w in instance.workflows for s in w.stages}
    llms = sorted(m for m in llm_rates_rps if m in called)
    if not llms:
        return {w.name: 0.0 for w in instance.workflows}
    matrix = invocation_matrix(instance, llms)
    observed = np.array([max(float(llm_rates_rps[m]), 0.0) for m in llms])
    solution, _ = nnls(matrix, observed)
    return {w.name: float(solution[j]) for j, w in enumerate(instance.workflows)}
