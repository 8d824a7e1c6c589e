"""Profile synthesis: request sources, the sweep, the written CSV, and the CLI command."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pandas as pd
import pytest
from typer.testing import CliRunner

from conftest import REPO
from scepsy.cli import app
from scepsy.models.catalog import catalog
from scepsy.models.errors import InputError
from scepsy.models.instance.profile import PROFILE_COLUMNS, load_profile, write_profile
from scepsy.models.profiles.request_sources import RequestShape, load_request_source
from scepsy.models.profiles.synthesize import SynthesisSettings, stable_capacity_rps, synthesize

FAST = SynthesisSettings(requests_per_point=80, rate_points=(0.1, 0.5, 0.8, 1.0, 1.3))


def test_fixed_source_and_errors():
    source = load_request_source("fixed:512,128")
    assert source.shapes == (RequestShape(512, 128),)
    for bad in ("fixed:512", "fixed:a,b", "fixed:0,5"):
        with pytest.raises(InputError):
            load_request_source(bad)
    with pytest.raises(InputError, match="file not found"):
        load_request_source("no/such/file.jsonl")


def test_jsonl_source_filters_by_llm(tmp_path):
    path = tmp_path / "calls.jsonl"
    lines = [
        {"llm": "gen", "prompt_tokens": 300, "completion_tokens": 80, "cached_tokens": 200},
        {"llm": "ver", "prompt_tokens": 900, "completion_tokens": 1},
        {"llm": "gen", "prompt_tokens": 400, "completion_tokens": 60},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    gen = load_request_source(str(path), llm="gen")
    assert [s.prompt_tokens for s in gen.shapes] == [300, 400] and gen.shapes[0].cached_tokens == 200
    with pytest.raises(InputError, match="no calls"):
        load_request_source(str(path), llm="embed")
    path.write_text('{"prompt_tokens": "x"}\n')
    with pytest.raises(InputError, match="line 1"):
        load_request_source(str(path))


def test_the_shipped_azure_traces_are_the_published_files():
    """azure:conv and azure:code read the traces shipped in the package: the published CSVs, byte
    for byte (the sha256 sums in models/data/LICENSE.md), one request shape per row."""
    import hashlib

    from scepsy.models.data.azure import AZURE_TRACES, azure_trace_text

    notice = (REPO / "models" / "data" / "LICENSE.md").read_text()
    assert "CC BY 4.0" in notice and "Splitwise" in notice
    for kind, rows in (("conv", 19_366), ("code", 8_819)):
        text = azure_trace_text(kind)
        assert hashlib.sha256(text.encode()).hexdigest() in notice
        assert AZURE_TRACES[kind].removesuffix(".xz") in notice
        source = load_request_source(f"azure:{kind}")
        assert len(source.shapes) == rows == len(text.splitlines()) - 1 and source.clip_to_context
    conv = load_request_source("azure:conv")
    assert 500 < conv.mean_prompt_tokens < 2000 and 50 < conv.mean_completion_tokens < 400
    with pytest.raises(InputError, match="unknown Azure trace"):
        load_request_source("azure:chat")


def test_sweep_rows_are_a_valid_profile_with_a_saturating_curve(tmp_path):
    frame, skipped = synthesize(
        catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), [1], [0.2, 1.0],
        load_request_source("fixed:400,60"), FAST, gpu_type="A6000",
    )
    assert not skipped and list(frame.columns) == list(PROFILE_COLUMNS)
    path = tmp_path / "p.csv"
    write_profile(frame, path)
    profile = load_profile(path)
    small, whole = profile.curves[("A6000", 1)]
    assert small.fraction == 0.2 and whole.fraction == 1.0
    assert whole.capacity_rps > 2 * small.capacity_rps  # five times the GPU, not five times (overheads)
    for curve in (small, whole):
        assert curve.latencies_s["mean"][-1] > curve.latencies_s["mean"][0]  # queueing grows with load
    # the 130% point is past saturation and is written as an unstable row
    over = frame[frame["arrival_rate"] > frame.groupby("fraction")["arrival_rate"].transform("max") * 0.99]
    assert (over["throughput"] < 0.95 * over["arrival_rate"]).all()
    assert stable_capacity_rps(frame[frame["fraction"] == 1.0]) == pytest.approx(whole.capacity_rps, rel=1e-5)


def test_configurations_without_kv_room_are_skipped():
    frame, skipped = synthesize(
        catalog.model("llama-3.1-8b"), catalog.gpu("A6000"), [1], [0.2, 0.5],
        load_request_source("fixed:800,1"), FAST, min_kv_gib=2.0,
    )
    assert [(s.tp, s.fraction) for s in skipped] == [(1, 0.2)]
    assert set(frame["fraction"]) == {0.5}


def test_cli_synthesize_writes_and_merges(tmp_path):
    out = tmp_path / "gen.csv"
    runner = CliRunner()
    common = ["profiles", "synthesize", "--model", "e5-base-v2", "--tp", "1", "--fractions", "0.1,1.0",
              "--requests", "fixed:48,0", "--requests-per-point", "60", "--out", str(out)]
    result = runner.invoke(app, [*common, "--gpu", "A6000", "--json"])
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output)
    # 15 grid rows per fraction, and the rows that locate the stability boundary past them
    assert summary["rows"] >= 30 and set(summary["capacity_rps"]) == {"tp1/f0.1", "tp1/f1"}
    again = runner.invoke(app, [*common, "--gpu", "H100", "--merge"])
    assert again.exit_code == 0, again.output
    frame = pd.read_csv(out)
    assert set(frame["gpu_type"]) == {"A6000", "H100"} and (frame["gpu_type"] == "A6000").sum() == summary["rows"]


def test_merging_keeps_the_other_fractions_of_the_same_gpu_type_and_tp(tmp_path):
    """--merge replaces the (gpu_type, tp, fraction) configurations synthesized now and keeps the
    others, the rule of every profile writer (tracing/profiling/replay.py merge_profile_rows)."""
    from scepsy import api

    out = tmp_path / "gen.csv"
    first = api.synthesize_profile("e5-base-v2", "A6000", [1], [0.1, 1.0], "fixed:48,0", settings=FAST, out=out)
    api.synthesize_profile("e5-base-v2", "A6000", [1], [1.0], "fixed:48,0", settings=FAST, merge_into=out, out=out)
    frame = pd.read_csv(out)
    assert set(frame["fraction"]) == {0.1, 1.0}
    assert (frame["fraction"] == 0.1).sum() == (first.frame["fraction"] == 0.1).sum() > 0


def test_cli_synthesize_pools_replications(tmp_path, capsys):
    """`--replications 2` writes the single draw's rates with pooled values and says so; 0 is exit 2."""
    runner = CliRunner()
    common = ["profiles", "synthesize", "--model", "llama-3.2-1b", "--gpu", "A6000", "--fractions", "0.5",
              "--requests", "azure:conv", "--requests-per-point", "60", "--json"]
    one = runner.invoke(app, [*common, "--out", str(tmp_path / "one.csv")])
    two = runner.invoke(app, [*common, "--replications", "2", "--out", str(tmp_path / "two.csv")])
    assert one.exit_code == 0 and two.exit_code == 0, one.output + two.output
    assert (json.loads(one.output)["replications"], json.loads(two.output)["replications"]) == (1, 2)
    single, pooled = pd.read_csv(tmp_path / "one.csv"), pd.read_csv(tmp_path / "two.csv")
    # the grid is the first draw's (the rows that locate the boundary may differ)
    both = single.merge(pooled, on="arrival_rate", suffixes=("_one", "_two"))
    assert len(both) >= len(SynthesisSettings().rate_points)
    assert (both["latency_mean_one"] != both["latency_mean_two"]).all()
    from scepsy.cli import main

    with pytest.raises(SystemExit) as stopped:
        main([*common, "--replications", "0", "--out", str(tmp_path / "bad.csv")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert stopped.value.code == 2 and len(lines) == 1 and "'--replications'" in lines[0]


def test_cli_synthesize_confirms_the_capacity_over_long_windows(tmp_path):
    """`--confirm-window-s` writes a curve whose capacity is a long row that every draw kept up
    at (99% of its arrivals, at least 4,000 calls each), and no stable short row above it."""
    from scepsy.models.profiles.synthesize import CONFIRM_RATIO

    runner = CliRunner()
    out, plain = tmp_path / "confirmed.csv", tmp_path / "plain.csv"
    common = ["profiles", "synthesize", "--model", "llama-3.2-1b", "--gpu", "A6000", "--fractions", "0.5",
              "--requests", "fixed:256,16", "--requests-per-point", "60", "--json"]
    result = runner.invoke(app, [*common, "--confirm-window-s", "20", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, [*common, "--out", str(plain)]).exit_code == 0
    rows = pd.read_csv(out)
    # the long rows are measured at rates the short sweep has not (1.25x above its capacity, or 5% below)
    assert set(rows["arrival_rate"]) - set(pd.read_csv(plain)["arrival_rate"])
    stable = rows[rows["throughput"] >= 0.95 * rows["arrival_rate"]]
    top = stable.loc[stable["arrival_rate"].idxmax()]
    assert top["throughput"] >= CONFIRM_RATIO * top["arrival_rate"]
    assert json.loads(result.output)["capacity_rps"]


def test_cli_synthesize_bad_input_is_one_line_exit_2(tmp_path):
    runner = CliRunner()
    result = runner.invoke(app, ["profiles", "synthesize", "--model", "gpt-5", "--gpu", "A6000", "--out", str(tmp_path / "x.csv")])
    assert result.exit_code == 2
    assert "unknown model" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["profiles", "synthesize", "--model", "llama-3.1-8b", "--gpu", "A6000", "--fractions", "0.1",
                                 "--requests", "fixed:100,10", "--out", str(tmp_path / "x.csv")])
    assert result.exit_code == 2 and "no (tp, fraction) fits" in result.output


def test_traced_requests_are_replayed_with_their_dependencies():
    """A trace with request structure replays sessions: waves of parallel calls and prefix-cache
    dependencies; with little KV the simulated cache misses, where replaying traced hits cannot."""
    from dataclasses import replace
    from pathlib import Path

    from scepsy.models.instance.allocation import Allocation, LlmAllocation
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.simulation.simulator import SimulationSettings, simulate
    from scepsy.models.profiles.request_sources import source_from_calls
    from scepsy.models.profiles.synthesize import synthesize_curve
    from scepsy.models.performance.engine import Engine

    instance = load_instance(Path(__file__).resolve().parent.parent / "instances" / "beam-4xa6000.yaml")
    instance = instance.with_arrival_rates({"beam": 0.5})
    allocation = Allocation(10, tuple(LlmAllocation(m.name, "A6000", 1, 10, 1) for m in instance.llms))
    trace = simulate(instance, allocation, SimulationSettings(duration_s=120, warmup_s=0), record_calls=True)
    calls = [c for c in trace.calls if c["llm"] == "ver"]
    source = source_from_calls(calls, "ver")
    assert source.sessions and max(len(w) for s in source.sessions for w in s.waves) >= 2
    assert any(c.prefix_call is not None for s in source.sessions for w in s.waves for c in w)
    flat = source_from_calls([{k: v for k, v in c.items() if k != "request"} for c in calls], "ver, no structure")
    assert not flat.sessions
    settings = SynthesisSettings(requests_per_point=120, min_sessions=60, rate_points=(0.2, 0.6, 1.0, 1.4))
    tight = Engine(catalog.model("llama-3.1-8b"), catalog.gpu("A6000"), 1, 0.4)  # ~1.8 GiB of KV cache
    replayed = pd.DataFrame(synthesize_curve(tight, source, settings))
    forced = pd.DataFrame(synthesize_curve(tight, flat, settings))
    assert replayed["latency_mean"].iloc[0] > forced["latency_mean"].iloc[0]


def test_tracing_proxy_exports_are_a_request_source(tmp_path):
    """`scepsy traces export` rows (call_id, workflow_id, token counts that may be missing)."""
    from scepsy.tracing.capture.records import CallRecord

    rows = [
        CallRecord("c1", "gen", "/v1/completions", 10.0, 11.0, 200, workflow="beam", workflow_id="r1",
                   prompt_tokens=300, completion_tokens=90, usage_source="usage"),
        CallRecord("c2", "gen", "/v1/completions", 10.0, 11.2, 200, workflow="beam", workflow_id="r1",
                   prompt_tokens=300, completion_tokens=80, usage_source="usage"),
        CallRecord("c3", "ver", "/v1/completions", 11.2, 11.3, 200, workflow="beam", workflow_id="r1",
                   prompt_tokens=500, completion_tokens=1, usage_source="usage"),
        CallRecord("c4", "gen", "/v1/completions", 11.3, 12.0, 200, workflow="beam", workflow_id="r1",
                   prompt_tokens=None, completion_tokens=60, stream=True, usage_source="stream_events"),
        CallRecord("c5", "gen", "/v1/completions", 20.0, 21.0, 200, workflow="beam", workflow_id="r2",
                   prompt_tokens=250, completion_tokens=70, usage_source="usage"),
    ]
    path = tmp_path / "export.jsonl"
    path.write_text("".join(json.dumps(r.to_row()) + "\n" for r in rows))
    source = load_request_source(str(path), llm="gen")
    assert len(source.shapes) == 3 and "1 calls without token counts" in source.name
    assert [[len(w) for w in s.waves] for s in source.sessions] == [[2], [1]]


# -- the capacity is located on the curve, not on the grid (models/profiles/synthesize.py `sweep`) --


def queue_row(capacity_rps: float):
    """A replica of `capacity_rps` (M/M/1 mean latency at 10 ms of service): stable below it."""
    def measure(rate: float) -> dict:
        stable = rate < capacity_rps
        latency = 0.01 / (1 - rate / capacity_rps) if stable else 100.0
        return {"arrival_rate": rate, "throughput": rate if stable else 0.9 * capacity_rps, "latency_mean": latency}
    return measure


@pytest.mark.parametrize("estimate_rps", [25.0, 95.0, 104.0])
def test_the_sweep_brackets_the_stability_boundary_however_far_off_the_saturation_estimate(estimate_rps):
    from scepsy.models.profiles.synthesize import RATE_POINTS, sweep

    settings = SynthesisSettings()
    rows = sweep(queue_row(100.0), estimate_rps, settings)
    stable = max(r["arrival_rate"] for r in rows if r["throughput"] >= 0.95 * r["arrival_rate"])
    unstable = min(r["arrival_rate"] for r in rows if r["throughput"] < 0.95 * r["arrival_rate"])
    assert stable < 100.0 <= unstable
    # a grid step past the grid (1.2 x) is 0.25 x, one within it 0.1 x; four bisections cut it 16-fold
    assert unstable - stable <= 0.25 * 1.25 ** 8 * estimate_rps / 16 and (unstable - stable) / stable < 0.02
    # the grid rows are the ones a sweep without the extra rows writes
    grid = sweep(queue_row(100.0), estimate_rps, SynthesisSettings(max_extensions=0, refine_steps=0, fill_points=()))
    assert [r["arrival_rate"] for r in grid] == [p * estimate_rps for p in RATE_POINTS]
    assert all(row in rows for row in grid)


def test_a_short_sweep_is_extended_until_a_row_is_unstable():
    """A closed loop of session replays with think times under-estimates saturation: the grid up to
    1.2 x of a quarter of the capacity is all stable, so the sweep goes on past it."""
    from scepsy.models.profiles.synthesize import sweep

    rows = sweep(queue_row(100.0), 25.0, SynthesisSettings(refine_steps=0))
    assert max(r["arrival_rate"] for r in rows) >= 100.0
    assert sweep(queue_row(100.0), 25.0, SynthesisSettings(max_extensions=0, refine_steps=0))[-1]["arrival_rate"] == 30.0


def test_the_steep_part_of_the_curve_is_measured_not_drawn_as_a_line():
    """A sweep whose grid ends at 0.3 of the capacity reaches it in 1.25x steps: a straight line
    between the rows around 0.8 of the capacity reads an M/M/1 latency 30% high. The filled rows
    put one within 2.5% of the capacity of each of 0.5..0.95 of it, and leave the grid, the
    extensions and the capacity as they were."""
    from scepsy.models.instance.profile import build_profile
    from scepsy.models.profiles.synthesize import FILL_POINTS, FILL_TOLERANCE, sweep

    def curve(settings):
        rows = sweep(queue_row(100.0), 25.0, settings)
        frame = pd.DataFrame([{**r, **{f"latency_{m}": r["latency_mean"] for m in ("p50", "p90", "p99")},
                               "gpu_type": "A6000", "tp": 1, "fraction": 1.0} for r in rows])
        (c,) = build_profile(frame, "queue").curves[("A6000", 1)]
        return rows, c

    filled_rows, filled = curve(SynthesisSettings())
    bare_rows, bare = curve(SynthesisSettings(fill_points=()))
    assert filled.capacity_rps == bare.capacity_rps and all(row in filled_rows for row in bare_rows)
    capacity = filled.capacity_rps
    for point in FILL_POINTS:
        assert min(abs(r - point * capacity) for r in filled.rates_rps) <= FILL_TOLERANCE * capacity
    rate = 0.8 * capacity
    truth = 0.01 / (1 - rate / 100.0)
    assert abs(float(filled.latency_s(rate)) / truth - 1) < 0.01
    assert float(bare.latency_s(rate)) / truth - 1 > 0.2


def test_the_capacity_is_confirmed_over_long_windows_in_every_draw():
    """A replica that keeps up over a short window up to 100 req/s but holds only up to 90 over a
    long one (its queue grows slowly, or its prefix cache thrashes late): the confirmed capacity
    lies within one 5% step below 90, short rows above it are left out, the long rows that
    collapsed are kept (unstable, as the loader reads them), one that completes 96% (stable by the
    short rows' ratio, not held over the long window) is not written, and the fill rows are placed
    under the confirmed capacity."""
    from scepsy.models.profiles.synthesize import CONFIRM_RATIO, FILL_POINTS, FILL_TOLERANCE, confirm, sweep

    settings = SynthesisSettings(confirm_window_s=200.0)
    rows = sweep(queue_row(100.0), 95.0, settings)
    asked: list[float] = []

    def long_row(rate: float) -> dict:
        asked.append(rate)
        completed = 1.0 if rate <= 90.0 else (0.96 if rate <= 92.0 else 0.5)
        return {"arrival_rate": rate, "throughput": rate * completed, "latency_mean": 1.0}

    confirmed = confirm(rows, long_row, queue_row(100.0), settings)
    held = [r["arrival_rate"] for r in confirmed if r["throughput"] >= CONFIRM_RATIO * r["arrival_rate"]]
    capacity = max(held)
    assert 90.0 * 0.95 <= capacity <= 90.0 and capacity in asked
    stable = [r for r in confirmed if r["throughput"] >= 0.95 * r["arrival_rate"]]
    assert max(r["arrival_rate"] for r in stable) == capacity  # the loader reads the confirmed capacity
    assert not any(90.0 < r["arrival_rate"] <= 92.0 for r in confirmed)  # 96%: neither held nor a collapse mark
    assert any(r["arrival_rate"] > 92.0 and r["throughput"] < 0.5 * r["arrival_rate"] + 1e-9 for r in confirmed)
    for point in FILL_POINTS:
        assert min(abs(r["arrival_rate"] - point * capacity) for r in confirmed) <= FILL_TOLERANCE * capacity
    # where short draws fell behind by chance below what long ones sustain (up to 120), the
    # capacity goes up: 1.25x steps above the short rows' capacity until one fails, then bisections
    asked.clear()
    higher = confirm(rows, lambda rate: (asked.append(rate), {**queue_row(120.0)(rate), "latency_mean": 1.0})[1],
                     queue_row(100.0), settings)
    capacity = max(r["arrival_rate"] for r in higher if r["throughput"] >= 0.95 * r["arrival_rate"])
    assert asked[0] < 100.0 < asked[1] and 120.0 * (1 - 0.25 / 8) <= capacity < 120.0


def test_a_confirmation_draw_that_falls_behind_decides_the_rate():
    """Long draws are measured in turn; the first that completes under 99% is the row (the draws
    after it are not measured), else the pooled row carries the worst draw's throughput."""
    from scepsy.models.performance.engine import Engine
    from scepsy.models.profiles.synthesize import CONFIRM_RATIO, confirmation_row, saturation_rps

    engine = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), 1, 0.3)
    source = load_request_source("fixed:256,32")
    settings = SynthesisSettings(confirm_window_s=20.0, confirm_calls=400, confirm_draws=2)
    capacity = saturation_rps(engine, [RequestShape(256, 32)] * 400)
    light = confirmation_row(engine, source, settings, 0.3 * capacity)
    assert light["throughput"] >= CONFIRM_RATIO * light["arrival_rate"]
    heavy = confirmation_row(engine, source, settings, 2.0 * capacity)
    assert heavy["throughput"] < CONFIRM_RATIO * heavy["arrival_rate"]


