"""The CP-SAT solver set-up shared by every CP-SAT model (allocation, placement, placeability):
a time limit, a worker count and a fixed seed, deterministic whatever the thread timing."""

from __future__ import annotations

from ortools.sat.python import cp_model

STATUS_NAMES = {
    cp_model.OPTIMAL: "optimal",
    cp_model.FEASIBLE: "feasible",
    cp_model.INFEASIBLE: "infeasible",
    cp_model.MODEL_INVALID: "model_invalid",
    cp_model.UNKNOWN: "unknown",
}


def cpsat_solver(time_limit_s: float, workers: int = 1, **parameters: object) -> cp_model.CpSolver:
    """A solver with the time limit (at least 10 ms), `workers` threads, seed 0, interleaved search
    with several workers (deterministic), and the model-specific `parameters` (CP-SAT field names)."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = max(time_limit_s, 0.01)
    solver.parameters.num_workers = workers
    solver.parameters.random_seed = 0
    for name, value in parameters.items():
        setattr(solver.parameters, name, value)
    if workers > 1:
        solver.parameters.interleave_search = True  # deterministic whatever the thread timing
    return solver
