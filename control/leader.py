"""One active controller: leader election on a coordination.k8s.io Lease, with the official
client's `kubernetes.leaderelection` (LeaderElection and its LeaseLock).

Every controller replica is a candidate under its own identity (the pod's name). The election
runs in a daemon thread: a candidate creates the Lease or, once its holder stopped renewing it for
`lease_duration_s`, takes it over, and then renews it every `retry_period_s`; one that cannot
renew within `renew_deadline_s` has lost it. The controller's loop runs in the calling thread
only while this candidate leads: a standby waits (and says so on /healthz), and a leader that
loses the Lease stops before its next period (LeadershipLost, exit code 1: Kubernetes restarts
the pod, which comes back as a standby). The defaults are client-go's (15 s, 10 s, 2 s).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from scepsy.k8s.controller import LEASE_DURATION_S
from scepsy.k8s.names import CONTROLLER
from scepsy.models.errors import InputError, ScepsyError

LEASE_NAME = CONTROLLER  # `scepsy manifests --controller` writes it and grants get and update on it


class LeadershipLost(ScepsyError):
    """This controller could not renew its Lease: another one may act now."""


@dataclass(frozen=True)
class LeaderSettings:
    identity: str  # unique per candidate: the pod's name
    namespace: str
    lease: str = LEASE_NAME
    lease_duration_s: float = LEASE_DURATION_S  # the Lease the manifests write says the same
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise InputError(None, "leader_identity", "empty", "give each controller replica its own name, e.g. the pod's ($POD_NAME)")
        for name in ("lease_duration_s", "renew_deadline_s", "retry_period_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InputError(None, name, f"{value!r} is not a positive number of seconds", "give e.g. 15")
        if not float(self.lease_duration_s).is_integer():
            raise InputError(None, "lease_duration_s", f"{self.lease_duration_s!r} is not whole seconds", "give e.g. 15")
        # the library's own conditions (electionconfig.Config exits the process on any other)
        if not (self.lease_duration_s > self.renew_deadline_s > 1.2 * self.retry_period_s and self.retry_period_s >= 1):
            raise InputError(None, "lease_duration_s", "the lease duration must exceed the renew deadline, which must exceed "
                             "1.2 retry periods of at least 1 s", "keep client-go's 15 s, 10 s and 2 s")


class Election:
    """A candidate's election (module docstring); `leading` and `lost` are set by the election thread."""

    def __init__(self, api_client, settings: LeaderSettings):
        from kubernetes import client
        from kubernetes.leaderelection import electionconfig, leaderelection

        root = logging.getLogger()
        handlers, level = list(root.handlers), root.level
        from kubernetes.leaderelection.resourcelock.leaselock import LeaseLock

        # the lock's module calls logging.basicConfig(level=INFO) when imported: every library's INFO
        # line would reach stderr, where the controller writes one line per event
        root.handlers[:] = handlers
        root.setLevel(level)
        logging.getLogger("leaderelection").setLevel(logging.WARNING)  # an INFO line every retry would fill stderr
        self.settings = settings
        self.error: str | None = None  # why the election ended, where it failed
        self.leading = threading.Event()
        self.lost = threading.Event()
        lock = LeaseLock(settings.lease, settings.namespace, settings.identity)
        lock.api_instance = client.CoordinationV1Api(api_client)  # the controller's client, not the global default
        # the Lease's leaseDurationSeconds is whole seconds (the library converts the text of the value it was given)
        config = electionconfig.Config(lock, int(settings.lease_duration_s), settings.renew_deadline_s, settings.retry_period_s,
                                       self.leading.set, self.lost.set)
        self._election = leaderelection.LeaderElection(config)
        self._thread = threading.Thread(target=self._run, name="scepsy-leader-election", daemon=True)

    def _run(self) -> None:
        try:
            self._election.run()
        except Exception as exc:  # noqa: BLE001 - an API failure inside the library ends the election: not leading
            self.error = f"{type(exc).__name__}: {exc}"
        self.lost.set()

    def start(self) -> None:
        self._thread.start()

    def wait_to_lead(self, waiting: Callable[[], None]) -> None:
        """Block until this candidate leads, calling `waiting` every retry period meanwhile;
        LeadershipLost if the election ended first."""
        while not self.leading.wait(self.settings.retry_period_s):
            if self.lost.is_set():
                raise LeadershipLost(f"the leader election on Lease {self.settings.namespace}/{self.settings.lease} ended before this "
                                     f"controller led ({self.error or 'no reason given'})")
            waiting()

    def check(self) -> None:
        if self.lost.is_set():
            raise LeadershipLost(f"lost Lease {self.settings.namespace}/{self.settings.lease}: another controller may act now; "
                                 "this one stops (its pod restarts as a standby)")
