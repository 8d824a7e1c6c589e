"""tests/shipped.py: every shipped example and golden output has a target that regenerates it, the
check finds a changed file and ignores only timing fields, and the cheap targets reproduce."""

from __future__ import annotations

import json

import pandas as pd

import shipped
from conftest import REPO, load_script


def test_every_shipped_example_and_golden_folder_has_a_target():
    owned = {name for target in shipped.TARGETS for name in shipped.owned(target)}
    golden = {f"tests/golden/{p.name}" for p in (REPO / "tests" / "golden").iterdir() if p.is_dir()}
    assert golden <= owned
    for example in (REPO / "docs" / "examples").iterdir():  # an example's outputs: all but its inputs
        outputs = {f"docs/examples/{example.name}/{p.name}" for p in example.iterdir()} - {
            f"docs/examples/{example.name}/{n}" for n in ("run.sh", "instance.yaml", "models")}
        assert outputs and outputs <= owned, example
    assert {"docs/cli.md", "instances/profiles", "docs/figures"} <= owned
    for target in shipped.TARGETS:
        assert shipped.files_of(REPO, target), target.name  # each owns files that exist


def test_the_check_ignores_only_timing_fields(tmp_path):
    shipped_tree, produced = tmp_path / "shipped", tmp_path / "produced"
    plan = {"objective_value": 11.78, "solver": {"backend": "cpsat", "wall_time_s": 0.03}}
    for root, wall, value in ((shipped_tree, 0.03, 11.78), (produced, 2.5, 11.78)):
        (root / "a").mkdir(parents=True)
        (root / "a" / "plan.json").write_text(json.dumps({**plan, "objective_value": value, "solver": {"backend": "cpsat", "wall_time_s": wall}}))
        (root / "a" / "rows.csv").write_text("rate,latency\n1,0.5\n")
    assert shipped.differences(shipped_tree, produced, {"a/plan.json", "a/rows.csv"}) == []
    (produced / "a" / "plan.json").write_text(json.dumps({**plan, "objective_value": 11.84}))
    (produced / "a" / "rows.csv").write_text("rate,latency\n1,0.6\n")
    (produced / "a" / "extra.yaml").write_text("kind: Service\n")
    found = shipped.differences(shipped_tree, produced, {"a/plan.json", "a/rows.csv", "a/extra.yaml"})
    assert [line.split(":")[0] for line in found] == ["a/extra.yaml", "a/plan.json", "a/rows.csv"]
    assert "only in the regenerated output" in found[0] and "+1,0.6" in found[2]


def test_the_cheap_targets_reproduce(capsys):
    """The CLI reference and the golden manifests (the golden plans: tests/test_golden_plans.py;
    the config-aic example, a minute: .ci/run runs `python tests/shipped.py --check`)."""
    assert shipped.main(["--check", "--only", "cli-reference,golden-manifests"]) == 0, capsys.readouterr().out


def _cheap_job(job):
    """One (profile, GPU type, TP, fraction) part measured for real, small: a fixed request shape,
    two rates; profile "big" is a model whose weights do not fit the fraction (no rows)."""
    from scepsy.models.catalog import catalog
    from scepsy.models.profiles.request_sources import load_request_source
    from scepsy.models.profiles.synthesize import SynthesisSettings, synthesize

    name, gpu_type, tp, fraction = job[:4]
    settings = SynthesisSettings(requests_per_point=40, rate_points=(0.3, 0.8), max_extensions=0, refine_steps=0,
                                 fill_points=())
    model = catalog.model("llama-3.1-8b" if name == "big" else "llama-3.2-1b")
    frame, _ = synthesize(model, catalog.gpu("A6000"), [tp], (fraction,),
                          load_request_source("fixed:128,16"), settings, gpu_type=gpu_type)
    return name, frame


def test_a_profile_regeneration_that_stopped_goes_on_where_it_stopped(tmp_path):
    """generate_profiles.py --resume keeps each finished part; a later run measures only the rest
    and writes the same bytes as a run without stops."""
    from scepsy.models.instance.profile import write_profile

    generate = load_script("generate_profiles", REPO / "instances" / "generate_profiles.py")
    jobs = [("p", "A6000", 1, 1.0), ("big", "A6000", 1, 0.1), ("p", "A6000", 2, 0.5), ("q", "A6000", 1, 1.0)]
    whole = generate._measure(jobs, 1, None, run=_cheap_job)
    keep = tmp_path / "parts"
    generate._measure(jobs[:3], 1, keep, run=_cheap_job)  # the run that stopped after three parts
    measured: list = []
    resumed = generate._measure(jobs, 1, keep, run=lambda job: (measured.append(job), _cheap_job(job))[1])
    assert all(len(whole[generate._part_name(j)]) > 0 for j in jobs if j[0] != "big")
    assert measured == [jobs[3]] and resumed[generate._part_name(jobs[1])].empty  # kept as "does not fit"
    kept = sorted(generate._part_name(j) + (".none" if j[0] == "big" else "") for j in jobs)
    assert sorted(p.name for p in keep.iterdir()) == kept
    for name in ("p", "q"):
        a, b = tmp_path / f"whole-{name}.csv", tmp_path / f"resumed-{name}.csv"
        write_profile(pd.concat([whole[generate._part_name(j)] for j in jobs if j[0] == name], ignore_index=True), a)
        write_profile(pd.concat([resumed[generate._part_name(j)] for j in jobs if j[0] == name], ignore_index=True), b)
        assert a.read_bytes() == b.read_bytes()
