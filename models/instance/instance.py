"""Instance files: the cluster, the LLMs and the workflows to plan for.

`InstanceSpec` is the YAML schema (pydantic, field names fixed: other tools write these files).
`load_instance` validates a file into an `Instance`: frozen, with nodes expanded, NVLink domains
completed, paths resolved and profiles loaded. Every problem is an `InputError` naming the file,
the field and the fix.
"""

from __future__ import annotations

import math
import re
import warnings
from collections import Counter
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from scepsy.models.errors import InputError, ScepsyWarning, check_deadline
from scepsy.models.inputs import kind_of, load_yaml
from scepsy.models.instance.profile import LlmProfile, load_profile
from scepsy.models.instance.workflow import Program, ProgramSpec, program_llms

LatencyMetric = Literal["mean", "p50", "p90", "p99"]
ObjectiveName = Literal["min_latency", "max_throughput", "min_gpus", "min_cost", "min_units"]
Welfare = Literal["egalitarian", "social"]


# Largest values accepted: beyond them lies no real cluster or workload, and arithmetic on them
# overflows (1e308 requests/s times 8 invocations is inf). Strict types: YAML `true` is not a 1.
MAX_RATE = 1e9  # requests/s
MAX_COUNT = 1e6  # invocations, parallelism, weights, GPUs per node, nodes per entry
MAX_GIB = 1e6  # memory and weights
MAX_HARDWARE = 1e9  # TFLOP/s, GB/s, price per hour
MAX_SECONDS = 1e9
MAX_GPUS_PER_NODE = 1024
MAX_CLUSTER_GPUS = 1_000_000
# A node name becomes the value of the kubernetes.io/hostname label in the manifests: a
# Kubernetes node name (RFC 1123 subdomain) of at most 63 characters.
NODE_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$")


class _Spec(BaseModel):
    # numbers must be finite: `.inf` or `.nan` in YAML is never a meaningful statistic or size;
    # strict types: YAML `true` is not a 1, `1.5` is not a whole number
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class GpuTypeSpec(_Spec):
    memory_gib: float = Field(gt=0, le=MAX_GIB, description="HBM per GPU")
    tflops: float | None = Field(default=None, gt=0, le=MAX_HARDWARE, description="dense bf16 TFLOP/s")
    bandwidth_gbps: float | None = Field(default=None, gt=0, le=MAX_HARDWARE, description="HBM bandwidth, GB/s")
    nvlink_gbps: float | None = Field(default=None, gt=0, le=MAX_HARDWARE, description="NVLink bandwidth per GPU, GB/s")
    cost_per_hour: float | None = Field(default=None, ge=0, le=MAX_HARDWARE, description="price of one GPU for one hour")


class NodeSpec(_Spec):
    name: str = Field(min_length=1)
    count: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="expand to name-0 .. name-{count-1}")
    gpu_type: str
    gpus: int = Field(ge=1, le=MAX_GPUS_PER_NODE)
    nvlink_domains: list[list[int]] = Field(default_factory=list)
    gpu_uuids: list[str] | None = None


class ReservedSpec(_Spec):
    node: str
    gpu: int = Field(ge=0)
    fraction: float = Field(gt=0, le=1)


class ClusterSpec(_Spec):
    fractions_per_gpu: int = Field(default=10, ge=1, le=100)
    gpu_types: dict[str, GpuTypeSpec] = Field(min_length=1)
    nodes: list[NodeSpec] = Field(min_length=1)
    reserved: list[ReservedSpec] = Field(default_factory=list)


class LlmSpec(_Spec):
    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    weights_gib: float = Field(gt=0, le=MAX_GIB)
    min_kv_gib: float = Field(default=0.0, ge=0, le=MAX_GIB)
    tp_degrees: list[int] | None = None
    profile: str


class StageSpec(_Spec):
    llm: str
    invocations: float = Field(gt=0, le=MAX_COUNT, description="mean calls of this LLM per workflow request (n)")
    parallelism: float = Field(ge=1, le=MAX_COUNT, description="mean request-level parallelism of those calls (p)")
    critical_path: float = Field(
        default=1.0, ge=0, le=1,
        description="share of the LLM's busy time on the request's critical path (f; 1 for serial stages)",
    )