def _count_workload_calls(monkeypatch) -> list[int]:
    """The calls per draw (`requests_per_point`) of every draw the synthesis makes from now on."""
    from scepsy.models.profiles import synthesize as synthesis

    asked: list[int] = []
    original = synthesis._workload

    def counting(engine, source, settings, rng):
        asked.append(settings.requests_per_point)
        return original(engine, source, settings, rng)

    monkeypatch.setattr(synthesis, "_workload", counting)
    return asked


def _small_engine_and_source():
    from scepsy.models.performance.engine import Engine

    return Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), 1, 0.3), load_request_source("fixed:256,32")


def test_a_confirmation_window_holds_at_most_confirm_max_calls(monkeypatch):
    """The long window holds confirm_window_s of arrivals, at least confirm_calls and at most
    confirm_max_calls calls (after the warm-up share): an encoder at tens of thousands of
    requests/s is not replayed for millions of calls per draw."""
    from scepsy.models.profiles import synthesize as synthesis

    asked = _count_workload_calls(monkeypatch)
    engine, source = _small_engine_and_source()
    base = SynthesisSettings(confirm_window_s=20.0, confirm_calls=400, confirm_draws=1)
    warm = 1 - base.warmup_fraction
    synthesis.confirmation_row(engine, source, replace(base, confirm_max_calls=1000), 5.0)  # 100 calls: the floor
    synthesis.confirmation_row(engine, source, replace(base, confirm_max_calls=1000), 30.0)  # 600: the window
    synthesis.confirmation_row(engine, source, replace(base, confirm_max_calls=1000), 200.0)  # 4,000: the cap
    assert asked == [math.ceil(400 / warm), math.ceil(600 / warm), math.ceil(1000 / warm)]


