"""Every case of the hostile-input review answered as the README promises: exit 2 with one plain line
naming the file, the field and the fix (or 3), never 0 for wrong input, never 1, never a hang."""

from __future__ import annotations

import json
import os
import stat

import pytest
import yaml

from hostile import assert_promise, run_cli, workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return workspace(tmp_path_factory.mktemp("ws"))


def _instance(ws, edit, name="edited.yaml"):
    """A copy of the beam instance (next to the shipped profiles) with `edit(raw_dict)` applied."""
    raw = yaml.safe_load((ws / "instances" / "beam-4xa6000.yaml").read_text())
    edit(raw)
    path = ws / "instances" / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False, allow_unicode=True))
    return path


def _expect(argv, code, *fragments):
    result = run_cli(argv)
    assert_promise(result, argv)
    assert result.code == code, (argv, result.err)
    for fragment in fragments:
        assert fragment in result.err, (fragment, result.err)
    return result


BEAM = "instances/beam-4xa6000.yaml"


def test_export_onto_its_own_input_is_refused_and_the_store_kept(ws, tmp_path):
    from scepsy.tracing.capture.records import CallRecord
    from scepsy.tracing.capture.store import read_store, write_store
    from hostile import trace_rows

    store = tmp_path / "x.db"
    write_store(store, [CallRecord.from_row(r) for r in trace_rows()])
    before = store.read_bytes()
    _expect(["traces", "export", store, "--out", store], 2, "--out", "is also an input")
    _expect(["traces", "export", store, "--out", tmp_path / "." / "x.db"], 2, "is also an input")
    assert store.read_bytes() == before and len(list(read_store(store))) == 8


@pytest.mark.parametrize("edit, fragment", [
    (lambda r: r["workflows"][0].update(arrival_rate=float("inf")), "arrival_rate"),
    (lambda r: r["workflows"][0].update(arrival_rate=1e308), "arrival_rate"),
    (lambda r: r["workflows"][0]["stages"][0].update(invocations=1e308), "invocations"),
    (lambda r: r["workflows"][0]["stages"][0].update(parallelism=float("inf")), "parallelism"),
    (lambda r: r["cluster"]["gpu_types"]["A6000"].update(memory_gib=float("inf")), "memory_gib"),
    (lambda r: r["cluster"].update(fractions_per_gpu=True), "fractions_per_gpu"),
    (lambda r: r["cluster"]["nodes"][0].update(name="Node A_6000"), "not a Kubernetes node name"),
    (lambda r: r["cluster"]["nodes"][0].update(count=None, gpu_uuids=["GPU-1", "GPU-1", "GPU-2", "GPU-3"]), "listed twice"),
    (lambda r: r["workflows"][0].update(program={"kind": "rag", "embedder": "gen", "generator": "ver", "passages": 3,
                                                 "context_passages": 5}), "context_passages"),
    (lambda r: r["cluster"]["nodes"][0].update(count=1000, gpus=1024), "GPUs, more than"),
    (lambda r: r["llms"][0].update(profile="x" * 5000), "profile"),  # a name too long for the file system
])
def test_bad_instance_values_exit_2_naming_the_field(ws, edit, fragment):
    path = _instance(ws, edit)
    _expect(["plan", path, "--time-limit-s", "5"], 2, str(path), fragment, "fix:")


def test_duplicate_keys_and_deep_yaml_exit_2(ws):
    text = (ws / BEAM).read_text()
    duplicated = ws / "instances" / "duplicate.yaml"
    duplicated.write_text(text.replace("objective: min_latency", "objective: min_latency\nobjective: min_gpus"))
    _expect(["plan", duplicated], 2, "duplicate key 'objective'")
    deep = ws / "instances" / "deep.yaml"
    deep.write_text("[" * 5000 + "]" * 5000)
    _expect(["plan", deep], 2, "deep.yaml")