class WorkflowSpec(_Spec):
    name: str = Field(min_length=1)
    arrival_rate: float = Field(gt=0, le=MAX_RATE, description="workflow requests per second")
    latency_slo_s: float | None = Field(default=None, gt=0, le=MAX_SECONDS)
    weight: float = Field(default=1.0, gt=0, le=MAX_COUNT, description="importance of this workflow when several share a cluster")
    stages: list[StageSpec] = Field(min_length=1)
    # optional: a request's latency percentiles over its mean in the traces (`scepsy aggregate`),
    # for latency_metric p50/p90/p99 (docs/model.md, section 3)
    latency_ratios: dict[Literal["p50", "p90", "p99"], float] | None = None
    # optional: the control flow `scepsy simulate` runs (models/simulation/programs.py); default: the stages
    program: ProgramSpec | None = None


class InstanceSpec(_Spec):
    cluster: ClusterSpec
    llms: list[LlmSpec] = Field(min_length=1)
    workflows: list[WorkflowSpec] = Field(min_length=1)
    objective: ObjectiveName = "min_latency"
    welfare: Welfare = "egalitarian"
    latency_metric: LatencyMetric = "mean"
    max_utilization: float = Field(default=1.0, gt=0, le=1)


# ---------------------------------------------------------------------------------------------
# Runtime vocabulary (frozen): what the planner, the placement and the manifests work with.


@dataclass(frozen=True)
class Node:
    name: str
    gpu_type: str
    gpus: int
    domains: tuple[tuple[int, ...], ...]  # a partition of range(gpus) into NVLink domains
    gpu_uuids: tuple[str, ...] | None = None


@dataclass(frozen=True)
class Domain:
    """One NVLink domain: the GPUs of one node that a tensor-parallel replica may span."""

    node: str
    gpu_type: str
    gpus: tuple[int, ...]

    @property
    def size(self) -> int:
        return len(self.gpus)


@dataclass(frozen=True)
class Cluster:
    fractions_per_gpu: int
    gpu_types: Mapping[str, GpuTypeSpec]
    nodes: tuple[Node, ...]
    reserved_units: Mapping[tuple[str, int], int] = field(default_factory=dict)  # (node, gpu) -> units

    def domains(self) -> list[Domain]:
        return [Domain(n.name, n.gpu_type, d) for n in self.nodes for d in n.domains]

    def node(self, name: str) -> Node:
        return self._nodes_by_name[name]

    @cached_property
    def _nodes_by_name(self) -> dict[str, Node]:
        return {node.name: node for node in self.nodes}

    def free_units(self, node: str, gpu: int) -> int:
        return self.fractions_per_gpu - self.reserved_units.get((node, gpu), 0)

    def gpu_count(self, gpu_type: str | None = None) -> int:
        if gpu_type is None:
            return sum(gpus for gpus, _ in self._by_type.values())
        return self._by_type.get(gpu_type, (0, 0))[0]

    def used_gpu_types(self) -> list[str]:
        return sorted(self._by_type)

    def largest_domain(self, gpu_type: str) -> int:
        return self._by_type.get(gpu_type, (0, 0))[1]

    @cached_property
    def _layouts(self) -> Counter[tuple[str, int, tuple[tuple[int, ...], ...]]]:
        """(gpu type, GPUs, NVLink domains) -> nodes laid out so: the questions below are answered per
        layout, not per GPU, because a cluster may have a million GPUs (and is frozen, so the
        answers are kept)."""
        return Counter((n.gpu_type, n.gpus, n.domains) for n in self.nodes)

    @cached_property
    def _by_type(self) -> dict[str, tuple[int, int]]:
        """gpu type -> (GPUs, GPUs of its largest NVLink domain)."""
        summary: dict[str, tuple[int, int]] = {}
        for (gpu_type, node_gpus, domains), count in self._layouts.items():
            gpus, largest = summary.get(gpu_type, (0, 0))
            summary[gpu_type] = (gpus + count * node_gpus, max([largest] + [len(d) for d in domains]))
        return summary

    @cached_property
    def domain_counts(self) -> Mapping[tuple[str, tuple[int, ...]], int]:
        """(gpu type, free units of each GPU) -> how many NVLink domains are alike so: a cluster of a
        million GPUs has a handful of kinds. Reserved GPUs are counted node by node."""
        counts: Counter[tuple[str, tuple[int, ...]]] = Counter()
        for (gpu_type, _, domains), count in self._layouts.items():
            for domain in domains:
                counts[(gpu_type, (self.fractions_per_gpu,) * len(domain))] += count
        reserved = {node for node, _ in self.reserved_units}
        for node in self.nodes if reserved else ():
            if node.name in reserved:
                for domain in node.domains:
                    counts[(node.gpu_type, (self.fractions_per_gpu,) * len(domain))] -= 1
                    counts[(node.gpu_type, tuple(self.free_units(node.name, g) for g in domain))] += 1
        return +counts  # drops the kinds no domain is left of


