"""Every Redis key and channel toolq uses, in one place.

The ledger's keys all start with one hash tag made of the settings prefix:
``Keys(prefix="toolq")`` names ``{toolq}:op:<ref>``, ``{toolq}:due``,
``{toolq}:idx:<tool>:<state>``, ... Redis Cluster hashes only the part in
braces, so every key a ledger script touches lives in one slot, as a script
requires. Without cells that is one tag (one slot) for the whole deployment.

**Cells** (:mod:`toolq.core.cells`): ``Keys(prefix="toolq", cell=42)`` names the
same keys under the cell's own tag, ``{toolq:c042}:op:<ref>``, ``{toolq:c042}:due``,
... A cell is a slot of its own (mostly: two tags can share a slot) that Valkey
Cluster can place on any node and move. The prefix stays inside the braces, so
two deployments on one cluster hash their cells independently: cell 42 of one
and cell 42 of the other are different slots, and moving one never moves the
other. Never tag per operation: a script that moves an operation also writes
the due set and the state indexes, which must share the operation's slot.

The scripts receive these names as KEYS (:mod:`toolq.adapters.ledger.scripts`); the two
prefixes below (:attr:`Keys.op_prefix`, :attr:`Keys.index_prefix`) exist for
the keys a script can only name from data it reads.

Celery's own keys (the queue lists, ``unacked``) are kombu's: named by the
queue settings and by kombu, they carry no prefix and no tag.
"""

from __future__ import annotations

from dataclasses import dataclass

#: kombu's Redis transport keeps every delivered, not yet acknowledged message in
#: this hash until it is acked or restored (``kombu.transport.redis.Channel.unacked_key``,
#: whose default toolq does not change). kombu names it, not toolq.
KOMBU_UNACKED = "unacked"

#: ... and this sorted set indexes it by delivery time (``unacked_index_key``): a
#: worker's last ledger call for a delivery acknowledges it in both (toolq.adapters.ledger.scripts).
KOMBU_UNACKED_INDEX = "unacked_index"

#: The consumer group every relay reads :attr:`Keys.outbox` in.
OUTBOX_GROUP = "relays"

#: :attr:`Keys.notify_steps` is :attr:`Keys.notify` plus this.
STEPS_SUFFIX = ":steps"


#: A cell's name inside its tag: ``c`` and the number, three digits at least, so
#: that the names of 256 or 1000 cells all have one width (``c007``, ``c255``).
CELL_NAME = "c{:03d}"