def test_the_steep_part_of_a_confirmed_curve_is_measured_again_in_steady_state():
    """A replica whose short rows read its latency low near capacity (a short window starts empty
    and ends before the queue and the prefix cache reach their level): `steady` measures every row
    from steady_from x the capacity up to the capacity again, and leaves the light rows, the
    capacity's own (long) row and the collapse marks above it as they are."""
    from scepsy.models.profiles.synthesize import steady

    settings = SynthesisSettings(confirm_window_s=200.0)
    truth = queue_row(100.0)

    def short(rate: float) -> dict:  # half the queueing delay a long window measures
        row = truth(rate)
        return {**row, "latency_mean": 0.01 + (row["latency_mean"] - 0.01) / 2} if rate < 100.0 else row

    rates = [10.0, 40.0, 48.0, 50.0, 70.0, 90.0, 95.0, 97.0, 100.0, 120.0]
    rows = [short(r) for r in rates[:-2]] + [truth(97.5), truth(120.0)]  # 97.5: the confirmed capacity
    asked: list[float] = []

    def steady_row(rate: float, row: dict) -> dict:
        assert row["arrival_rate"] == rate
        asked.append(rate)
        return truth(rate)

    measured = steady(rows, steady_row, settings)
    assert asked == [50.0, 70.0, 90.0, 95.0, 97.0]  # from 0.5 x 97.5 up to, not including, 97.5
    for row in measured:
        rate = row["arrival_rate"]
        assert row == (truth(rate) if rate >= 48.75 else short(rate))
    assert steady([truth(120.0)], steady_row, settings) == [truth(120.0)]  # no stable row: as it is


