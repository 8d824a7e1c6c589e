"""A plan `scepsy plan` writes is accepted by every command and API function that takes a plan or an
allocation, and they all agree on it: the same allocation, the same placement where they keep one,
the same prediction.

Every shipped instance is planned with every objective, from its full profiles and from sparse ones
(only the fractions 0.2, 0.5 and 1.0 kept, so that most shares are derived and the plan carries
`profile_derived_from_fractions`), and the plan JSON is given to `predict --allocation`, `place
--allocation`, `plan --current`, `simulate --plan` and `manifests`, and to api.predict, api.place,
api.plan(current=...), api.simulate and api.manifests. The solves end at their optimum: a
deterministic limit stops the allocation stages, and the wall-clock limits of the commands are set
far beyond what the shipped instances need, so that a loaded machine cannot cut a solve short (the
results would then differ between the readers); simulations are a few seconds long.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
import yaml

from conftest import INSTANCES
from hostile import run_cli

from scepsy import api
from scepsy.models.instance.instance import load_instance
from scepsy.models.instance.placement_check import validate_placement
from scepsy.models.output import json_number
from scepsy.models.plan.document import PlanDocument, plan_json, prediction_sections, read_allocation, read_current
from scepsy.pipeline import plan_and_place
from scepsy.placement.place import PlacementSettings
from scepsy.planner.allocation.objective import OBJECTIVES
from scepsy.planner.allocation.search import PlanSettings

SHIPPED = sorted(p.stem for p in INSTANCES.glob("*.yaml"))
SPARSE_FRACTIONS = (0.2, 0.5, 1.0)
SETTINGS = PlanSettings(time_limit_s=3600.0, stage_parameters=(("max_deterministic_time", 30.0),))
PLACING = PlacementSettings(time_limit_s=3600.0)
LIMITS = {"time_limit_s": 3600.0, "placement_time_limit_s": 3600.0}  # the same for the commands and the API
OPTIONS = ("--time-limit-s", "3600", "--placement-time-limit-s", "3600")
SIMULATED_S = 4.0


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """full/ and sparse/: the shipped instances (with a price per GPU hour, for min_cost) beside
    their profiles, all of them or only the rows of SPARSE_FRACTIONS."""
    root = tmp_path_factory.mktemp("inputs")
    for kind in ("full", "sparse"):
        (root / kind / "profiles").mkdir(parents=True)
        for profile in (INSTANCES / "profiles").glob("*.csv"):
            rows = list(csv.reader(profile.open()))
            column = rows[0].index("fraction")
            kept = [row for row in rows[1:] if kind == "full" or float(row[column]) in SPARSE_FRACTIONS]
            with (root / kind / "profiles" / profile.name).open("w", newline="") as handle:
                csv.writer(handle).writerows([rows[0], *kept])
        for name in SHIPPED:
            raw = yaml.safe_load((INSTANCES / f"{name}.yaml").read_text())
            for gpu_type in raw["cluster"]["gpu_types"].values():
                gpu_type.setdefault("cost_per_hour", 2.0)
            (root / kind / f"{name}.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return root


def _cli(*argv) -> dict:
    """`scepsy ARGV --json` in this process: its JSON output (exit 0 asserted)."""
    result = run_cli([str(a) for a in (*argv, "--json")])
    assert result.code == 0, (argv, result.err)
    return json.loads(result.out)


def _without_times(document: dict) -> dict:
    """A plan document without its wall times (the only fields that differ between two runs)."""
    document = json.loads(json.dumps(document))
    for section in ("solver", "placement_solver"):
        if document.get(section):
            document[section]["wall_time_s"] = None
    return document


def _close(a: object, b: object, rel: float) -> bool:
    """Equal documents, numbers within `rel` of each other."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_close(a[k], b[k], rel) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_close(x, y, rel) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=rel)
    return a == b


# every test run: every shipped instance with its own objective from its full profiles (combined-8xh100:
# two workflows), and every objective on rag-4xa6000 (from full and sparse profiles: its sparse plans
# carry derived shares, the test below); the exhaustive run: every case of the matrix
EVERY_OBJECTIVE = "rag-4xa6000"


OWN_OBJECTIVE = {name: load_instance(INSTANCES / f"{name}.yaml").objective for name in SHIPPED}  # once per instance


def _every_run(name: str, objective: str, kind: str) -> bool:
    return name == EVERY_OBJECTIVE or (kind == "full" and objective == OWN_OBJECTIVE[name])


CASES = [pytest.param(name, objective, kind, marks=[] if _every_run(name, objective, kind) else [pytest.mark.exhaustive],
                      id=f"{name}-{objective}-{kind}")
         for name in SHIPPED for objective in OBJECTIVES for kind in ("full", "sparse")]


