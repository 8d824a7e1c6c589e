"""NVLink topology discovery with NVML (nvidia-ml-py): the node entry of a cluster file.

`discover(nvml, node_name)` asks NVML, through the module `pynvml` or anything with the same
functions (`RecordedNvml` replays recorded answers), for:
* the GPUs (`nvmlDeviceGetCount`, `nvmlDeviceGetHandleByIndex`): NVML index order, the order of
  `nvidia-smi` (PCI bus order); name (`nvmlDeviceGetName`) -> gpu type; memory
  (`nvmlDeviceGetMemoryInfo(h).total`, bytes); UUID (`nvmlDeviceGetUUID`, used by the manifests);
  PCI bus id (`nvmlDeviceGetPciInfo`);
* every NVLink of every GPU, links 0..NVML_NVLINK_MAX_LINKS-1: `nvmlDeviceGetNvLinkState` (active
  when NVML_FEATURE_ENABLED; an NVMLError such as NotSupported or InvalidArgument means no such
  link), the far end's PCI bus id (`nvmlDeviceGetNvLinkRemotePciInfo`, the _v2 call) and kind
  (`nvmlDeviceGetNvLinkRemoteDeviceType`: NVML_NVLINK_DEVICE_TYPE_GPU, _SWITCH, _IBMNPU, _UNKNOWN).

NVLink domains are the connected components of the graph whose vertices are the GPUs and the
NVSwitches, with an edge for every active link: to another GPU (its PCI bus id is a GPU of this
node) or to an NVSwitch (device type SWITCH, identified by its bus id; where NVML reports neither
the type nor a bus id that is a local GPU, the far end is taken for a switch). So GPUs joined by
NVLink bridges form pairs or quads, and on NVSwitch systems (HGX/DGX), where every GPU's links go to
the switches, all GPUs form one domain. Links to other devices (IBM NPUs, CPUs) are ignored. GPUs
without an active link are domains of their own (not listed in `nvlink_domains`).

Cross-check: `nvmlDeviceGetP2PStatus(a, b, NVML_P2P_CAPS_INDEX_NVLINK)` for every pair. GPUs in one
domain without NVLink P2P (e.g. a chain 0-1-2 where 0 and 2 have no direct link: traffic between
them would cross PCIe), or NVLink P2P between GPUs of different domains, become warnings: the
domains come from the links; the warnings say where to look.

Without the NVML library, a driver or a GPU, discovery raises NvmlUnavailableError (exit code 2).
`record(nvml)` writes the answers of the same calls as JSON; `RecordedNvml` replays them, for tests
and for reproducing a node's discovery elsewhere (`scepsy topology --record/--replay`).
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, NoReturn

import yaml

from scepsy.models.errors import InputError, ScepsyError
from scepsy.models.inputs import load_json

MAX_LINKS_FALLBACK = 18  # NVLink 4 (H100) has 18 links per GPU; used if the constant is missing
ANSWERS_FORMAT = "scepsy-nvml-answers/1"  # the `format` of the answers files `record` writes and `RecordedNvml` replays
MAX_LINKS_REPLAYED = 64  # NVLink links per GPU a replayed file may name (NVLink 5, B200: 18)
MAX_GPUS_REPLAYED = 1024  # GPUs of one node a replayed file may list


class NvmlUnavailableError(ScepsyError):
    """No NVML library, driver or GPU here: exit code 2 with what to do instead."""

    exit_code = 2


# ---------------------------------------------------------------------------------------------
# the result


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    memory_bytes: int
    pci_bus_id: str  # normalised: dddddddd:bb:dd.0, lower case


@dataclass(frozen=True)
class NodeTopology:
    node_name: str
    gpu_type: str
    memory_gib: float
    gpus: tuple[GpuInfo, ...]
    domains: tuple[tuple[int, ...], ...]  # every GPU in exactly one, sorted
    nvlinks: tuple[tuple[int, str, str], ...]  # (gpu, link target: "gpu:<i>" or "switch:<bus id>", ...)
    warnings: tuple[str, ...]
    driver_version: str | None

    def node_entry(self) -> dict:
        """The node's entry of `cluster.nodes` (models/instance/instance.py NodeSpec)."""
        return {
            "name": self.node_name,
            "gpu_type": self.gpu_type,
            "gpus": len(self.gpus),
            "nvlink_domains": [list(d) for d in self.domains if len(d) > 1],
            "gpu_uuids": [g.uuid for g in self.gpus],
        }

    def cluster_fragment(self) -> dict:
        """`gpu_types` and `nodes` entries to merge into a cluster file's `cluster:` section."""
        return {"gpu_types": {self.gpu_type: {"memory_gib": self.memory_gib}}, "nodes": [self.node_entry()]}

    def to_yaml(self) -> str:
        header = (
            f"# scepsy topology: node {self.node_name}, {len(self.gpus)} x {self.gpus[0].name}"
            f"{f', driver {self.driver_version}' if self.driver_version else ''}.\n"
            "# Merge into the `cluster:` section of an instance file (gpu_types, nodes).\n"
        )
        notes = "".join(f"# warning: {w}\n" for w in self.warnings)
        return header + notes + yaml.dump(self.cluster_fragment(), Dumper=_NodeDumper, sort_keys=False, width=120)

    def to_json(self) -> dict:
        return {
            **self.cluster_fragment(),
            "gpus": [g.__dict__ for g in self.gpus],
            "nvlinks": [{"gpu": g, "link": link, "to": to} for g, link, to in self.nvlinks],
            "warnings": list(self.warnings),
            "driver_version": self.driver_version,
        }