@pytest.mark.parametrize("argv, fragment", [
    (["simulate", BEAM, "--plan", "alloc.yaml", "--rate", "nan"], "--rate"),
    (["simulate", BEAM, "--plan", "alloc.yaml", "--rates", "nan"], "--rates"),
    (["simulate", BEAM, "--plan", "alloc.yaml", "--rates", "1e308"], "--rates"),
    (["sweep", BEAM, "--load-factors", "nan"], "--load-factors"),
    (["profiles", "synthesize", "--model", "llama-3.2-1b", "--gpu", "L4", "--fractions", "nan", "--out", "p.csv"], "--fractions"),
    (["profiles", "synthesize", "--model", "llama-3.2-1b", "--gpu", "L4", "--tp", "1.5", "--out", "p.csv"], "--tp"),
    (["plan", BEAM, "--workers", "100000"], "--workers"),
    (["whatif", BEAM, "--rates", "1:1e9:1e-9", "--clusters", "4"], "--rates"),
    (["whatif", BEAM, "--rates", "3", "--clusters", "100000000000"], "--clusters"),
])
def test_non_finite_options_exit_2(ws, monkeypatch, argv, fragment):
    monkeypatch.chdir(ws)
    result = run_cli(argv)
    assert_promise(result, argv)
    assert result.code == 2 and fragment in result.err, result.err


def test_brute_force_over_its_limit_is_input_error(ws, monkeypatch):
    monkeypatch.chdir(ws)
    monkeypatch.setattr("scepsy.planner.allocation.bruteforce.MAX_COMBINATIONS", 10)
    _expect(["plan", BEAM, "--backend", "bruteforce"], 2, "--backend", "brute-force limit")


@pytest.mark.parametrize("command", [
    ["whatif", BEAM, "--rates", "3", "--clusters", "4", "--out", "{dir}"],
    ["sweep", BEAM, "--load-factors", "0.5", "--duration-s", "20", "--baselines", "", "--out-csv", "{dir}", "--out-png", "s.png"],
    ["aggregate", "traces.jsonl", "--out", "{dir}"],
    ["traces", "export", "traces.jsonl", "--out", "{dir}"],
    ["profiles", "synthesize", "--model", "llama-3.2-1b", "--gpu", "L4", "--requests", "fixed:64,8", "--out", "{dir}"],
    ["profiles", "import", "vllm.json", "--gpu-type", "A6000", "--out", "{dir}"],
    ["plan", BEAM, "--out", "{dir}"],
    ["predict", BEAM, "--allocation", "alloc.yaml", "--out", "{dir}"],
    ["topology", "--replay", "nvml/l4-pcie.json", "--out", "{dir}"],
    ["simulate", BEAM, "--plan", "alloc.yaml", "--duration-s", "20", "--calls-out", "{dir}"],
])
@pytest.mark.parametrize("kind", ["directory", "under_a_file", "read_only_directory"])
def test_directory_or_unwritable_output_paths_exit_2(ws, monkeypatch, tmp_path, command, kind):
    monkeypatch.chdir(ws)
    target = tmp_path / "target"
    if kind == "directory":
        target.mkdir()
    elif kind == "under_a_file":  # unwritable for every user, root included
        (tmp_path / "plain").write_text("")
        target = tmp_path / "plain" / "out.file"
    else:
        locked = tmp_path / "locked"
        locked.mkdir()
        locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
        target = locked / "sub" / "out.file"
        if os.access(locked, os.W_OK):
            pytest.skip("running as a user that can write anywhere (root)")
    argv = [str(target) if a == "{dir}" else a for a in command]
    _expect(argv, 2, str(target))


def test_malformed_replay_and_huge_max_links(ws, tmp_path):
    answers = json.loads((ws / "nvml" / "a6000-nvlink-pairs.json").read_text())
    answers["max_links"] = 10**9
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps(answers))
    _expect(["topology", "--replay", huge], 2, "max_links")
    answers["max_links"] = 12
    answers["gpus"][1]["pci"] = "nowhere"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(answers))
    _expect(["topology", "--replay", broken], 2, "broken.json", "malformed NVML answers")


