"""Generate the shipped instances' profiles by simulation: trace the workflows, then synthesize.

    python instances/generate_profiles.py            # rewrites instances/profiles/*.csv
    python instances/generate_profiles.py --jobs 2   # the same files, on two processes
    python instances/generate_profiles.py --stats    # only print the traced statistics (n, p, f, latency_ratios)
    python instances/generate_profiles.py --only ensemble   # only the judge ensemble's profiles
    python instances/generate_profiles.py --out DIR  # write the CSVs to DIR (tests/shipped.py --check)
    python instances/generate_profiles.py --jobs 2 --resume build/profile-parts   # a run that can stop and go on

A whole run takes hours on two cores (the generator's and the verifier's curves replay ten draws
of at least 300 traced requests at every rate). With `--resume DIR` every finished (profile, GPU
type, TP degree, fraction) curve is kept in DIR as it finishes (a fraction that does not fit as an
empty `.none` marker) and a later run with the same DIR measures only the rest; the CSVs are the
same bytes either way. Empty DIR after changing the engine model, the
synthesis or this file: a kept part is not measured again.

Deterministic (fixed seeds; the output does not depend on --jobs). Documented in
instances/README.md. The pipeline is the paper's, run on the simulator instead of a GPU cluster:

1. trace: each workflow program (the `program:` of instances/beam-4xa6000.yaml and
   instances/rag-4xa6000.yaml) runs alone at light load (TRACE_RATE_RPS) on one replica per LLM,
   a whole RTX A6000 each, for TRACE_REQUESTS requests (models/simulation/simulator.py, seed 0); every LLM
   call is recorded with its prompt, completion and prefix-cache hit tokens, and the measured
   n and p per LLM are printed (the stages of the shipped instances carry these numbers);
2. profile: for every LLM, its traced calls are replayed on one replica as the paper's profiler
   does: traced workflow requests start as a Poisson process and replay their calls of that LLM
   in order, with their prefix-cache dependencies (models/profiles/synthesize.py: saturation throughput,
   then 15 call rates from 5% to 120% of it, about 400 calls each (6,400 for e5-base-v2's short
   queries), and rates past them until the stability boundary is bracketed and bisected, so that
   the capacity is the curve's, not the grid's, confirmed over long windows in every draw
   (CONFIRM_WINDOW_S), then rows where 50-95% of that capacity still lacks one, and every row
   from 50% of the capacity up to it measured again in steady state, over windows of 50 times
   its calls in flight; the verifier's and the generator's other rows pool ten draws,
   REPLICATIONS) for every GPU type, TP degree
   and fraction below, on the engine model of models/performance/engine.py with the numbers of
   models/catalog/catalog.py.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import replace
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent

TRACE_RATE_RPS = 0.5
TRACE_REQUESTS = 400
TRACE_SEED = 0
FRACTIONS = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# profile file -> (workflow instance, llm in it, catalog model, {gpu_type: tp degrees})
DECODER_TPS = {"A6000": (1, 2), "H100": (1, 2, 4, 8)}
ENCODER_TPS = {"A6000": (1,), "H100": (1,)}
PROFILES = {
    "llama-3.2-1b": ("beam-4xa6000.yaml", "gen", "llama-3.2-1b", DECODER_TPS),
    "llama-3.1-8b-prm": ("beam-4xa6000.yaml", "ver", "llama-3.1-8b", DECODER_TPS),
    "llama-3-8b": ("rag-4xa6000.yaml", "rag-gen", "llama-3-8b", DECODER_TPS),
    "e5-base-v2": ("rag-4xa6000.yaml", "embed", "e5-base-v2", ENCODER_TPS),
    "bge-reranker-base": ("rag-4xa6000.yaml", "rerank", "bge-reranker-base", ENCODER_TPS),
}
# the judge ensemble (a fan-out across LLMs): A6000 and tp 1 only, as its instance
ENSEMBLE_TPS = {"A6000": (1,)}
PROFILES.update({
    "ensemble-llama-3.2-1b": ("ensemble-4xa6000.yaml", "judge-small", "llama-3.2-1b", ENSEMBLE_TPS),
    "ensemble-mistral-7b": ("ensemble-4xa6000.yaml", "judge-mistral", "mistral-7b", ENSEMBLE_TPS),
    "ensemble-qwen2.5-7b": ("ensemble-4xa6000.yaml", "judge-qwen", "qwen2.5-7b", ENSEMBLE_TPS),
    "ensemble-llama-3.1-8b": ("ensemble-4xa6000.yaml", "aggregator", "llama-3.1-8b", ENSEMBLE_TPS),
})
GPU_CATALOG = {"A6000": "A6000", "H100": "H100-SXM"}
# independent draws pooled at every rate (SynthesisSettings.replications; 1 where not named): a
# beam-search request replays 3 to 30 verifier calls that share prefixes, so one draw of 300
# requests moves the verifier's latency at 80% of its capacity by 16-68% between seeds; ten draws
# bring 7 of the 13 curves that moved most under 10% (the generator on one A6000 at f = 0.2:
# 6.5% -> 0.8%, whose seed-0 capacity was the lowest of three; docs/evidence.md, section 4)
REPLICATIONS = {"llama-3.1-8b-prm": 10, "llama-3.2-1b": 10}
# every curve's capacity is confirmed over long windows in every draw (SynthesisSettings
# .confirm_window_s): with short rows alone, beam-4xa6000's max_throughput plan completed 66.6% of
# the load it claimed in the workflow simulator; with its verifier and generator confirmed so
# (A6000 TP 1), 99.7% (docs/evidence.md, section 9)
CONFIRM_WINDOW_S = 200.0


def trace(instance_file: str):
    """Simulate the instance's workflow alone, one whole-A6000 replica per LLM; return the result."""
    from scepsy.models.instance.allocation import Allocation, LlmAllocation
    from scepsy.models.instance.instance import load_instance
    from scepsy.models.simulation.simulator import SimulationSettings, simulate

    instance = load_instance(HERE / instance_file)
    instance = instance.with_arrival_rates({w.name: TRACE_RATE_RPS for w in instance.workflows})
    f = instance.cluster.fractions_per_gpu
    allocation = Allocation(f, tuple(LlmAllocation(m.name, "A6000", 1, f, 1) for m in instance.llms))
    duration = TRACE_REQUESTS / TRACE_RATE_RPS
    settings = SimulationSettings(duration_s=duration, warmup_s=0.0, seed=TRACE_SEED)
    return simulate(instance, allocation, settings, record_calls=True)