class _NodeDumper(yaml.SafeDumper):
    """Lists of numbers inline ([0, 1]), everything else in block style (one UUID per line)."""


def _represent_list(dumper: yaml.SafeDumper, data: list):
    flow = all(isinstance(x, (int, float)) for x in data) or all(isinstance(x, list) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


def _represent_dict(dumper: yaml.SafeDumper, data: dict):
    flow = all(isinstance(v, (int, float)) for v in data.values())
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=flow)


_NodeDumper.add_representer(list, _represent_list)
_NodeDumper.add_representer(dict, _represent_dict)


# ---------------------------------------------------------------------------------------------
# discovery


def gpu_type_name(nvml_name: str) -> str:
    """A gpu type name from NVML's product name: the model, plus the form factor where it matters.

    "NVIDIA H100 80GB HBM3" -> H100, "NVIDIA A100-SXM4-80GB" -> A100, "NVIDIA A100 80GB PCIe" ->
    A100-PCIe, "NVIDIA H100 NVL" -> H100-NVL, "NVIDIA RTX A6000" -> A6000, "NVIDIA GeForce RTX 4090"
    -> RTX-4090, "NVIDIA RTX 6000 Ada Generation" -> RTX-6000-Ada, "Tesla V100-SXM2-16GB" -> V100,
    "NVIDIA L40S" -> L40S. `scepsy topology --gpu-type` overrides it."""
    words = [w for w in re.split(r"\s+", nvml_name.strip()) if w and w not in ("NVIDIA", "Tesla", "Quadro")]
    if words[:1] == ["GeForce"]:
        words = words[1:]
    if len(words) >= 2 and words[0] == "RTX" and re.match(r"^[A-Z]\d", words[1]):  # RTX A6000 -> A6000
        words = words[1:]
    model = words[0].split("-")[0] if words else "GPU"
    if model == "RTX" and len(words) > 1:
        model = f"RTX-{words[1]}"
    suffixes = [s for s in ("PCIe", "NVL") if s in words or any(w.endswith(f"-{s}") for w in words)]
    if "Ada" in words:
        suffixes.insert(0, "Ada")
    return "-".join([model, *suffixes])


def _bus_id(pci) -> str:
    """Normalised PCI bus id from an nvmlPciInfo_t (its integer fields; busId strings vary)."""
    return f"{int(pci.domain):08x}:{int(pci.bus):02x}:{int(pci.device):02x}.0"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _error_name(nvml, error: Exception) -> str:
    return type(error).__name__.replace("NVMLError_", "") if isinstance(error, nvml.NVMLError) else type(error).__name__


def _init(nvml) -> None:
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as error:
        raise NvmlUnavailableError(
            f"NVML is not available here ({error}): `scepsy topology` reads the GPUs of the machine it runs on; "
            "run it on the GPU node (or in a pod with the NVIDIA container runtime), or describe the node by "
            "hand in the cluster file (docs/placement.md, 'Topology discovery')"
        ) from None