@pytest.mark.slow
@pytest.mark.parametrize("name, objective, kind", CASES)
def test_every_reader_accepts_a_plan_and_agrees_on_it(inputs, tmp_path, name, objective, kind):
    path = inputs / kind / f"{name}.yaml"
    instance = load_instance(path).with_objective(objective)
    planned = plan_and_place(instance, SETTINGS, PLACING)
    document = plan_json(planned, include_wall_time=False)
    plan_file = tmp_path / "plan.json"
    plan_file.write_text(json.dumps(document, indent=2) + "\n")
    assert PlanDocument.model_validate(document).to_json() == document  # the schema reads what is written
    assert read_allocation(plan_file, instance) == planned.allocation
    assert read_current(plan_file, instance) == planned.placement
    sections = {"workflows": document["workflows"], "llms": document["llms"]}
    # the plan's prediction is at its own rates: the instance's, or max_throughput's load factor
    # times them (the load factor as written, to 9 digits: equal to 1e-7)
    if objective == "max_throughput":
        at_plan_rates = instance.scaled(document["load_factor"])
        assert _close(prediction_sections(api.predict(at_plan_rates, plan_file)), sections, 1e-7)
    else:
        assert prediction_sections(api.predict(instance, plan_file)) == sections

    # predict: the CLI and the API read the same allocation and predict alike
    predicted = _cli("predict", path, "--allocation", plan_file)
    assert predicted == prediction_sections(api.predict(path, plan_file))
    assert [{k: m[k] for k in ("name", "gpu_type", "tp", "fraction", "replicas")} for m in predicted["llms"]] == \
        [{k: m[k] for k in ("name", "gpu_type", "tp", "fraction", "replicas")} for m in document["llms"]]

    # place: the plan's allocation, placed validly, alike by the CLI and the API
    placed = _cli("place", path, "--allocation", plan_file, "--placement-time-limit-s", "3600")
    by_api = api.place(path, plan_file, placement_time_limit_s=3600.0)
    assert _without_times(placed) == _without_times(api.placement_document(str(path), planned.allocation, by_api))
    assert validate_placement(instance.cluster, planned.allocation, by_api.placement) == []

    # plan --current: the same plan again, every replica kept where it runs
    replanned = _cli("plan", path, "--objective", objective, "--current", plan_file, *OPTIONS)
    assert replanned["llms"] == document["llms"] and replanned["workflows"] == document["workflows"]
    assert replanned["placement_solver"]["objective"]["moved_shards"] == 0
    assert replanned["placement_solver"]["objective"]["kept_replicas"] == len(document["placement"])
    again = api.plan(path, objective=objective, current=plan_file, time_limit_s=LIMITS["time_limit_s"],
                     placement_time_limit_s=LIMITS["placement_time_limit_s"])
    assert _without_times(api.plan_document(again)) == _without_times(replanned)

    # simulate --plan: the plan's allocation runs, with the same prediction beside it
    simulated = _cli("simulate", path, "--plan", plan_file, "--duration-s", SIMULATED_S)
    run = api.simulate(path, plan_file, settings=api.simulation_settings(duration_s=SIMULATED_S))
    assert [w["completed"] for w in simulated["workflows"]] == [w.completed for w in run.workflows] and run.workflows
    for workflow in simulated["workflows"]:
        assert workflow["predicted_latency_s"] == json_number(
            next(w["latency_s"] for w in predicted["workflows"] if w["name"] == workflow["name"]), 6)

    # manifests: the plan's replicas, one engine Deployment each, alike by the CLI and the API
    from scepsy.k8s.plan_input import load_placed_plan

    _cli("manifests", plan_file, "--instance", path, "--out", tmp_path / "by-cli")
    written = api.manifests(plan_file, tmp_path / "by-api", instance=path)
    assert written.replicas == len(planned.placement.replicas)
    assert load_placed_plan(plan_file, path).replicas == tuple(sorted(planned.placement.replicas, key=lambda r: (r.llm, r.replica)))
    assert sorted(p.name for p in (tmp_path / "by-cli").iterdir()) == sorted(p.name for p in written.files)
    assert all((tmp_path / "by-cli" / p.name).read_text() == p.read_text() for p in written.files)


def test_sparse_profiles_make_plans_with_derived_shares(inputs):
    """The sparse half of the matrix is what it is for: plans whose shares were derived."""
    instance = load_instance(inputs / "sparse" / "rag-4xa6000.yaml")
    document = plan_json(plan_and_place(instance, SETTINGS, PLACING), include_wall_time=False)
    assert any("profile_derived_from_fractions" in m for m in document["llms"])