def test_a_curve_whose_steady_state_row_collapses_ends_there():
    """A replica confirmed at 97.5 req/s whose steady-state row at 90 does not keep up (a
    metastable collapse the confirmation draws did not meet): its capacity is the largest stable
    rate below 90, the stable rows above it are left out, the collapsed rows stay as the end."""
    from scepsy.models.profiles.synthesize import end_at_collapse, steady

    settings = SynthesisSettings(confirm_window_s=200.0)
    truth = queue_row(100.0)

    def steady_row(rate: float, row: dict) -> dict:
        return {**truth(rate), "throughput": 0.7 * rate} if rate == 90.0 else truth(rate)

    rows = [truth(r) for r in (10.0, 50.0, 70.0, 90.0, 95.0, 97.5)] + [{**truth(120.0)}]
    ended = steady(rows, steady_row, settings)
    stable = [r["arrival_rate"] for r in ended if r["throughput"] >= 0.95 * r["arrival_rate"]]
    assert max(stable) == 70.0
    assert [r["arrival_rate"] for r in ended] == [10.0, 50.0, 70.0, 90.0, 120.0]
    assert end_at_collapse(ended, 0.5 * 97.5) == ended  # once ended, as it is
    assert end_at_collapse([truth(r) for r in (10.0, 50.0)], 25.0) == [truth(r) for r in (10.0, 50.0)]