def test_deploy_given_a_file_and_a_garbage_kubeconfig(ws, tmp_path):
    _expect(["deploy", ws / "alloc.yaml"], 2, "not a directory")
    garbage = tmp_path / "kubeconfig"
    garbage.write_text("- just\n- a list\n")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "kustomization.yaml").write_text("resources: [a.yaml]\n")
    (tmp_path / "m" / "a.yaml").write_text("apiVersion: v1\nkind: Namespace\nmetadata: {name: x}\n")
    _expect(["deploy", tmp_path / "m", "--kubeconfig", garbage], 2, "kubeconfig")


@pytest.mark.parametrize("image", ["vllm/vllm-openai:latest\nrm -rf", "Bad Image", "x" * 300])
def test_manifests_refuse_a_bad_image(ws, tmp_path, image):
    _expect(["manifests", ws / "plans" / "beam-4xa6000-optimal.json", "--instance", ws / BEAM, "--out", tmp_path / "m",
             "--image", image], 2, "--image")


@pytest.mark.parametrize("record_edit, fragment", [
    (lambda r: r.update(replicas=1.5), "replicas"),
    (lambda r: r.update(tp=True), "tp"),
    (lambda r: r.update(fraction=float("nan")), "fraction"),
    (lambda r: r.update(fraction=1e308), "fraction"),
    (lambda r: r.update(colour="red"), "colour"),
])
def test_allocation_records_are_strict(ws, tmp_path, record_edit, fragment):
    allocation = yaml.safe_load((ws / "alloc.yaml").read_text())
    record_edit(allocation["llms"][0])
    path = tmp_path / "alloc.yaml"
    path.write_text(yaml.safe_dump(allocation))
    _expect(["predict", ws / BEAM, "--allocation", path], 2, fragment)


@pytest.mark.parametrize("content, fragment", [
    ("", "no arrival"),
    ('{"workflow": "beam", "arrival_s": NaN}\n', "arrival_s"),
    ('{"workflow": "beam", "arrival_s": -1}\n', "arrival_s"),
])
def test_arrivals_empty_or_not_times(ws, tmp_path, content, fragment):
    path = tmp_path / "arrivals.jsonl"
    path.write_text(content)
    _expect(["simulate", ws / BEAM, "--plan", ws / "alloc.yaml", "--duration-s", "20", "--arrivals", path], 2, fragment)


def test_current_placement_on_unknown_nodes_or_gpus(ws, tmp_path):
    plan = json.loads((ws / "plans" / "beam-4xa6000-optimal.json").read_text())
    plan["placement"][0]["node"] = "gone-node"
    path = tmp_path / "current.json"
    path.write_text(json.dumps(plan))
    _expect(["plan", ws / BEAM, "--current", path], 2, "gone-node")
    plan["placement"][0]["node"] = "a6000-0"
    plan["placement"][0]["shards"][0]["gpu"] = 9
    path.write_text(json.dumps(plan))
    _expect(["plan", ws / BEAM, "--current", path], 2, "GPUs 0..3")


def _current(ws, tmp_path, edit):
    """The golden beam-4xa6000 plan (gen and ver, TP 2 on whole GPUs 0-1 and 2-3) with `edit(plan)`."""
    plan = json.loads((ws / "plans" / "beam-4xa6000-optimal.json").read_text())
    edit(plan)
    path = tmp_path / "current.json"
    path.write_text(json.dumps(plan))
    return path


@pytest.mark.parametrize("edit, field, fragment", [
    # two replicas filling GPUs 0 and 1 twice over
    (lambda p: p["placement"][1]["shards"][0].update(gpu=0) or p["placement"][1]["shards"][1].update(gpu=1),
     "placement[1].shards", "holds 20 units (2 GPU, placement entries 0, 1) but has 10 free"),
    # a shard count that differs from the replica's TP (gen has tp 2)
    (lambda p: p["placement"][0]["shards"].pop(), "placement[0].shards", "needs 2 distinct GPUs (its tp)"),
    # a shard fraction that differs from its llm's, a node of another gpu type's llm record
    (lambda p: p["placement"][0]["shards"][1].update(fraction=0.5), "placement[0].shards[1].fraction", "expected 10"),
    (lambda p: p["llms"][0].update(gpu_type="H100"), "placement[0].node", "needs H100 but a6000-0 has A6000"),
    # two shards of one replica on one GPU, one replica listed twice
    (lambda p: p["placement"][0]["shards"][1].update(gpu=0), "placement[0].shards", "distinct GPUs"),
    (lambda p: p["placement"].append(p["placement"][0]), "placement[2].replica", "placed twice"),
], ids=["gpus-filled-twice-over", "shards-not-its-tp", "shard-fraction", "gpu-type", "one-gpu-twice", "replica-twice"])
def test_current_placement_that_cannot_run_exits_2_naming_the_entry(ws, tmp_path, edit, field, fragment):
    path = _current(ws, tmp_path, edit)
    _expect(["plan", ws / BEAM, "--current", path], 2, str(path), field, fragment, "fix:")


