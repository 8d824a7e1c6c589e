"""The live controller as a service: its /metrics and /healthz server (control/gauges.py), its
leader election (control/leader.py) and the loop (control/live.py), started and stopped in order.

The server starts first, in every act mode, so that a standby answers its probes; the loop runs
only while this controller leads (or always, without leader election), and each of its periods
begins with a check that the Lease is still held.
"""

from __future__ import annotations

from collections.abc import Callable

from scepsy.control.gauges import DesiredGauges
from scepsy.control.leader import Election, LeaderSettings
from scepsy.control.live import LiveLoop
from scepsy.models.errors import InputError


def header_pairs(items: list[str] | tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """`Name: value` items (curl's -H) as (name, value); InputError naming `prometheus_headers`."""
    pairs = []
    for item in items:
        name, sep, value = item.partition(":")
        name, value = name.strip(), value.strip()
        if not sep or not name or any(c in name for c in " \t\r\n") or any(c in value for c in "\r\n"):
            raise InputError(None, "prometheus_headers", f"{item!r} is not a header 'Name: value'",
                             "write e.g. 'X-Scope-OrgID: tenant-1'")
        pairs.append((name, value))
    return tuple(pairs)


def serve_metrics(gauges: DesiredGauges, host: str, port: int, say: Callable[[str], None]) -> None:
    """Serve /metrics and /healthz (port 0: a free one), and say where."""
    try:
        bound_host, bound_port = gauges.serve(port, host)
    except OSError as exc:
        raise InputError(None, "metrics_port", f"cannot listen on {host}:{port} ({exc.strerror})",
                         "choose a free port (0: any free one)") from None
    say(f"scepsy control: serving /metrics and /healthz on http://{bound_host}:{bound_port}")


def run(loop: LiveLoop, gauges: DesiredGauges, sleep: Callable[[float], None], periods: int | None,
        api_client: object | None = None, leader: LeaderSettings | None = None) -> None:
    """The loop, behind the leader election when `leader` is given (module docstring)."""
    if leader is None:
        loop.run(sleep, periods)
        return
    election = Election(api_client, leader)
    election.start()
    gauges.leading(False)
    loop.say(f"scepsy control: {leader.identity} is a candidate for Lease {leader.namespace}/{leader.lease}")
    election.wait_to_lead(gauges.waiting)
    gauges.leading(True)
    loop.say(f"scepsy control: {leader.identity} leads (Lease {leader.namespace}/{leader.lease})")
    loop.run(sleep, periods, before_period=election.check)