def test_a_steady_state_window_holds_fifty_times_the_calls_in_flight(monkeypatch):
    """The steady-state row's window holds steady_in_flight x the calls in flight of the short
    row (rate x its mean latency), at least confirm_calls and at most confirm_max_calls; its
    draws are the confirm_draws of their own seeds, pooled."""
    from scepsy.models.profiles import synthesize as synthesis

    asked = _count_workload_calls(monkeypatch)
    engine, source = _small_engine_and_source()
    settings = SynthesisSettings(confirm_window_s=20.0, confirm_calls=400, confirm_max_calls=2000, confirm_draws=2)
    assert settings.steady_in_flight == 50.0
    warm = 1 - settings.warmup_fraction
    synthesis.steady_state_row(engine, source, settings, 5.0, {"latency_mean": 0.2})  # 50 calls: the floor
    synthesis.steady_state_row(engine, source, settings, 10.0, {"latency_mean": 1.6})  # 800: the window
    row = synthesis.steady_state_row(engine, source, settings, 10.0, {"latency_mean": 10.0})  # 5,000: the cap
    assert asked == [math.ceil(n / warm) for n in (400, 400, 800, 800, 2000, 2000)]
    assert row["arrival_rate"] == 10.0 and row["throughput"] >= 0.99 * 10.0