@dataclass(frozen=True)
class Stage:
    llm: str
    invocations: float
    parallelism: float
    critical_path: float = 1.0  # f: share of the LLM's busy time on the critical path (models/instance/statistic.py)
    latency_scale: float = 1.0  # c: the LLM's observed call latency over its profile's (the controller's correction)

    @property
    def latency_weight(self) -> float:
        """n / p * f * c: the pipeline's weight of the LLM's profiled call latency in the workflow
        latency (exactly n / p when f = c = 1)."""
        return self.invocations / self.parallelism * self.critical_path * self.latency_scale


@dataclass(frozen=True)
class Workflow:
    name: str
    arrival_rate: float
    stages: tuple[Stage, ...]
    latency_slo_s: float | None = None
    weight: float = 1.0
    program: Program | None = None  # what the simulator runs (None: the stages program)
    # a request's latency percentile over its mean in the traces, per percentile (p50, p90, p99)
    latency_ratios: Mapping[str, float] | None = None

    def stage(self, llm: str) -> Stage | None:
        return next((s for s in self.stages if s.llm == llm), None)


@dataclass(frozen=True)
class Llm:
    name: str
    model: str
    weights_gib: float
    min_kv_gib: float
    tp_degrees: tuple[int, ...]
    profile_path: str
    profile: LlmProfile = field(repr=False, compare=False)

    @property
    def memory_need_gib(self) -> float:
        return self.weights_gib + self.min_kv_gib


