"""The core of a durable ledger call, without I/O: what to send and how to read the answers.

A durable call (:mod:`toolq.adapters.ledger.durability`) is a generator: it yields what to
do (an :data:`Effect`: run the script plainly, build its command, send commands on
one connection, load the scripts, read the Cluster's map again, pause, probe) and
is sent each answer; it returns the call's answer or raises. The sync and async
shells (:mod:`toolq.adapters.ledger.durable`) only carry the effects out, so the retry and
route decisions are written once: :func:`one_server_call` and :func:`cluster_call`.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from toolq.adapters.ledger.durability import Plans
from toolq.adapters.ledger.route import ROUTE_ATTEMPTS, Route
from toolq.adapters.ledger.runner import lost_scripts
from toolq.core import errors


@dataclass(frozen=True)
class Direct:
    """Run the script as the runner does, no waits; its answer is the call's."""


@dataclass(frozen=True)
class Command:
    """The raw command that runs the script (the runner loads the scripts first if needed)."""


@dataclass(frozen=True)
class Send:
    """Pipeline ``commands`` on one connection: the client's own (``node`` None; errors
    raised) or the Cluster ``node``'s (a lost connection answered as the exception)."""

    commands: list[tuple[Any, ...]]
    node: Any = None


@dataclass(frozen=True)
class Load:
    """Load the scripts again (the server lost them)."""


@dataclass(frozen=True)
class Remap:
    """Read the Cluster's map again (a slot moved, a failover, a replica dropped)."""


@dataclass(frozen=True)
class Pause:
    seconds: float


@dataclass(frozen=True)
class Probe:
    """Read the server's settings when due (:meth:`Plans.begin`)."""


Effect = Direct | Command | Send | Load | Remap | Pause | Probe
#: A durable call's steps: yields effects, is sent their answers, returns the call's.
Steps = Generator[Effect, Any, Any]


def one_server_call(plans: Plans) -> Steps:
    """One server: the call, then WAITAOF, pipelined on one connection; once more
    after NOSCRIPT (a restarted server lost its scripts)."""
    yield Probe()
    p = plans.current()
    if not p.wait:
        return (yield Direct())
    for _ in range(2):
        command = yield Command()
        reply, ack = yield Send([tuple(command), *p.waits()])
        if not lost_scripts(reply):
            break
        yield Load()
    if isinstance(reply, Exception):
        raise reply
    plans.learned(ack)
    return reply


def cluster_call(plans: Plans, cluster: Any, keys: Sequence[Any]) -> Steps:
    """The call, WAITAOF and WAIT pipelined on one connection of the primary that
    serves the call's slot (they count that connection's writes), sent again after
    an answer that says it did not run there (:func:`toolq.adapters.ledger.route.resend`)."""
    if plans.mode == "none":
        return (yield Direct())
    yield Probe()  # before the map is read: a probe reads it again
    route = Route(cluster, cluster.keyslot(keys[0]))
    for attempt in range(ROUTE_ATTEMPTS):
        p = plans.current(replicas=len(route.shard()) - 1)
        if not (p.wait or p.replica):
            return (yield Direct())
        command = yield Command()
        answers = yield Send(route.commands(command, p), route.node)
        replies = [answers] if isinstance(answers, Exception) else route.replies(answers)
        again = route.after(replies[0], last=attempt == ROUTE_ATTEMPTS - 1)
        if again is None:
            break
        if again.remap:
            yield Remap()
        if again.load:
            yield Load()
        yield Pause(again.pause)
    if isinstance(replies[0], Exception):
        raise replies[0]
    try:
        plans.settle(p, replies[1:])
    except errors.NotDurable:
        if p.replica:  # the cluster may have marked the replica failed: drop it
            yield Remap()
        raise
    return replies[0]