def _job(args):
    name, gpu_type, tp, fraction, calls, model_name, min_kv_gib = args
    return name, profile_rows(name, gpu_type, tp, calls, model_name, min_kv_gib, fractions=(fraction,))


def profile_rows(name: str, gpu_type: str, tp: int, calls, model_name: str, min_kv_gib: float,
                 fractions=FRACTIONS, seed: int = 0, **settings) -> pd.DataFrame:
    """The rows of one shipped profile's (gpu_type, tp) at `fractions` (another `seed`, or other
    SynthesisSettings fields: the same curves measured again, as bench/fraction_accuracy.py does to
    tell the measurements' own noise)."""
    from scepsy.models.catalog import catalog
    from scepsy.models.profiles.request_sources import source_from_calls
    from scepsy.models.profiles.synthesize import SynthesisSettings, synthesize

    source = source_from_calls(calls, f"traced calls of {name}")
    settings = {"replications": REPLICATIONS.get(name, 1), "confirm_window_s": CONFIRM_WINDOW_S, **settings}
    frame, _ = synthesize(
        catalog.model(model_name), catalog.gpu(GPU_CATALOG[gpu_type]), [tp], fractions, source,
        SynthesisSettings(seed=seed, **settings), gpu_type=gpu_type, min_kv_gib=min_kv_gib,
    )
    return frame


def _part_name(job) -> str:
    name, gpu_type, tp, fraction = job[:4]
    return f"{name}.{gpu_type}.tp{tp}.f{fraction:g}.csv"


def _read_part(path: Path) -> pd.DataFrame:
    """A kept part: its rows, or none where the marker says the fraction does not fit."""
    from scepsy.models.instance.profile import read_profile_frame

    return pd.DataFrame() if _none_marker(path).exists() else read_profile_frame(path)


def _none_marker(path: Path) -> Path:
    return path.with_name(path.name + ".none")