@dataclass(frozen=True)
class Instance:
    cluster: Cluster
    llms: tuple[Llm, ...]
    workflows: tuple[Workflow, ...]
    objective: str = "min_latency"
    latency_metric: str = "mean"
    max_utilization: float = 1.0
    source: str | None = None
    welfare: str = "egalitarian"

    def llm(self, name: str) -> Llm:
        for llm in self.llms:
            if llm.name == name:
                return llm
        raise KeyError(name)

    @property
    def call_latency_metric(self) -> str:
        """The profile column the LLM latencies are read from: `latency_metric`, except that a
        percentile every workflow has a latency ratio for is predicted as that ratio times the
        mean (the sum of per-call percentiles misses the spread of the control flow)."""
        if self.latency_metric != "mean" and all(
            w.latency_ratios and self.latency_metric in w.latency_ratios for w in self.workflows
        ):
            return "mean"
        return self.latency_metric

    def latency_factor(self, workflow: Workflow) -> float:
        """What the workflow's pipeline latency is multiplied by: its traced ratio of the
        `latency_metric` percentile to the mean where `call_latency_metric` is the mean, else 1."""
        if self.latency_metric != "mean" and self.call_latency_metric == "mean" and workflow.latency_ratios:
            return workflow.latency_ratios[self.latency_metric]
        return 1.0

    def offered_rate_rps(self, llm: str) -> float:
        """Lambda_m: the LLM-level arrival rate, summed over the workflows that call it."""
        return sum(w.arrival_rate * s.invocations for w in self.workflows for s in w.stages if s.llm == llm)

    def with_objective(self, objective: str, welfare: str | None = None) -> "Instance":
        """The instance with another objective (and welfare); min_cost needs every price."""
        if objective == "min_cost":
            for name in self.cluster.used_gpu_types():
                if self.cluster.gpu_types[name].cost_per_hour is None:
                    raise InputError(
                        self.source, f"cluster.gpu_types.{name}.cost_per_hour", "objective min_cost needs a price per GPU hour",
                        "add cost_per_hour to every gpu type in use, or use objective min_gpus",
                    )
        return replace(self, objective=objective, welfare=welfare or self.welfare)

    def with_arrival_rates(self, rates: Mapping[str, float]) -> "Instance":
        workflows = tuple(replace(w, arrival_rate=rates.get(w.name, w.arrival_rate)) for w in self.workflows)
        return replace(self, workflows=workflows)

    def with_latency_scales(self, scales: Mapping[str, float]) -> "Instance":
        """The instance whose LLMs' call latencies are `scales[llm]` times their profiles' in every
        workflow's latency (the load they see is unchanged): a deployment measured slower than its
        profiles, as the controller observes it."""
        workflows = tuple(
            replace(w, stages=tuple(replace(s, latency_scale=scales.get(s.llm, s.latency_scale)) for s in w.stages))
            for w in self.workflows)
        return replace(self, workflows=workflows)

    def scaled(self, load_factor: float) -> "Instance":
        return self.with_arrival_rates({w.name: w.arrival_rate * load_factor for w in self.workflows})

    def with_latency_slos(self, slos: Mapping[str, float]) -> "Instance":
        """The instance with these workflows' latency_slo_s set (seconds)."""
        workflows = tuple(replace(w, latency_slo_s=slos.get(w.name, w.latency_slo_s)) for w in self.workflows)
        return replace(self, workflows=workflows)

    def with_total_rate(self, total_rps: float) -> "Instance":
        """The workflows' arrival rates scaled so that they sum to `total_rps` (same mix)."""
        current = sum(w.arrival_rate for w in self.workflows)
        return self.scaled(total_rps / current)

    def with_cluster_size(self, gpus: int) -> "Instance":
        """The cluster resized to `gpus` GPUs: whole copies of its node kinds, taken in turn in the
        order the nodes are listed (one kind: gpus / gpus-per-node nodes). Reservations are dropped."""
        kinds: list[Node] = []
        for node in self.cluster.nodes:
            if not any((k.gpu_type, k.gpus, k.domains) == (node.gpu_type, node.gpus, node.domains) for k in kinds):
                kinds.append(node)
        nodes: list[Node] = []
        total, turn = 0, 0
        while total < gpus:
            kind = kinds[turn % len(kinds)]
            index = sum(1 for n in nodes if n.gpu_type == kind.gpu_type)
            nodes.append(Node(f"{kind.gpu_type.lower()}-{index}", kind.gpu_type, kind.gpus, kind.domains))
            total += kind.gpus
            turn += 1
        if total != gpus:
            sizes = ", ".join(str(k.gpus) for k in kinds)
            raise InputError(self.source, "clusters", f"{gpus} GPUs is not a whole number of nodes (node sizes: {sizes})",
                             "use cluster sizes made of whole nodes", argument=True)
        return replace(self, cluster=replace(self.cluster, nodes=tuple(nodes), reserved_units={}))

    def only_workflow(self, name: str) -> "Instance":
        """The instance with one workflow and just the LLMs it calls (its load alone on the cluster)."""
        workflow = next(w for w in self.workflows if w.name == name)
        used = {s.llm for s in workflow.stages}
        return replace(self, workflows=(workflow,), llms=tuple(m for m in self.llms if m.name in used))


# ---------------------------------------------------------------------------------------------
# Loading and validation


def _field_path(loc: tuple, raw: dict | None) -> str:
    parts: list[str] = []
    node = raw
    for item in loc:
        if isinstance(item, int):
            label = f"[{item}]"
            if isinstance(node, list) and item < len(node):
                node = node[item]
                if isinstance(node, dict) and isinstance(node.get("name"), str):
                    label += f" ({node['name']})"
            else:
                node = None
            parts.append(label)
        else:
            parts.append(("." if parts else "") + str(item))
            node = node.get(item) if isinstance(node, dict) else None
    return "".join(parts)