def discover(nvml, node_name: str | None = None, gpu_type: str | None = None) -> NodeTopology:
    """Read the node's GPUs and NVLink domains from NVML (module docstring)."""
    _init(nvml)
    try:
        return _discover(nvml, node_name or socket.gethostname(), gpu_type)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        source = getattr(nvml, "source", None)
        if source is None:
            raise  # the real NVML: a bug of ours, not bad input
        raise InputError(source, None, f"malformed NVML answers ({type(exc).__name__}: {exc})",
                         "pass a file written by `scepsy topology --record`") from None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def _discover(nvml, node_name: str, gpu_type: str | None) -> NodeTopology:
    count = nvml.nvmlDeviceGetCount()
    if count == 0:
        raise NvmlUnavailableError("NVML reports no GPU on this machine; run `scepsy topology` on a GPU node")
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except nvml.NVMLError:
        driver = None
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpus = tuple(
        GpuInfo(
            index=i,
            name=_text(nvml.nvmlDeviceGetName(h)),
            uuid=_text(nvml.nvmlDeviceGetUUID(h)),
            memory_bytes=int(nvml.nvmlDeviceGetMemoryInfo(h).total),
            pci_bus_id=_bus_id(nvml.nvmlDeviceGetPciInfo(h)),
        )
        for i, h in enumerate(handles)
    )
    names = sorted({g.name for g in gpus})
    if len(names) > 1:
        raise NvmlUnavailableError(
            f"node {node_name} has GPUs of different models ({', '.join(names)}); a cluster file's node has one "
            "gpu type: describe this node by hand, one entry per model is not possible on one node"
        )
    warnings: list[str] = []
    links, edges = _links(nvml, handles, gpus, warnings)
    domains = _components(len(gpus), edges)
    warnings += _cross_check(nvml, handles, domains)
    return NodeTopology(
        node_name=node_name,
        gpu_type=gpu_type or gpu_type_name(gpus[0].name),
        memory_gib=round(min(g.memory_bytes for g in gpus) / 2**30, 1),
        gpus=gpus,
        domains=domains,
        nvlinks=tuple(links),
        warnings=tuple(warnings),
        driver_version=driver,
    )


def _links(nvml, handles, gpus, warnings: list[str]):
    """Active NVLinks as (gpu, link, target) and as graph edges between GPU and switch vertices."""
    by_bus = {g.pci_bus_id: g.index for g in gpus}
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_LINKS_FALLBACK)
    switch_type = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
    gpu_type = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
    links: list[tuple[int, str, str]] = []
    edges: list[tuple[str, str]] = []
    for i, handle in enumerate(handles):
        for link in range(max_links):
            try:
                if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                    continue
            except nvml.NVMLError:
                continue  # NotSupported / InvalidArgument: this GPU has no such link
            remote_type = getattr(nvml, "nvmlDeviceGetNvLinkRemoteDeviceType", None)  # older bindings lack it
            try:
                kind = remote_type(handle, link) if remote_type is not None else None
            except nvml.NVMLError:
                kind = None
            try:
                remote = _bus_id(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link))
            except nvml.NVMLError:
                remote = None
            if kind == gpu_type or (kind is None and remote in by_bus):
                if remote not in by_bus:
                    warnings.append(f"GPU {i} link {link} goes to GPU {remote}, which NVML does not list on this node")
                    continue
                target = f"gpu:{by_bus[remote]}"
            elif kind == switch_type or kind is None:
                target = f"switch:{remote or 'nvswitch'}"
            else:
                continue  # IBM NPU, CPU or unknown device: no GPU-to-GPU bandwidth
            links.append((i, str(link), target))
            edges.append((f"gpu:{i}", target))
    return links, edges


def _components(count: int, edges: list[tuple[str, str]]) -> tuple[tuple[int, ...], ...]:
    """Connected components of the GPUs (union-find over GPU and switch vertices)."""
    parent: dict[str, str] = {f"gpu:{i}": f"gpu:{i}" for i in range(count)}

    def find(a: str) -> str:
        parent.setdefault(a, a)
        while parent[a] != a:
            parent[a] = parent[parent[a]]
            a = parent[a]
        return a

    for a, b in edges:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict[str, list[int]] = {}
    for i in range(count):
        groups.setdefault(find(f"gpu:{i}"), []).append(i)
    return tuple(sorted(tuple(sorted(g)) for g in groups.values()))


