"""A synthetic placed plan on a large cluster, built without a solver (for benchmarks and tests).

`write_synthetic(directory, nodes)` writes `instance.yaml` (nodes of 8 NVLink-connected H100 with
GPU UUIDs; the five LLMs and two workflows of instances/combined-8xh100.yaml, whose profiles it
references) and `plan.json`, a placed plan (with the Aggregate LLM Pipeline's prediction, as `scepsy plan` writes it) that repeats combined-8xh100's node layout on every node:
rag-gen (tp 4, 0.9) on GPUs 0-3 beside embed (0.1) on GPU 0 and rerank (0.1) on GPUs 1, 2, 3, and
gen (tp 4, 0.6) with ver (tp 4, 0.4) on GPUs 4-7. 128 nodes are 1024 GPUs and 896 engine replicas.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from scepsy import api
from scepsy.models.plan.document import prediction_sections

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "instances" / "profiles"
GPUS_PER_NODE = 8
F = 10

LLMS = [
    {"name": "gen", "model": "meta-llama/Llama-3.2-1B-Instruct", "weights_gib": 2.31, "min_kv_gib": 1.0, "profile": "llama-3.2-1b.csv"},
    {"name": "ver", "model": "RLHFlow/Llama3.1-8B-PRM-Deepseek-Data", "weights_gib": 14.96, "min_kv_gib": 2.0, "profile": "llama-3.1-8b-prm.csv"},
    {"name": "embed", "model": "intfloat/e5-base-v2", "weights_gib": 0.21, "min_kv_gib": 0.25, "tp_degrees": [1], "profile": "e5-base-v2.csv"},
    {"name": "rerank", "model": "BAAI/bge-reranker-base", "weights_gib": 0.52, "min_kv_gib": 0.5, "tp_degrees": [1], "profile": "bge-reranker-base.csv"},
    {"name": "rag-gen", "model": "meta-llama/Meta-Llama-3-8B-Instruct", "weights_gib": 14.96, "min_kv_gib": 2.0, "profile": "llama-3-8b.csv"},
]
# per node: (llm, fraction, gpus of one replica)
NODE_LAYOUT = [
    ("embed", 0.1, (0,)),
    ("gen", 0.6, (4, 5, 6, 7)),
    ("rag-gen", 0.9, (0, 1, 2, 3)),
    ("rerank", 0.1, (1,)),
    ("rerank", 0.1, (2,)),
    ("rerank", 0.1, (3,)),
    ("ver", 0.4, (4, 5, 6, 7)),
]
WORKFLOWS = [
    {"name": "beam", "arrival_rate": 20.0, "stages": [{"llm": "gen", "invocations": 9.0, "parallelism": 3.0}, {"llm": "ver", "invocations": 6.0, "parallelism": 2.0}]},
    {
        "name": "rag",
        "arrival_rate": 40.0,
        "stages": [
            {"llm": "embed", "invocations": 1.0, "parallelism": 1.0},
            {"llm": "rerank", "invocations": 1.0, "parallelism": 1.0},
            {"llm": "rag-gen", "invocations": 1.0, "parallelism": 1.0},
        ],
    },
]


def gpu_uuid(node: int, gpu: int) -> str:
    return f"GPU-{node:08x}-0000-4000-8000-{gpu:012x}"


def instance_dict(nodes: int) -> dict:
    node_specs = [
        {
            "name": f"h100-{n:04d}",
            "gpu_type": "H100",
            "gpus": GPUS_PER_NODE,
            "nvlink_domains": [list(range(GPUS_PER_NODE))],
            "gpu_uuids": [gpu_uuid(n, g) for g in range(GPUS_PER_NODE)],
        }
        for n in range(nodes)
    ]
    llms = [{**m, "profile": str(PROFILES / m["profile"])} for m in LLMS]
    return {
        "cluster": {"fractions_per_gpu": F, "gpu_types": {"H100": {"memory_gib": 80}}, "nodes": node_specs},
        "llms": llms,
        "workflows": WORKFLOWS,
        "max_utilization": 0.9,
    }


def plan_dict(nodes: int, instance_path: str) -> dict:
    placement, counts = [], {}
    for n in range(nodes):
        for llm, fraction, gpus in NODE_LAYOUT:
            replica = counts.get(llm, 0)
            counts[llm] = replica + 1
            shards = [{"gpu": g, "fraction": fraction} for g in gpus]
            placement.append({"llm": llm, "replica": replica, "node": f"h100-{n:04d}", "shards": shards})
    placement.sort(key=lambda p: (p["llm"], p["replica"]))
    layout = {llm: (fraction, len(gpus)) for llm, fraction, gpus in NODE_LAYOUT}
    llms = [
        {"name": m["name"], "model": m["model"], "gpu_type": "H100", "tp": layout[m["name"]][1], "fraction": layout[m["name"]][0], "replicas": counts[m["name"]]}
        for m in LLMS
    ]
    return {"instance": instance_path, "fractions_per_gpu": F, "llms": llms, "placement": placement}


def write_synthetic(directory: Path, nodes: int) -> Path:
    """Write instance.yaml and plan.json into `directory`; return the plan's path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "instance.yaml").write_text(yaml.safe_dump(instance_dict(nodes), sort_keys=False))
    plan = directory / "plan.json"
    document = plan_dict(nodes, "instance.yaml")
    plan.write_text(json.dumps(document, indent=1))
    # the workflows' and LLMs' prediction, as `scepsy plan` writes it beside the allocation
    prediction = api.predict(directory / "instance.yaml", plan)
    plan.write_text(json.dumps({**document, **prediction_sections(prediction)}, indent=1))
    return plan