_FIXES = {
    "missing": "add this field",
    "extra_forbidden": "remove it or correct its spelling (see docs/model.md for the fields)",
    "greater_than": "use a larger value",
    "greater_than_equal": "use a larger value",
    "less_than_equal": "use a smaller value",
    "finite_number": "write a finite number",
    "int_type": "write a whole number",
    "float_type": "write a number",
    "string_type": "write a string",
    "bool_type": "write true or false",
    "list_type": "write a list",
    "dict_type": "write a mapping",
    "literal_error": "use one of the allowed values",
    "too_short": "add at least one entry",
    "finite_number": "write a finite number",
    "union_tag_invalid": "use kind beam_search, rag, ensemble or stages (docs/simulation.md)",
}


def _validation_error(source: str, exc: ValidationError, raw: dict | None) -> InputError:
    first = exc.errors()[0]
    more = len(exc.errors()) - 1
    problem = first["msg"] + (f" (and {more} more problem{'s' if more > 1 else ''})" if more else "")
    fix = _FIXES.get(first["type"], "correct the value")
    return InputError(source, _field_path(tuple(first["loc"]), raw), problem, fix)


def parse_yaml(path: Path, deadline: float | None = None) -> object:
    """Read one YAML input: bounded, regular files only, duplicate keys refused (models/inputs.py),
    stopping at `deadline` (perf_counter seconds: TimeLimitError)."""
    return load_yaml(path, "pass a readable YAML file", deadline)


# nodes expanded between two deadline checks: a million GPUs take about a second to expand
EXPAND_CHUNK = 10_000


def _expand_nodes(source: str, spec: ClusterSpec, deadline: float | None = None) -> tuple[Node, ...]:
    total = sum((node.count or 1) * node.gpus for node in spec.nodes)
    if total > MAX_CLUSTER_GPUS:
        raise InputError(source, "cluster.nodes", f"{total:,} GPUs, more than the {MAX_CLUSTER_GPUS:,} scepsy plans for",
                         "plan a smaller cluster (or its partitions one by one)")
    nodes: list[Node] = []
    for i, node in enumerate(spec.nodes):
        where = f"cluster.nodes[{i}] ({node.name})"
        check_deadline(deadline, f"expanding {where} ({total:,} GPUs in all)")
        if node.gpu_type not in spec.gpu_types:
            known = ", ".join(sorted(spec.gpu_types))
            raise InputError(source, f"{where}.gpu_type", f"unknown gpu type {node.gpu_type!r}", f"use one of: {known}")
        seen: set[int] = set()
        for d, domain in enumerate(node.nvlink_domains):
            if not domain:
                raise InputError(source, f"{where}.nvlink_domains[{d}]", "empty NVLink domain", "list its GPU indices")
            for gpu in domain:
                if not 0 <= gpu < node.gpus:
                    raise InputError(
                        source,
                        f"{where}.nvlink_domains[{d}]",
                        f"GPU index {gpu} is outside 0..{node.gpus - 1}",
                        "use GPU indices of this node",
                    )
                if gpu in seen:
                    raise InputError(
                        source, f"{where}.nvlink_domains", f"GPU {gpu} is in two NVLink domains", "list each GPU once"
                    )
                seen.add(gpu)
        domains = [tuple(sorted(d)) for d in node.nvlink_domains]
        domains += [(g,) for g in range(node.gpus) if g not in seen]
        domains.sort()
        if node.gpu_uuids is not None:
            if node.count not in (None, 1):
                raise InputError(
                    source, f"{where}.gpu_uuids", "gpu_uuids given for a node entry with count > 1", "list nodes one by one"
                )
            if len(node.gpu_uuids) != node.gpus:
                raise InputError(
                    source, f"{where}.gpu_uuids", f"{len(node.gpu_uuids)} UUIDs for {node.gpus} GPUs", "list one per GPU"
                )
            if len(set(node.gpu_uuids)) != len(node.gpu_uuids):
                twice = next(u for u in node.gpu_uuids if node.gpu_uuids.count(u) > 1)
                raise InputError(source, f"{where}.gpu_uuids", f"UUID {twice!r} is listed twice", "list each GPU's own UUID once")
        names = [node.name] if node.count is None else [f"{node.name}-{k}" for k in range(node.count)]
        for name in (names[0], names[-1]):
            if not NODE_NAME.match(name):
                raise InputError(
                    source, f"{where}.name", f"{name!r} is not a Kubernetes node name (it labels the pods' node)",
                    "use the node's name as `kubectl get nodes` shows it: lowercase letters, digits, '-' and '.', at most 63",
                )
        uuids = tuple(node.gpu_uuids) if node.gpu_uuids is not None else None
        layout = tuple(domains)
        for first in range(0, len(names), EXPAND_CHUNK):
            check_deadline(deadline, f"expanding {where} ({total:,} GPUs in all)")
            nodes += [Node(name, node.gpu_type, node.gpus, layout, uuids) for name in names[first:first + EXPAND_CHUNK]]
    names_seen: set[str] = set()
    for expanded in nodes:
        if expanded.name in names_seen:
            raise InputError(source, "cluster.nodes", f"node name {expanded.name!r} appears twice", "give nodes unique names")
        names_seen.add(expanded.name)
    return tuple(nodes)


