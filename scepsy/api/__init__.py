"""The public Python API: what the `scepsy` commands do, callable from notebooks and scripts.

    from scepsy import plan, place, predict, simulate
    result = plan("instances/beam-4xa6000.yaml", objective="min_gpus")
    print(plan_document(result))

Every command of the command line is one function here (docs/cli.md lists them): plan, place,
predict, whatif, simulate_rates, sweep, synthesize_profile, import_profile, replay_profile,
aggregate_traces, export_traces, proxy, emulate, topology, manifests, deploy, status, control and
simulate_control. What a command prints is a function of its result: `<result>_document` (the
JSON of `--json`) and `<result>_view` (the table or lines without it), e.g. `plan_document(plan)`,
`sweep_view(run)`.

One module per step of the flow, each re-exported here (`from scepsy.api import plan` and
`scepsy.api.plan` are the function): trace (measurement: traces, proxy, emulator, topology),
profile, plan (plan, place, predict), simulate, study (whatif, sweep), deploy (manifests, deploy,
status), control.

Instances and allocations may be given as files (paths) or as loaded objects; every function
raises scepsy's typed errors (models/errors.py) with the line that says how to fix the input,
naming the argument as this package spells it (`clusters`, `time_limit_s`).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scepsy.api.control import (
        ControlRun, ControlSimulation, control, control_knobs, control_run_document, control_settings,
        control_simulation_document, control_simulation_view, live_control_settings, simulate_control,
    )
    from scepsy.api.deploy import (
        Deployed, Manifests, Status, controller_settings, deploy, deployed_document, deployed_view, manifest_settings, manifests,
        manifests_document, manifests_view, status, status_document, status_view,
    )
    from scepsy.api.plan import (
        AllocationLike, InstanceLike, PathLike, PlacementLike, allocation_of, load, place, placement_document,
        placement_settings, plan, plan_document, predict, prediction_document,
    )
    from scepsy.api.profile import (
        ImportedProfile, ReplayProfile, SynthesizedProfile, import_profile, replay_document, replay_profile, replay_settings,
        replay_view, synthesis_document, synthesize_profile, write_profile_rows,
    )
    from scepsy.api.simulate import (
        ROUTINGS, SimulatedRun, simulate, simulate_rates, simulation_document, simulation_settings,
    )
    from scepsy.api.study import Study, SweepRun, study_document, study_view, sweep, sweep_document, sweep_view, whatif
    from scepsy.api.trace import (
        TRACE_FORMATS, Recorded, aggregate_traces, emulate, emulator_config, export_traces, proxy, recorded_view,
        stats_document, stats_view, topology, topology_document, trace_files,
    )
    from scepsy.models.plan.report import placement_view, plan_view, prediction_view, simulation_view
    from scepsy.models.profiles.synthesize import SynthesisSettings
    from scepsy.models.simulation.simulator import SimulationSettings
    from scepsy.k8s.manifests import ManifestSettings

# Each name's module: imported on first use (`scepsy emulate` and `scepsy proxy` start without the
# planner's, the simulator's and the cluster client's imports); type checkers read the imports below
_EXPORTS: dict[str, tuple[str, ...]] = {
    "scepsy.api.control": ("ControlRun", "ControlSimulation", "control", "control_knobs", "control_run_document", "control_settings", "control_simulation_document", "control_simulation_view", "live_control_settings", "simulate_control",),
    "scepsy.api.deploy": ("Deployed", "Manifests", "Status", "controller_settings", "manifest_settings", "deploy", "deployed_document", "deployed_view", "manifests", "manifests_document", "manifests_view", "status", "status_document", "status_view",),
    "scepsy.api.plan": ("AllocationLike", "InstanceLike", "PathLike", "PlacementLike", "allocation_of", "load", "place", "placement_document", "placement_settings", "plan", "plan_document", "predict", "prediction_document",),
    "scepsy.api.profile": ("ImportedProfile", "ReplayProfile", "SynthesizedProfile", "import_profile", "replay_document", "replay_profile", "replay_settings", "replay_view", "synthesis_document", "synthesize_profile", "write_profile_rows",),
    "scepsy.api.simulate": ("ROUTINGS", "SimulatedRun", "simulate", "simulate_rates", "simulation_document", "simulation_settings",),
    "scepsy.api.study": ("Study", "SweepRun", "study_document", "study_view", "sweep", "sweep_document", "sweep_view", "whatif",),
    "scepsy.api.trace": ("TRACE_FORMATS", "Recorded", "aggregate_traces", "emulate", "emulator_config", "export_traces", "proxy", "recorded_view", "stats_document", "stats_view", "topology", "topology_document", "trace_files",),
    "scepsy.models.plan.report": ("placement_view", "plan_view", "prediction_view", "simulation_view",),
    "scepsy.models.profiles.synthesize": ("SynthesisSettings",),
    "scepsy.models.simulation.simulator": ("SimulationSettings",),
    "scepsy.k8s.manifests": ("ManifestSettings",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


# the results (ControlRun, Study, ...), what the functions accept (InstanceLike, ...) and the other
# names imported above are reachable as scepsy.api.NAME too; __all__ holds the functions.
# what the commands do, one function each (docs/cli.md names each command's)
OPERATIONS = (
    "plan", "place", "predict", "whatif", "simulate", "simulate_rates", "sweep", "synthesize_profile",
    "import_profile", "replay_profile", "aggregate_traces", "export_traces", "proxy", "emulate", "topology",
    "manifests", "deploy", "status", "control", "simulate_control",
)
__all__ = [
    "plan", "place", "predict", "whatif", "simulate", "simulate_rates", "sweep", "synthesize_profile",
    "import_profile", "replay_profile", "aggregate_traces", "export_traces", "proxy", "emulate", "topology",
    "manifests", "deploy", "status", "control", "simulate_control",
    # their inputs
    "load", "allocation_of", "placement_settings", "simulation_settings", "replay_settings", "emulator_config",
    "control_settings", "live_control_settings", "control_knobs", "SimulationSettings", "SynthesisSettings", "ManifestSettings", "manifest_settings",
    "controller_settings",
    # what the commands print: a document (--json) and a view of each result
    "plan_document", "placement_document", "prediction_document", "simulation_document", "stats_document",
    "study_document", "sweep_document", "synthesis_document", "replay_document", "topology_document",
    "manifests_document", "deployed_document", "status_document", "control_simulation_document",
    "control_run_document",
    "plan_view", "placement_view", "prediction_view", "simulation_view", "stats_view", "study_view", "sweep_view",
    "replay_view", "recorded_view", "manifests_view", "deployed_view", "status_view", "control_simulation_view",
]


class _Api(ModuleType):
    """The package's own module type: a submodule named like the function it holds (plan, simulate,
    deploy, control) is not bound over that function when it is imported."""

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(value, ModuleType) and name in _MODULE_OF:
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Api


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'scepsy.api' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # once: the next lookup does not come here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_MODULE_OF})