@dataclass(frozen=True)
class Keys:
    prefix: str = "toolq"
    #: The ledger cell these keys belong to (:func:`toolq.core.cells.cell_of`); None:
    #: the single-tag layout of one server, what every deployment has today.
    cell: int | None = None

    def __post_init__(self) -> None:
        if self.cell is not None and (isinstance(self.cell, bool) or self.cell < 0):
            raise ValueError(f"a cell is a number >= 0, got {self.cell!r}")

    @property
    def tag(self) -> str:
        """The hash tag every ledger key (and the notify channel) starts with:
        ``{<prefix>}``, or ``{<prefix>:c<cell>}`` for a cell's keys."""
        if self.cell is None:
            return "{" + self.prefix + "}"
        return "{" + self.prefix + ":" + CELL_NAME.format(self.cell) + "}"

    @property
    def op_prefix(self) -> str:
        """``op(ref)`` is this plus the ref (CLAIM_DUE reads refs from the due set)."""
        return f"{self.tag}:op:"

    def op(self, ref: str) -> str:
        """Hash: the operation's record, its history entries included (``h1``..``h<hn>``)."""
        return self.op_prefix + ref

    @property
    def due(self) -> str:
        """Sorted set: operation ref -> the next time the scheduler must look at it (ms)."""
        return f"{self.tag}:due"

    @property
    def wake(self) -> str:
        """List the scheduler blocks on; pushed when an earlier due item is added."""
        return f"{self.tag}:wake"

    @property
    def sleep_until(self) -> str:
        """When a sleeping scheduler plans to wake (ms); earlier due items wake it."""
        return f"{self.tag}:sleep_until"

    @property
    def notify(self) -> str:
        """Pub/Sub channel: ``<state> <ref>`` when an operation settles (``tq.wait``).

        A channel, not a key (scripts get it as an argument); tagged all the
        same, so that a sharded channel per cell can keep the name's shape.
        """
        return f"{self.tag}:notify"

    @property
    def notify_steps(self) -> str:
        """Pub/Sub channel: every other state entered, and tools' progress (``tq.aio.watch``).

        Apart from :attr:`notify` so that a process that only waits hears one
        notice per call; the scripts name it as ``NOTIFY .. STEPS_SUFFIX``.
        """
        return self.notify + STEPS_SUFFIX

    @property
    def outbox(self) -> str:
        """Stream: Celery messages a relay publishes to the broker (outbox mode only).

        Entries are ``queue``/``message`` pairs; relays read it in the consumer group
        :data:`OUTBOX_GROUP`, and delete an entry once the broker confirmed it.
        """
        return f"{self.tag}:outbox"

    @property
    def relays(self) -> str:
        """Hash: relay id -> its last beat (JSON: ms, published, lag; toolq.services.relay)."""
        return f"{self.tag}:relays"

    @property
    def tools(self) -> str:
        """Set: every tool the ledger has seen."""
        return f"{self.tag}:tools"

    @property
    def stats(self) -> str:
        """Hash of counters: ``<tool>|<counter>``."""
        return f"{self.tag}:stats"

    @property
    def index_prefix(self) -> str:
        """``index(tool, state)`` is this plus ``<tool>:<state>``.

        The scripts learn a record's tool and state only by reading it, so they
        build index names from this prefix (``IDX .. tool .. ':' .. state``);
        the contract tests check both spellings name the same keys.
        """
        return f"{self.tag}:idx:"

    def index(self, tool: str, state: str) -> str:
        """Sorted set: refs of ``tool`` in ``state``, scored by when they entered it (ms)."""
        return f"{self.index_prefix}{tool}:{state}"

    @property
    def cell_lease(self) -> str:
        """String: the scheduler holding this cell (cells mode), expiring unless renewed."""
        return f"{self.tag}:cell_lease"

    @property
    def schedulers(self) -> str:
        """Hash: scheduler id -> last heartbeat (ms)."""
        return f"{self.tag}:schedulers"

    @property
    def workers(self) -> str:
        """Hash: queue -> last heartbeat (ms) of any worker consuming it
        (toolq.adapters.liveness)."""
        return f"{self.tag}:workers"

    @property
    def worker_nodes(self) -> str:
        """Hash: worker node name -> its last beat, pid, pool and queues (JSON,
        toolq.adapters.liveness)."""
        return f"{self.tag}:worker_nodes"

    @property
    def meta(self) -> str:
        """Hash: what is fixed for the ledger's life, recorded at first use: ``cells``, and
        ``format``, the stored format (:mod:`toolq.decisions.formats`, ``toolq migrate``).

        Deployment-wide: read under :class:`Keys` without a cell (one slot)."""
        return f"{self.tag}:meta"

    @property
    def series(self) -> str:
        """Hash: sample time (ms) -> the counts then (JSON; toolq.services.scheduler.series)."""
        return f"{self.tag}:series"

    @property
    def series_hourly(self) -> str:
        """Hash: the hour's start (ms) -> the first sample written in it (JSON; the coarse
        tier of toolq.services.scheduler.series, kept 8 days)."""
        return f"{self.tag}:series:1h"

    @property
    def series_tools(self) -> str:
        """Hash: sample time (ms) -> each tool's counters then (JSON; the trust figures'
        minute tier of toolq.services.scheduler.series, kept 2 hours)."""
        return f"{self.tag}:series:tools"

    # ------------------------------------------------------- limits per dependency
    # (toolq.core.deps: their fields and who writes them)

    @property
    def dep_prefix(self) -> str:
        """``dep(key)`` is this plus the dependency key (scripts that read a record's
        ``dep`` field build the names from it)."""
        return f"{self.tag}:dep:"

    def dep(self, key: str) -> str:
        """Hash: one dependency key's limiter (rate, shared backoff, breaker, counters)."""
        return self.dep_prefix + key

    def dep_slots(self, key: str) -> str:
        """Sorted set: refs holding one of the key's concurrency slots -> lease end (ms)."""
        return self.dep_prefix + key + ":slots"

    def dep_waiting(self, key: str) -> str:
        """Sorted set: refs the key holds back (limited) -> their not_before (ms)."""
        return self.dep_prefix + key + ":waiting"

    @property
    def deps(self) -> str:
        """Sorted set: every dependency key the ledger has limited -> its last use (ms)."""
        return f"{self.tag}:deps"