def _reserved_units(source: str, spec: ClusterSpec, nodes: tuple[Node, ...]) -> dict[tuple[str, int], int]:
    by_name = {n.name: n for n in nodes}
    units: dict[tuple[str, int], int] = {}
    for i, entry in enumerate(spec.reserved):
        where = f"cluster.reserved[{i}]"
        node = by_name.get(entry.node)
        if node is None:
            raise InputError(source, f"{where}.node", f"unknown node {entry.node!r}", "use an expanded node name such as node-0")
        if entry.gpu >= node.gpus:
            raise InputError(source, f"{where}.gpu", f"node {node.name} has GPUs 0..{node.gpus - 1}", "use a valid index")
        key = (node.name, entry.gpu)
        units[key] = units.get(key, 0) + math.ceil(entry.fraction * spec.fractions_per_gpu - 1e-9)
        if units[key] > spec.fractions_per_gpu:
            raise InputError(source, where, f"more than a whole GPU reserved on {node.name} GPU {entry.gpu}", "reserve at most 1.0 per GPU")
    return units


def _check_stage_statistics(source: str, where: str, stage: StageSpec) -> None:
    """Statistics no trace can produce. A request runs at most as many calls of an LLM at once as
    it makes, so p <= n; an LLM that only some requests call once (n < 1) has p = 1."""
    if stage.parallelism > max(stage.invocations, 1.0) * (1 + 1e-9):
        raise InputError(
            source, f"{where}.parallelism",
            f"parallelism {stage.parallelism:g} exceeds invocations {stage.invocations:g} (a request cannot run more "
            "calls at once than it makes)",
            f"use parallelism <= {max(stage.invocations, 1.0):g}, as `scepsy aggregate` measures it",
        )


def _check_latency_ratios(source: str, where: str, ratios: Mapping[str, float] | None) -> None:
    """Percentiles over the mean: positive, and not falling from p50 to p99."""
    if not ratios:
        return
    for name, value in sorted(ratios.items()):
        if not value > 0:
            raise InputError(source, f"{where}.{name}", f"ratio {value:g} is not positive", "write percentile / mean of the traced latency")
    ordered = [(q, ratios[q]) for q in ("p50", "p90", "p99") if q in ratios]
    for (low, a), (high, b) in zip(ordered, ordered[1:]):
        if b < a:
            raise InputError(
                source, f"{where}.{high}", f"{high} ratio {b:g} is below the {low} ratio {a:g}",
                "percentiles do not fall: use the ratios `scepsy aggregate` reports",
            )


def _check_unique(source: str, section: str, names: list[str]) -> None:
    seen: set[str] = set()
    for i, name in enumerate(names):
        if name in seen:
            raise InputError(source, f"{section}[{i}].name", f"duplicate name {name!r}", "give each entry a unique name")
        seen.add(name)


def _default_tp_degrees(cluster: Cluster) -> tuple[int, ...]:
    largest = max(cluster.largest_domain(g) for g in cluster.used_gpu_types())
    degrees, t = [], 1
    while t <= largest:
        degrees.append(t)
        t *= 2
    return tuple(degrees)


