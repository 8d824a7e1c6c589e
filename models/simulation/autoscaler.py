"""A Kubernetes Horizontal Pod Autoscaler for the simulator: per-LLM, whole-GPU replicas.

Every `sync_period_s` (HPA default 15 s) and for every LLM, the autoscaler reads the metric of
its ready replicas over the last period and computes, as the HPA does,

    desired = ceil(ready * metric / target)        unless |metric / target - 1| <= tolerance

Scale-ups apply at once (at most doubling, at least +1, as the default scale-up policy allows) but
a new replica serves only after `startup_s` (pod scheduling, image pull, model load); scale-downs
follow the highest recommendation of the last `scale_down_stabilization_s` (HPA default 300 s)
and drain the newest replica (it finishes its requests, then frees its GPUs). Replicas never
fall below `min_replicas`, and only take whole GPUs that are free: each replica needs `tp` GPUs
of one NVLink domain.

Metrics: `gpu_utilization` (default) is the fraction of time an iteration is running, the DCGM
GPU utilisation a GPU HPA scales on; `running_requests` is vLLM's num_requests_running +
num_requests_waiting per replica (then `target` is requests per replica).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import simpy

from scepsy.models.performance.engine import Engine
from scepsy.models.instance.instance import Cluster


@dataclass(frozen=True)
class HpaSettings:
    metric: str = "gpu_utilization"  # or "running_requests"
    target: float = 0.7  # utilisation fraction, or requests per replica
    tolerance: float = 0.1
    sync_period_s: float = 15.0
    scale_down_stabilization_s: float = 300.0
    startup_s: float = 60.0
    min_replicas: int = 1

    def __post_init__(self) -> None:
        if self.metric not in ("gpu_utilization", "running_requests"):
            raise ValueError(f"unknown HPA metric {self.metric!r}")
        if self.target <= 0 or self.sync_period_s <= 0 or self.min_replicas < 1:
            raise ValueError("target and sync_period_s must be > 0 and min_replicas >= 1")


class GpuPool:
    """Whole free GPUs of a cluster, handed out tp at a time from one NVLink domain."""

    def __init__(self, cluster: Cluster):
        self.free: dict[tuple[str, tuple[int, ...]], set[int]] = {}
        self.gpu_type: dict[tuple[str, tuple[int, ...]], str] = {}
        for domain in cluster.domains():
            key = (domain.node, domain.gpus)
            usable = {g for g in domain.gpus if cluster.free_units(domain.node, g) == cluster.fractions_per_gpu}
            self.free[key] = usable
            self.gpu_type[key] = domain.gpu_type

    def take(self, gpu_type: str, tp: int) -> tuple | None:
        for key in sorted(self.free):
            if self.gpu_type[key] == gpu_type and len(self.free[key]) >= tp:
                gpus = tuple(sorted(self.free[key])[:tp])
                self.free[key] -= set(gpus)
                return key, gpus
        return None

    def give_back(self, lease: tuple) -> None:
        key, gpus = lease
        self.free[key] |= set(gpus)

    def count(self, gpu_type: str) -> int:
        return sum(len(v) for k, v in self.free.items() if self.gpu_type[k] == gpu_type)


class Autoscaler:
    """A simulator controller (models/simulation/simulator.py `Controller`): `env.process(hpa(env, cluster))`.

    `leases` holds the GPUs of the replicas the simulation starts with (in the order they were
    created per LLM); they must have been taken from `pool` by the caller.
    """

    def __init__(self, settings: HpaSettings, pool: GpuPool, engines: dict[str, Engine], leases: dict[str, list]):
        self.settings = settings
        self.pool = pool
        self.engines = engines
        self.leases = {llm: list(v) for llm, v in leases.items()}
        # (time, desired) within the scale-down stabilization window only: memory flat over the run
        self.history: dict[str, deque[tuple[float, int]]] = {llm: deque() for llm in engines}
        self.events: list[tuple[float, str, str, int]] = []  # (time, llm, "up"/"down", replicas)

    def __call__(self, env: simpy.Environment, cluster):
        s = self.settings
        starting: dict[str, int] = {llm: 0 for llm in self.engines}
        last_busy = {id(r): r.busy_s for llm in self.engines for r in cluster.routers[llm].replicas}
        while True:
            yield env.timeout(s.sync_period_s)
            now = env.now
            for llm in sorted(self.engines):
                router = cluster.routers[llm]
                ready = list(router.replicas)
                if not ready:
                    continue
                if s.metric == "gpu_utilization":
                    values = []
                    for replica in ready:
                        since = max(now - s.sync_period_s, replica.started_s)
                        previous = last_busy.get(id(replica), 0.0)
                        values.append((replica.busy_s - previous) / max(now - since, 1e-9))
                        last_busy[id(replica)] = replica.busy_s
                    metric = min(sum(values) / len(values), 1.0)
                else:
                    metric = sum(r.outstanding for r in ready) / len(ready)
                current = len(ready) + starting[llm]
                ratio = metric / s.target
                desired = current if abs(ratio - 1) <= s.tolerance else math.ceil(len(ready) * ratio)
                desired = max(desired, s.min_replicas)
                history = self.history[llm]
                history.append((now, desired))
                while history and history[0][0] <= now - s.scale_down_stabilization_s:
                    history.popleft()
                window = [d for _, d in history]
                if desired > current:
                    grow = min(desired, max(current * 2, current + 1)) - current
                    for _ in range(grow):
                        lease = self.pool.take(self.engines[llm].gpu.name, self.engines[llm].tp)
                        if lease is None:
                            break
                        starting[llm] += 1
                        env.process(self._start(env, cluster, llm, lease, starting))
                        self.events.append((now, llm, "up", current + 1))
                        current += 1
                elif max(window) < current and len(ready) > s.min_replicas:
                    target = max(max(window), s.min_replicas)
                    for _ in range(min(current - target, len(ready) - s.min_replicas)):
                        replica = router.replicas[-1]
                        lease = self.leases[llm].pop()
                        router.drain(replica)
                        env.process(self._release(env, replica, lease))
                        current -= 1
                        self.events.append((now, llm, "down", current))

    def _start(self, env, cluster, llm, lease, starting):
        yield env.timeout(self.settings.startup_s)
        starting[llm] -= 1
        cluster.add_replica(llm)
        self.leases[llm].append(lease)

    def _release(self, env, replica, lease):
        while replica.retired_s is None:
            yield env.timeout(1.0)
        self.pool.give_back(lease)