def test_current_placement_list_alone_that_cannot_run_exits_2(ws, tmp_path):
    """Without `llms` the shards themselves say the shape: two sizes in one replica cannot run."""
    plan = json.loads((ws / "plans" / "beam-4xa6000-optimal.json").read_text())
    plan["placement"][0]["shards"][1]["fraction"] = 0.5
    path = tmp_path / "placement.json"
    path.write_text(json.dumps(plan["placement"]))
    _expect(["plan", ws / BEAM, "--current", path], 2, "placement[0].shards[1].fraction", "expected 10")


def test_current_replicas_of_an_llm_the_instance_no_longer_has_are_ignored_with_one_warning(ws, tmp_path):
    """The operator removed the LLM from the instance: its replicas stop with the new plan, so the
    re-plan ignores them (their GPUs count as free) and says so in one line."""
    from scepsy.models.errors import ScepsyWarning
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.plan.document import read_current

    def rename(plan):
        plan["llms"][1]["name"] = plan["placement"][1]["llm"] = "old-verifier"

    path = _current(ws, tmp_path, rename)
    result = _expect(["plan", ws / BEAM, "--current", path, "--json"], 0)
    warnings = [line for line in result.err.splitlines() if line.strip()]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "old-verifier" in warnings[0], result.err
    assert "ignored" in warnings[0] and "not in the instance" in warnings[0]
    assert json.loads(result.out)["placement_solver"]["objective"]["kept_replicas"] == 1  # gen stays
    with pytest.warns(ScepsyWarning, match="old-verifier"):
        kept = read_current(path, load_instance(ws / BEAM))
    assert [r.llm for r in kept.replicas] == ["gen"]


@pytest.mark.parametrize("edit, fragment", [
    ({"request_throughput": -1.0}, "negative throughput"),
    ({"mean_e2el_ms": -5.0}, "not positive"),
    ({"p50_e2el_ms": 3000.0, "median_e2el_ms": 3000.0}, "increasing order"),
])
def test_profiles_import_refuses_impossible_results(ws, tmp_path, edit, fragment):
    from hostile import VLLM_RESULT

    path = tmp_path / "bad.json"
    path.write_text(json.dumps({**VLLM_RESULT, **edit}))
    _expect(["profiles", "import", path, "--gpu-type", "A6000", "--out", tmp_path / "p.csv"], 2, fragment)


@pytest.mark.parametrize("gpu_type", ["", " ", "A6000 ", "A\n6000"])
def test_profiles_import_refuses_an_empty_or_unreadable_gpu_type(ws, tmp_path, gpu_type):
    """The label is written into every row and read back by name: "" would read back as a missing
    value; exit 2 naming the option, and no profile written."""
    from hostile import VLLM_RESULT

    path = tmp_path / "run.json"
    path.write_text(json.dumps(VLLM_RESULT))
    _expect(["profiles", "import", path, "--gpu-type", gpu_type, "--out", tmp_path / "p.csv"], 2, "--gpu-type",
            "is not a GPU type name", "fix:")
    assert not (tmp_path / "p.csv").exists()
    _expect(["profiles", "import", path, "--gpu-type", "A6000", "--out", tmp_path / "p.csv"], 0)