def _measure(jobs: list, workers: int, keep: Path | None, run=None) -> dict[str, pd.DataFrame]:
    """Every job's rows by its part name (no rows where its fraction does not fit): read from
    `keep` where a run kept them, else measured (on `workers` processes) and, with `keep`, written
    there as each finishes. `run(job)` measures one job, returning (name, rows) (default: `_job`)."""
    run = run or _job
    from scepsy.models.instance.profile import write_profile

    parts: dict[str, pd.DataFrame] = {}
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
        for job in jobs:
            path = keep / _part_name(job)
            if path.exists() or _none_marker(path).exists():
                parts[_part_name(job)] = _read_part(path)
    todo = [job for job in jobs if _part_name(job) not in parts]
    print(f"{len(jobs) - len(todo)} of {len(jobs)} (profile, GPU type, TP, fraction) parts kept, {len(todo)} to measure",
          flush=True)

    def finished(job, frame: pd.DataFrame) -> None:
        if keep is not None:
            path = keep / _part_name(job)
            if frame.empty:
                _none_marker(path).write_text("")
            else:
                write_profile(frame, path)
            frame = _read_part(path)  # the values as kept, for the same bytes on resume
        parts[_part_name(job)] = frame
        print(f"measured {_part_name(job)} ({len(parts)} of {len(jobs)})", flush=True)

    if workers > 1:
        with ProcessPoolExecutor(workers) as pool:
            futures = {pool.submit(run, job): job for job in todo}
            for future in as_completed(futures):
                finished(futures[future], future.result()[1])
    else:
        for job in todo:
            finished(job, run(job)[1])
    return parts


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--stats", action="store_true", help="only trace and print n and p")
    parser.add_argument("--only", default=None, help="only the profiles whose name starts with this")
    parser.add_argument("--out", type=Path, default=HERE / "profiles", help="folder of the profile CSVs")
    parser.add_argument("--resume", type=Path, default=None,
                        help="keep each finished (profile, GPU type, TP, fraction) curve here; skip those already kept")
    options = parser.parse_args()
    if options.only:
        for name in [n for n in PROFILES if not n.startswith(options.only)]:
            del PROFILES[name]

    from scepsy.models.instance.instance import load_instance
    from scepsy.models.instance.profile import write_profile

    traces = {}
    for instance_file in sorted({spec[0] for spec in PROFILES.values()}):
        result = trace(instance_file)
        traces[instance_file] = result
        for workflow in result.workflows:
            # the workflow's latency_ratios (what `scepsy aggregate` reports for a trace): its request
            # latency percentiles over their mean, at light load
            ratios = {q: getattr(workflow, f"latency_{q}_s") / workflow.latency_mean_s for q in ("p50", "p90", "p99")}
            print(f"{instance_file} {workflow.name} latency_ratios: "
                  + "{" + ", ".join(f"{q}: {value:.3f}" for q, value in ratios.items()) + "}")
            for stage in workflow.stages:
                print(f"{instance_file} {workflow.name} {stage.llm}: n = {stage.invocations:.2f}, "
                      f"p = {stage.parallelism:.2f}, f = {stage.critical_path:.3f}, "
                      f"mean call latency {stage.mean_call_latency_s:.4f} s")
    if options.stats:
        return
    jobs = []
    for name, (instance_file, llm, model_name, tps) in PROFILES.items():
        calls = [c for c in traces[instance_file].calls if c["llm"] == llm]
        min_kv = load_instance(HERE / instance_file).llm(llm).min_kv_gib
        for gpu_type, degrees in tps.items():
            for tp in degrees:
                jobs += [(name, gpu_type, tp, fraction, calls, model_name, min_kv) for fraction in FRACTIONS]
    parts = _measure(jobs, options.jobs, options.resume)
    frames: dict[str, list[pd.DataFrame]] = {name: [] for name in PROFILES}
    for job in jobs:  # in the jobs' order, whatever order they finished in
        frames[job[0]].append(parts[_part_name(job)])
    for name, parts in frames.items():
        options.out.mkdir(parents=True, exist_ok=True)
        path = options.out / f"{name}.csv"
        frame = pd.concat([part for part in parts if not part.empty], ignore_index=True)
        write_profile(frame, path)
        print(f"wrote {path} ({len(frame)} rows)")


if __name__ == "__main__":
    sys.exit(main())