def test_replications_pool_independent_draws_at_every_rate():
    """One replication is the single-draw sweep, row for row; three pool the first draw's rows
    with two other draws of requests and gaps at the same rates (their mean, as written)."""
    import random

    from scepsy.models.performance.engine import Engine
    from scepsy.models.profiles.synthesize import _workload, pooled_row, synthesize_curve

    engine = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), 1, 0.3)
    source = load_request_source("azure:conv")
    settings = SynthesisSettings(requests_per_point=60, rate_points=(0.2, 0.6, 1.0), max_extensions=0, refine_steps=0,
                                 fill_points=())
    one = synthesize_curve(engine, source, settings)
    three = synthesize_curve(engine, source, SynthesisSettings(**{**settings.__dict__, "replications": 3}))
    assert [r["arrival_rate"] for r in three] == [r["arrival_rate"] for r in one]
    assert all(a["latency_mean"] != b["latency_mean"] for a, b in zip(one, three))
    # every pooled row is the single-draw row with those of the draws seeded "0:1" and "0:2" (measured
    # here at the rate as written, 6 significant digits)
    others = [_workload(engine, source, settings, random.Random(f"0:{index}"))[0] for index in (1, 2)]
    for single, pooled in zip(one, three):
        expected = pooled_row([single] + [measure(single["arrival_rate"]) for measure in others])
        assert pooled == pytest.approx(expected, rel=1e-5)
    rows = [{"arrival_rate": 2.0, "throughput": t, "latency_mean": m} for t, m in ((2.0, 1.0), (2.0, 2.0), (1.4, 6.0))]
    assert pooled_row(rows) == {"arrival_rate": 2.0, "throughput": 1.8, "latency_mean": 3.0}