def _build_llm(source: str, base: Path, index: int, spec: LlmSpec, cluster: Cluster, profiles: dict[Path, LlmProfile],
               deadline: float | None = None) -> Llm:
    where = f"llms[{index}] ({spec.name})"
    check_deadline(deadline, f"loading {where} and its profile")
    largest = max(cluster.largest_domain(g) for g in cluster.used_gpu_types())
    if spec.tp_degrees is not None:
        if not spec.tp_degrees:
            raise InputError(source, f"{where}.tp_degrees", "empty list", "list at least one degree or drop the field")
        for t in spec.tp_degrees:
            if t < 1:
                raise InputError(source, f"{where}.tp_degrees", f"tp degree {t} < 1", "use positive degrees")
        if min(spec.tp_degrees) > largest:
            raise InputError(
                source,
                f"{where}.tp_degrees",
                f"no degree fits the largest NVLink domain ({largest} GPUs)",
                f"use degrees <= {largest}",
            )
        tp_degrees = tuple(sorted(set(spec.tp_degrees)))
    else:
        tp_degrees = _default_tp_degrees(cluster)
    profile_path = (base / spec.profile).resolve() if not Path(spec.profile).is_absolute() else Path(spec.profile)
    if kind_of(profile_path) != "file":
        raise InputError(source, f"{where}.profile", f"profile file {spec.profile} not found", "give a path relative to the instance file")
    if profile_path not in profiles:  # LLMs sharing a profile file read it once
        profiles[profile_path] = load_profile(profile_path)
    profile = profiles[profile_path]
    usable = [
        (g, t)
        for g in cluster.used_gpu_types()
        for t in tp_degrees
        if profile.has(g, t) and t <= cluster.largest_domain(g)
    ]
    if not usable:
        have = ", ".join(f"{g}/tp{t}" for g, t in profile.configurations()) or "no stable rows"
        raise InputError(
            str(profile_path),
            None,
            f"no stable profile rows for llm {spec.name} on this cluster's GPU types and TP degrees (profile has: {have})",
            "profile the LLM on these GPUs or list matching tp_degrees",
        )
    need = spec.weights_gib + spec.min_kv_gib
    if not any(t * cluster.gpu_types[g].memory_gib >= need - 1e-9 for g, t in usable):
        best = max(t * cluster.gpu_types[g].memory_gib for g, t in usable)
        raise InputError(
            source,
            f"{where}.weights_gib",
            f"weights_gib + min_kv_gib = {need:g} GiB does not fit in {best:g} GiB, the most memory one replica can get",
            "allow a larger tp degree (and profile it), use larger GPUs, or a smaller/quantized model",
        )
    return Llm(spec.name, spec.model, spec.weights_gib, spec.min_kv_gib, tp_degrees, str(profile_path), profile)


TAIL_METRICS = ("p90", "p99")  # percentiles whose sum over calls misses the control flow's spread most


def _warn_without_latency_ratios(source: str, metric: str, workflows: list[Workflow]) -> None:
    """One warning when a tail percentile is asked for and a workflow has no latency ratio for it:
    the prediction is then the sum of per-call percentiles, which misses the spread the control flow
    adds (18-40% low for beam search in docs/evidence.md, section 5)."""
    if metric not in TAIL_METRICS:
        return
    missing = [(w, wf.name) for w, wf in enumerate(workflows) if not (wf.latency_ratios and metric in wf.latency_ratios)]
    if not missing:
        return
    w, name = missing[0]
    others = f" (and {len(missing) - 1} more workflows)" if len(missing) > 1 else ""
    warnings.warn(ScepsyWarning(
        source, f"workflows[{w}] ({name}).latency_ratios",
        f"latency_metric is {metric} but this workflow{others} has no latency ratio for it, so its {metric} is "
        f"predicted as the sum of per-call {metric} latencies, which misses the spread of the control flow",
        "run scepsy aggregate on the workflow's traces and copy the latency_ratios it reports into the workflow",
    ), stacklevel=2)


def _check_latency_metric(source: str, metric: str, llms) -> None:
    """A percentile objective needs that percentile in every profile (imported benchmark results
    may carry only the mean). Each profile file is checked once, at its first LLM."""
    first_of_profile: dict[str, Llm] = {}
    for llm in llms:
        first_of_profile.setdefault(llm.profile_path, llm)
    for llm in first_of_profile.values():
        if metric in llm.profile.missing_metrics():
            raise InputError(
                llm.profile_path, f"column latency_{metric}",
                f"llm {llm.name}'s profile has no {metric} latencies (empty cells: the benchmark did not measure them), "
                f"but latency_metric is {metric}",
                f"set latency_metric: mean in {source}, or rerun the benchmark with --percentile-metrics e2el "
                "--metric-percentiles 50,90,99 and import it again",
            )