@pytest.mark.parametrize("call, field", [
    ({"prompt_tokens": -5, "completion_tokens": 10}, "line 2, prompt_tokens"),
    ({"prompt_tokens": 50, "completion_tokens": -1}, "line 2, completion_tokens"),
    ({"prompt_tokens": 50, "completion_tokens": 10, "cached_tokens": -20}, "line 2, cached_tokens"),
    ({"prompt_tokens": 50, "completion_tokens": 10, "sequences": 0}, "line 2, sequences"),
])
def test_synthesize_refuses_negative_token_counts_naming_the_entry(tmp_path, call, field):
    calls = tmp_path / "calls.jsonl"
    calls.write_text(json.dumps({"prompt_tokens": 40, "completion_tokens": 8}) + "\n" + json.dumps(call) + "\n")
    _expect(["profiles", "synthesize", "--model", "llama-3.2-1b", "--gpu", "A6000", "--requests", calls,
             "--out", tmp_path / "p.csv"], 2, str(calls), field, "fix:")
    assert not (tmp_path / "p.csv").exists()


def test_synthesize_refuses_requests_beyond_the_context(tmp_path):
    _expect(["profiles", "synthesize", "--model", "llama-3.2-1b", "--gpu", "L4", "--requests", "fixed:200000,10",
             "--out", tmp_path / "p.csv"], 2, "context")


def test_non_regular_inputs_are_refused_without_blocking(ws, tmp_path):
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    _expect(["plan", fifo], 2, "not a regular file")
    _expect(["plan", "/dev/zero"], 2, "not a regular file")
    _expect(["aggregate", "/dev/zero"], 2, "not a regular file")


def test_input_size_bound(ws, tmp_path, monkeypatch):
    monkeypatch.setenv("SCEPSY_MAX_INPUT_MIB", "0.001")
    _expect(["plan", ws / BEAM], 2, "input size limit", "SCEPSY_MAX_INPUT_MIB")


def test_unreadable_input_is_one_plain_line(ws, tmp_path):
    locked = tmp_path / "locked.yaml"
    locked.write_text((ws / BEAM).read_text())
    locked.chmod(0)
    if os.access(locked, os.R_OK):
        pytest.skip("running as a user that reads anything (root)")
    _expect(["plan", locked], 2, "locked.yaml")


def test_messages_are_printed_as_given(ws):
    result = _expect(["plan", ws / BEAM, "--objective", "bogus:x:[red]"], 2, "bogus:x:[red]")
    assert "\u274c" not in result.err and len(result.err.strip().splitlines()) == 1


def test_long_messages_are_not_wrapped(ws):
    result = _expect(["plan", ws / BEAM, "--objective", "y" * 300], 2, "y" * 300)
    assert len(result.err.strip().splitlines()) == 1


def test_usage_errors_are_one_line_too(ws):
    result = _expect(["plan", ws / BEAM, "--time-limit-s", "soon"], 2, "--time-limit-s")
    assert len(result.err.strip().splitlines()) == 1


def test_time_limit_covers_building_the_options(ws):
    path = _instance(ws, lambda r: r["cluster"]["nodes"][0].update(count=20000), "large.yaml")
    result = _expect(["plan", path, "--time-limit-s", "0.01"], 3, "time limit")
    assert "raise --time-limit-s" in result.err


def test_each_profile_file_is_read_once(ws, monkeypatch):
    import scepsy.models.instance.instance as instance_module

    reads = []
    original = instance_module.load_profile
    monkeypatch.setattr(instance_module, "load_profile", lambda path: reads.append(path) or original(path))

    def many_llms(raw):
        base = raw["llms"][0]
        raw["llms"] = [dict(base, name=f"gen{i}") for i in range(30)] + [raw["llms"][1]]
        raw["workflows"][0]["stages"] = [{"llm": f"gen{i}", "invocations": 1.0, "parallelism": 1.0} for i in range(30)] + [
            raw["workflows"][0]["stages"][1]]
        del raw["workflows"][0]["program"]

    instance_module.load_instance(_instance(ws, many_llms, "many.yaml"))
    assert len(reads) == len(set(reads)) == 2


def test_simulation_length_is_bounded(ws):
    _expect(["simulate", ws / BEAM, "--plan", ws / "alloc.yaml", "--duration-s", "1e9"], 2, "--duration-s", "LLM calls")