def test_prefill_only_calls_get_enough_requests_per_point_for_their_lumps():
    """One chunked-prefill iteration finishes 2048 / 32 = 64 e5-base-v2 queries at once: 400 of them
    per point left stability to where the last lump fell; 100 iterations' worth are replayed."""
    from scepsy.models.performance.engine import Engine
    from scepsy.models.profiles.synthesize import requests_per_point

    encoder = Engine(catalog.model("e5-base-v2"), catalog.gpu("A6000"), 1, 1.0)
    decoder = Engine(catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), 1, 1.0)
    queries, chats = load_request_source("fixed:32,0"), load_request_source("fixed:400,60")
    assert requests_per_point(queries, encoder, SynthesisSettings()) == 100 * 64
    assert requests_per_point(chats, decoder, SynthesisSettings()) == 400
    assert requests_per_point(load_request_source("fixed:4000,0"), encoder, SynthesisSettings()) == 400
    assert requests_per_point(queries, encoder, SynthesisSettings(requests_per_point=80)) == 80


def test_synthesized_capacity_lies_on_the_stability_boundary():
    """A real sweep (engine model): the largest stable rate and the slowest unstable one above it
    are within 1% of each other, wherever the saturation estimate put the grid."""
    frame, _ = synthesize(
        catalog.model("llama-3.2-1b"), catalog.gpu("A6000"), [1], [0.3, 1.0],
        load_request_source("fixed:400,60"), SynthesisSettings(requests_per_point=80), gpu_type="A6000",
    )
    for _, rows in frame.groupby("fraction"):
        stable = rows["throughput"] >= 0.95 * rows["arrival_rate"]
        capacity = rows.loc[stable, "arrival_rate"].max()
        above = rows.loc[~stable & (rows["arrival_rate"] > capacity), "arrival_rate"]
        assert len(above) and above.min() / capacity - 1 < 0.01