def _cross_check(nvml, handles, domains) -> list[str]:
    index = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
    ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    domain_of = {g: d for d in domains for g in d}
    warnings = []
    for a in range(len(handles)):
        for b in range(a + 1, len(handles)):
            try:
                status = nvml.nvmlDeviceGetP2PStatus(handles[a], handles[b], index)
            except nvml.NVMLError:
                continue
            same = domain_of[a] == domain_of[b]
            if same and status != ok:
                warnings.append(
                    f"GPUs {a} and {b} share NVLink domain {list(domain_of[a])} through other links but NVML reports no "
                    f"NVLink P2P between them (status {status}): tensor-parallel traffic between them may cross PCIe"
                )
            elif not same and status == ok:
                warnings.append(
                    f"NVML reports NVLink P2P between GPUs {a} and {b} but no active link joins them; "
                    "check `nvidia-smi nvlink --status` (the domains may be too small)"
                )
    return warnings


# ---------------------------------------------------------------------------------------------
# recording and replaying NVML answers


def record(nvml) -> dict:
    """The answers of every NVML call `discover` makes, as JSON (replayable with RecordedNvml)."""
    _init(nvml)
    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_LINKS_FALLBACK)
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError:
            driver = None

        def answer(call, *args):
            try:
                value = call(*args)
            except nvml.NVMLError as error:
                return {"error": _error_name(nvml, error)}
            if hasattr(value, "domain"):
                return {"value": {"domain": int(value.domain), "bus": int(value.bus), "device": int(value.device)}}
            return {"value": int(value)}

        gpus = []
        for i, h in enumerate(handles):
            pci = nvml.nvmlDeviceGetPciInfo(h)
            links = {}
            for link in range(max_links):
                state = answer(nvml.nvmlDeviceGetNvLinkState, h, link)
                entry = {"state": state}
                if state.get("value") == nvml.NVML_FEATURE_ENABLED:
                    entry["remote_type"] = answer(nvml.nvmlDeviceGetNvLinkRemoteDeviceType, h, link)
                    entry["remote_pci"] = answer(nvml.nvmlDeviceGetNvLinkRemotePciInfo, h, link)
                links[str(link)] = entry
            p2p = {
                str(j): answer(nvml.nvmlDeviceGetP2PStatus, h, handles[j], getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2))
                for j in range(count)
                if j != i
            }
            gpus.append(
                {
                    "name": _text(nvml.nvmlDeviceGetName(h)),
                    "uuid": _text(nvml.nvmlDeviceGetUUID(h)),
                    "memory_total_bytes": int(nvml.nvmlDeviceGetMemoryInfo(h).total),
                    "pci": {"domain": int(pci.domain), "bus": int(pci.bus), "device": int(pci.device)},
                    "nvlinks": links,
                    "p2p_nvlink": p2p,
                }
            )
        return {"format": ANSWERS_FORMAT, "driver_version": driver, "max_links": max_links, "gpus": gpus}
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