def test_aggregate_table_is_linear_in_the_workflow_name(ws, tmp_path):
    """A 100 KB workflow name (an old store, or an OTLP export) is shown shortened, in one line."""
    from hostile import trace_rows

    rows = trace_rows()
    for row in rows:
        row["workflow"] = "w" * 100_000
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = _expect(["aggregate", path], 0)
    assert "w" * 47 + "\u2026" in result.out and "w" * 100 not in result.out


def test_a_program_calling_past_the_bound_stops_with_exit_2(ws, monkeypatch):
    """The estimate from the stages passes, the program calls more: the run stops at the bound."""
    monkeypatch.setattr("scepsy.models.simulation.simulator.MAX_SIMULATED_CALLS", 50)
    monkeypatch.setattr("scepsy.models.simulation.simulator.check_size", lambda *args: None)
    _expect(["simulate", ws / BEAM, "--plan", ws / "alloc.yaml", "--duration-s", "20"], 2, "more than 50 LLM calls")


def test_recording_every_call_is_bounded_by_its_memory(ws, monkeypatch):
    """--calls-out keeps every call until it writes them: a run past MAX_RECORDED_CALLS is refused
    before it starts, and the same run without --calls-out is not."""
    monkeypatch.setattr("scepsy.models.simulation.simulator.MAX_RECORDED_CALLS", 50)
    args = ["simulate", ws / BEAM, "--plan", ws / "alloc.yaml", "--duration-s", "20"]
    _expect([*args, "--calls-out", ws / "calls.jsonl"], 2, "--calls-out", "more than the 50 ")
    assert not (ws / "calls.jsonl").exists()
    _expect([*args, "--json"], 0)


# every command that reads traces, and files that hold none or are not OTLP: one line naming the file, exit 2
TRACE_COMMANDS = {
    "traces export": lambda trace, tmp: ["traces", "export", trace, "--out", tmp / "out.jsonl"],
    "aggregate": lambda trace, tmp: ["aggregate", trace, "--out", tmp / "out.yaml"],
    "profile": lambda trace, tmp: ["profile", "--traces", trace, "--llm", "gen", "--endpoint", "http://127.0.0.1:9",
                                   "--gpu-type", "A6000", "--out", tmp / "out.csv"],
}
NO_TRACES = {  # file name, content, what the line says
    "empty": ("spans.json", b"", "an empty file"),
    "blank": ("spans.json", b"\n  \n", "no call records and no spans"),
    "no spans": ("spans.json", b'{"resourceSpans": []}', "no call records and no spans"),
    "resourceSpans an object": ("spans.json", b'{"resourceSpans": {"scopeSpans": []}}', "resourceSpans: is not a list"),
    "resourceSpans a string": ("otlp", b'{"resourceSpans": "x"}\n', "resourceSpans: is not a list"),
    "scopeSpans a number": ("spans.jsonl", b'{"resourceSpans": [{"scopeSpans": 3}]}', "resourceSpans[0].scopeSpans: is not a list"),
    "spans of strings": ("spans.json", b'{"resourceSpans": [{"scopeSpans": [{"spans": ["a"]}]}]}', "scopeSpans[0].spans: is not a list"),
}


@pytest.mark.parametrize("case", sorted(NO_TRACES))
@pytest.mark.parametrize("command", sorted(TRACE_COMMANDS))
def test_trace_files_without_traces_exit_2_naming_the_file(tmp_path, command, case):
    name, content, fragment = NO_TRACES[case]
    trace = tmp_path / name
    trace.write_bytes(content)
    result = _expect(TRACE_COMMANDS[command](trace, tmp_path), 2, str(trace), fragment)
    assert len(result.err.strip().splitlines()) == 1
    assert not any(path.name.startswith("out.") for path in tmp_path.iterdir())


@pytest.mark.parametrize("command", sorted(TRACE_COMMANDS))
def test_a_proxy_store_without_calls_exits_2_naming_it(tmp_path, command):
    from scepsy.tracing.capture.store import write_store

    store = tmp_path / "empty.db"
    write_store(store, [])
    _expect(TRACE_COMMANDS[command](store, tmp_path), 2, str(store), "no call records and no spans")