def build_instance(raw: object, source: str, base: Path, deadline: float | None = None) -> Instance:
    """The instance of a parsed instance file (`base`: the folder profile paths are relative to).
    Past `deadline` (perf_counter seconds) it raises TimeLimitError: a command's time limit covers
    loading the instance (expanding its nodes, loading each profile file once)."""
    if not isinstance(raw, dict):
        raise InputError(source, None, "the file is not a YAML mapping", "start with `cluster:`, `llms:` and `workflows:`")
    try:
        spec = InstanceSpec.model_validate(raw)
    except ValidationError as exc:
        raise _validation_error(source, exc, raw) from None
    _check_unique(source, "llms", [m.name for m in spec.llms])
    _check_unique(source, "workflows", [w.name for w in spec.workflows])
    nodes = _expand_nodes(source, spec.cluster, deadline)
    cluster = Cluster(
        fractions_per_gpu=spec.cluster.fractions_per_gpu,
        gpu_types=dict(spec.cluster.gpu_types),
        nodes=nodes,
        reserved_units=_reserved_units(source, spec.cluster, nodes),
    )
    llm_names = [m.name for m in spec.llms]
    used: set[str] = set()
    workflows = []
    for w, wf in enumerate(spec.workflows):
        seen: set[str] = set()
        for s, stage in enumerate(wf.stages):
            field_name = f"workflows[{w}] ({wf.name}).stages[{s}].llm"
            if stage.llm not in llm_names:
                raise InputError(source, field_name, f"unknown llm {stage.llm!r}", f"use one of: {', '.join(llm_names)}")
            if stage.llm in seen:
                raise InputError(source, field_name, f"llm {stage.llm!r} appears twice in one workflow", "merge the stages")
            seen.add(stage.llm)
        used |= seen
        if wf.program is not None:
            for role, name in program_llms(wf.program).items():
                if name not in seen:
                    raise InputError(
                        source,
                        f"workflows[{w}] ({wf.name}).program.{role}",
                        f"llm {name!r} is not one of this workflow's stages",
                        f"use one of: {', '.join(sorted(seen))}",
                    )
        for s, stage in enumerate(wf.stages):
            _check_stage_statistics(source, f"workflows[{w}] ({wf.name}).stages[{s}]", stage)
        stages = tuple(Stage(s.llm, s.invocations, s.parallelism, s.critical_path) for s in wf.stages)
        ratios = {str(q): value for q, value in wf.latency_ratios.items()} if wf.latency_ratios else None
        _check_latency_ratios(source, f"workflows[{w}] ({wf.name}).latency_ratios", ratios)
        workflows.append(
            Workflow(wf.name, wf.arrival_rate, stages, wf.latency_slo_s, wf.weight, program=wf.program, latency_ratios=ratios)
        )
    for i, name in enumerate(llm_names):
        if name not in used:
            raise InputError(source, f"llms[{i}] ({name})", "no workflow calls this llm", "add it to a workflow's stages or remove it")
    profiles: dict[Path, LlmProfile] = {}
    llms = tuple(_build_llm(source, base, i, m, cluster, profiles, deadline) for i, m in enumerate(spec.llms))
    _check_latency_metric(source, spec.latency_metric, llms)
    _warn_without_latency_ratios(source, spec.latency_metric, workflows)
    return Instance(
        cluster=cluster,
        llms=llms,
        workflows=tuple(workflows),
        objective=spec.objective,
        latency_metric=spec.latency_metric,
        max_utilization=spec.max_utilization,
        source=source,
        welfare=spec.welfare,
    ).with_objective(spec.objective)


def load_instance(path: Path | str, deadline: float | None = None) -> Instance:
    """The instance in a YAML file; past `deadline` (perf_counter seconds) TimeLimitError."""
    path = Path(path)
    return build_instance(parse_yaml(path, deadline), str(path), path.parent, deadline)