class RecordedNvml:
    """Replays recorded NVML answers through the pynvml functions `discover` calls.

    The answers file (`record` writes it) holds, per GPU: name, uuid, memory_total_bytes, pci
    (domain, bus, device), per link index its state and, for active links, remote_type and
    remote_pci, and the NVLink P2P status towards every other GPU; each answer is {"value": ...} or
    {"error": "<NVML error name>"} (NotSupported, InvalidArgument, ...), raised as the real
    pynvml.NVMLError subclass. An optional top-level "init_error" makes nvmlInit fail the same way
    (LibraryNotFound, DriverNotLoaded). Constants and error classes are pynvml's own.
    """

    def __init__(self, answers: dict, source: str = "NVML answers"):
        import pynvml

        self.source = source  # named in the input error of a malformed file
        self._nvml = pynvml
        self.answers = answers
        self.NVMLError = pynvml.NVMLError
        self.NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
        self.NVML_P2P_CAPS_INDEX_NVLINK = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        self.NVML_P2P_STATUS_OK = pynvml.NVML_P2P_STATUS_OK
        self.NVML_NVLINK_DEVICE_TYPE_GPU = pynvml.NVML_NVLINK_DEVICE_TYPE_GPU
        self.NVML_NVLINK_DEVICE_TYPE_SWITCH = pynvml.NVML_NVLINK_DEVICE_TYPE_SWITCH
        self.NVML_NVLINK_MAX_LINKS = int(answers.get("max_links", pynvml.NVML_NVLINK_MAX_LINKS))
        self.initialised = False

    @classmethod
    def from_file(cls, path: Path | str) -> "RecordedNvml":
        path = Path(path)
        answers = load_json(path, "pass a file written by `scepsy topology --record`")
        if not isinstance(answers, dict) or not isinstance(answers.get("gpus", []), list):
            raise InputError(str(path), "gpus", "not an NVML answers file", "pass a file written by `scepsy topology --record`")
        if answers.get("format", ANSWERS_FORMAT) != ANSWERS_FORMAT:
            raise InputError(str(path), "format", f"{answers['format']!r} is not {ANSWERS_FORMAT!r}, the answers this scepsy replays",
                             "pass a file written by `scepsy topology --record`")
        links = answers.get("max_links", MAX_LINKS_FALLBACK)
        if not isinstance(links, int) or isinstance(links, bool) or not 0 <= links <= MAX_LINKS_REPLAYED:
            raise InputError(str(path), "max_links", f"{links!r} is not a link count in 0..{MAX_LINKS_REPLAYED}",
                             "pass a file written by `scepsy topology --record`")
        if len(answers.get("gpus", [])) > MAX_GPUS_REPLAYED:
            raise InputError(str(path), "gpus", f"more than {MAX_GPUS_REPLAYED} GPUs on one node",
                             "pass a file written by `scepsy topology --record`")
        return cls(answers, str(path))

    def _raise(self, name: str) -> NoReturn:
        code = getattr(self._nvml, "NVML_ERROR_" + re.sub(r"(?<!^)(?=[A-Z])", "_", name).upper(), self._nvml.NVML_ERROR_UNKNOWN)
        raise self._nvml.NVMLError(code)

    def _reply(self, answer: dict | None) -> Any:  # what the recorded NVML answer holds
        if answer is None:
            self._raise("NotSupported")
        if "error" in answer:
            self._raise(answer["error"])
        value = answer["value"]
        return SimpleNamespace(**value) if isinstance(value, dict) else value

    def _gpu(self, handle) -> dict:
        self._require_init()
        return self.answers["gpus"][handle.index]

    def _require_init(self) -> None:
        if not self.initialised:
            self._raise("Uninitialized")

    def nvmlInit(self) -> None:
        if "init_error" in self.answers:
            self._raise(self.answers["init_error"])
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self._require_init()
        self.initialised = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._require_init()
        if self.answers.get("driver_version") is None:
            self._raise("NotSupported")
        return self.answers["driver_version"]

    def nvmlDeviceGetCount(self) -> int:
        self._require_init()
        return len(self.answers["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int):
        self._require_init()
        if not 0 <= index < len(self.answers["gpus"]):
            self._raise("InvalidArgument")
        return SimpleNamespace(index=index)

    def nvmlDeviceGetName(self, handle) -> str:
        return self._gpu(handle)["name"]

    def nvmlDeviceGetUUID(self, handle) -> str:
        return self._gpu(handle)["uuid"]

    def nvmlDeviceGetMemoryInfo(self, handle):
        total = self._gpu(handle)["memory_total_bytes"]
        if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
            raise InputError(self.source, f"gpus[{handle.index}].memory_total_bytes", f"{total!r} is not a positive number of bytes",
                             "pass a file written by `scepsy topology --record`")
        return SimpleNamespace(total=total)

    def nvmlDeviceGetPciInfo(self, handle):
        pci = self._gpu(handle)["pci"]
        bus_id = f"{pci['domain']:08X}:{pci['bus']:02X}:{pci['device']:02X}.0"
        return SimpleNamespace(busId=bus_id, **pci)

    def _link(self, handle, link: int) -> dict:
        return self._gpu(handle).get("nvlinks", {}).get(str(link), {"state": {"error": "InvalidArgument"}})

    def nvmlDeviceGetNvLinkState(self, handle, link: int) -> int:
        return self._reply(self._link(handle, link)["state"])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle, link: int) -> int:
        return self._reply(self._link(handle, link).get("remote_type"))

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle, link: int):
        return self._reply(self._link(handle, link).get("remote_pci"))

    def nvmlDeviceGetP2PStatus(self, handle1, handle2, index: int) -> int:
        if index != self.NVML_P2P_CAPS_INDEX_NVLINK:
            self._raise("NotSupported")
        return self._reply(self._gpu(handle1).get("p2p_nvlink", {}).get(str(handle2.index)))


def real_nvml():
    """The pynvml module (nvidia-ml-py), or NvmlUnavailableError if it is not installed."""
    try:
        import pynvml
    except ImportError:
        raise NvmlUnavailableError("the Python package nvidia-ml-py (pynvml) is not installed; pip install nvidia-ml-py") from None
    return pynvml
