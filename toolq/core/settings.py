"""Settings: one pydantic-settings object, env prefix ``TOOLQ_``, applied once.

Nested groups read ``TOOLQ_<GROUP>__<FIELD>`` (e.g. ``TOOLQ_LEASE__SECONDS=10``).
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from toolq.core.deps import Limits, is_dep_key
from toolq.core.redact import redact_url

log = logging.getLogger("toolq.settings")


class LeaseSettings(BaseModel):
    #: How long a claimed attempt stays owned without a renewal. Bounds how long
    #: a dead worker's write waits before it is verified.
    seconds: float = Field(default=15.0, gt=0.2, le=300)

    @property
    def renew_every(self) -> float:
        """Seconds between renewals (the App hands it to the worker's LeaseKeeper):
        a third of the lease, so a failed renewal gets another chance before it runs out."""
        return self.seconds / 3


class QueueSettings(BaseModel):
    calls: str = "toolq.calls"
    verify: str = "toolq.verify"
    #: Celery/kombu redeliver an unacknowledged message after this long. The
    #: ledger claim, not this, decides whether a delivery may call a tool, so
    #: it only needs to exceed the longest tool run to avoid wasted deliveries.
    visibility_timeout: int = Field(default=3600, ge=10)


class RecoverySettings(BaseModel):
    #: A ``queued`` operation no worker claimed within this is published again
    #: (backing off x2 each time): a lost message must not strand an operation.
    unclaimed_after: float = Field(default=60.0, gt=0)
    approval_timeout: float = Field(default=86400.0, gt=0)
    input_timeout: float = Field(default=86400.0, gt=0)
    #: Records of finished operations are kept this long.
    retention: int = Field(default=7 * 86400, ge=60)
    #: Attempts operators may add to one escalated operation ("retry" after a person
    #: confirmed nothing was written). Each retry follows a person's check at the
    #: provider; past a few, the write is settled as committed or not, not tried again.
    operator_retries: int = Field(default=3, ge=0, le=100)


class SchedulerSettings(BaseModel):
    batch: int = Field(default=500, ge=1, le=10000)
    #: The longest the scheduler sleeps when nothing is due (it is woken
    #: earlier when an earlier item is added).
    #: Capped at 10 s (``toolq.adapters.ledger.scripts.WAKE_HORIZON_MS``): the scripts wake a
    #: scheduler only for what falls due within that horizon.
    max_sleep: float = Field(default=5.0, gt=0, le=10)
    #: How long a batch the scheduler took stays hidden from other schedulers.
    hold: float = Field(default=30.0, gt=0)


#: The characters of an operation_ref besides letters and digits: safe in Redis
#: keys, URL paths and log lines without quoting.
REF_PUNCTUATION = "_.:/@#+=-"
REF_CHARS = "A-Za-z0-9" + REF_PUNCTUATION
#: A ref is segments joined by single "/", none empty, "." or "..": a client
#: resolving ``Location: /v1/operations/./a/b`` (urljoin, httpx, curl) would
#: reach the operation ``a/b`` instead. One segment, as a regex (no lookaround, so
#: that JSON Schema and pydantic's regex engine read it too).
_SEGMENT_CHARS = REF_CHARS.replace("/", "")
_SEGMENT = rf"(?:\.?[{_SEGMENT_CHARS.replace('.', '')}][{_SEGMENT_CHARS}]*|\.\.[{_SEGMENT_CHARS}]+)"
REF_RULE = (
    f"letters, digits and {REF_PUNCTUATION}, in segments joined by single '/'"
    ", none empty, '.' or '..'"
)

#: The brokers ``broker_url`` may name: kombu's AMQP (RabbitMQ), Redis and Redis
#: Sentinel transports.
BROKER_SCHEMES = ("amqp://", "amqps://", "pyamqp://", "redis://", "rediss://", "sentinel://")
SENTINEL_SCHEME = "sentinel://"
#: A Sentinel's port when its address names none (kombu's and Sentinel's default).
SENTINEL_PORT = 26379


@dataclass(frozen=True)
class SentinelUrl:
    """A ``sentinel://`` broker URL as kombu reads it: the Sentinels to ask, and the
    credentials and database of the primary they name (not of the Sentinels)."""

    sentinels: tuple[tuple[str, int], ...]
    username: str | None
    password: str | None
    db: int


def parse_sentinel_url(url: str) -> SentinelUrl:
    """``sentinel://[[user]:password@]host[:port][/db]``, one per Sentinel, joined by ``;``.

    Every address must carry the same credentials and database: kombu reads them from
    the one it is connected through, and moves to the next address when that Sentinel
    stops answering, so a password on the first alone would be lost at the first switch.
    Raises ValueError naming the address by its place, never its text: a password
    holding a ';' splits into two parts, neither of which redaction would recognise."""
    parts = [p for p in url.split(";") if p.strip()]
    if not parts:
        raise ValueError("broker_url names no Sentinel")
    sentinels = []
    shared: set[tuple[str | None, str | None, str]] = set()
    for i, part in enumerate(parts, 1):
        where = f"broker_url: address {i} of {len(parts)} (separated by ';')"
        fail = f"{where} is not sentinel://[[user]:password@]host[:port][/db]"
        if not part.startswith(SENTINEL_SCHEME):
            raise ValueError(f"{where} does not start with sentinel://")
        try:
            split = urlsplit(part)
            port = split.port or SENTINEL_PORT
        except ValueError:
            raise ValueError(fail) from None
        path = split.path.strip("/")
        if not split.hostname or split.query or split.fragment or not re.fullmatch(r"\d*", path):
            raise ValueError(fail)
        sentinels.append((split.hostname, port))
        user = unquote(split.username) if split.username else None
        password = unquote(split.password) if split.password is not None else None
        shared.add((user, password, path or "0"))
    if len(shared) > 1:
        raise ValueError(
            "broker_url: every sentinel:// address must carry the same password and "
            "database (kombu uses the one of the Sentinel it is connected through)"
        )
    user, password, db = shared.pop()
    return SentinelUrl(tuple(sentinels), user, password, int(db))


class RelaySettings(BaseModel):
    #: Outbox entries one relay reads, publishes and acknowledges per round.
    batch: int = Field(default=100, ge=1, le=10_000)
    #: How long a relay blocks on the outbox stream when it is empty (XREADGROUP
    #: BLOCK): it wakes at once for a new entry; the timeout only bounds how long
    #: a stop or a dead peer's entries wait.
    block: float = Field(default=2.0, gt=0, le=60)
    #: An entry another relay read and did not acknowledge within this is taken
    #: over (XAUTOCLAIM): that relay died between reading and acknowledging. Its
    #: message may have been published already; the claim refuses the copy.
    claim_after: float = Field(default=30.0, gt=0.1, le=3600)


class WorkerSettings(BaseModel):
    #: Celery task events (what Flower reads). Off, as in Celery: they cost a
    #: quarter of a prefork worker's throughput (issue 14, bench/RESULTS.md), and
    #: nothing toolq itself shows depends on them. `toolq worker -E` turns them on.
    task_events: bool = False
    #: Messages a worker process reserves per pool slot. 1 (the default): a message
    #: waits in the queue, not behind a busy worker's long call, and a worker that
    #: dies holds none beyond what it runs. 4 is Celery's default: less serial latency
    #: per call (a no-op write on prefork -c 2 went 0.87 -> 0.94 of bare Celery, a
    #: 100 ms tool on threads -c 16 0.925 -> 0.953 of its ceiling; bench/RESULTS.md),
    #: at the cost of calls queued behind long ones. A reserved message of a killed
    #: worker comes back after ``recovery.unclaimed_after``; nothing runs twice.
    prefetch_multiplier: int = Field(default=1, ge=1, le=64)
    #: Messages a worker process reserves beyond ``prefetch_multiplier`` per slot, so
    #: that the next message is already in the worker when a slot frees (fetching it
    #: then cost each 100 ms call on threads -c 16 ~2-4 ms; bench/RESULTS.md). At most
    #: this many messages wait behind busy slots. Unset: one per eight slots, none
    #: below eight (prefork -c 2: 0, threads -c 16: 2). 0: none, as before.
    reserve: int | None = Field(default=None, ge=0, le=1024)
    #: On a Redis/Valkey broker, messages one fetch may take: the BRPOP's and up to
    #: this many minus one more from the same list, registered as unacknowledged in
    #: the same script call (toolq.adapters.broker.transport), never beyond the
    #: prefetch (``prefetch_multiplier`` per slot plus ``reserve``). 0: kombu's own
    #: path, one message per BRPOP and a second round trip to register it (also what
    #: a kombu other than 5.7 gets, whatever this says).
    fetch_batch: int = Field(default=64, ge=0, le=64)
    #: On ``-P asyncio``, a toolq call that returned goes to Celery's request (ack,
    #: events) without Celery's tracer running the task a second time around what the
    #: loop already awaited, where nothing could see the tracer (no task signal
    #: receivers, no result, no links, tracer logs below INFO; the table in
    #: toolq.services.workers.lean). False: the tracer for every call, as before.
    lean_success: bool = True
    #: On ``-P asyncio``, the garbage collector's first threshold (``gc.set_threshold``)
    #: while the pool runs, instead of CPython's 700. 2,000 calls taken at once grow the
    #: heap from ~0.1 to ~0.5 M tracked objects in seconds; at 700 that growth ran 7
    #: full collections walking the whole heap, GIL held, on the loop (gc.callbacks in
    #: the worker); at 10,000 none. 2,000 httpx calls of 10 s, 7 interleaved rounds at
    #: load 2.5-5.5 (2026-12-02): worker CPU 7.1 -> 6.0 s, lower in every round; wall
    #: 16.5 -> 16.2 s, within the noise; RSS the same. ``gc.freeze`` at start did not
    #: help: the full collections follow the heap's growth. Cyclic garbage waits for
    #: up to this many more objects. 0: the collector is left alone.
    gc_threshold: int = Field(default=10_000, ge=0, le=1_000_000)
    #: Seconds between a worker's heartbeats (its entry in ``Keys.worker_nodes``).
    beat_s: float = Field(default=5.0, ge=0.1, le=60)
    #: A worker whose last heartbeat is older than this is not live: ``toolq status``,
    #: the API and the console list it as gone, not beside the live ones (three beats
    #: missed by default; tests choose shorter ones). At least two beats.
    alive_s: float = Field(default=15.0, ge=0.5, le=3600)
    #: How long a delivery keeps trying to claim its attempt while the ledger's server
    #: is away, from the first failure. Past it the delivery goes back to its queue,
    #: the tool not called (``LedgerAway``), so each copy of a message waits this long
    #: first: a redelivery is not a hot loop. At least 0.1 s: one retry (the first
    #: backoff is 50 ms).
    claim_patience_s: float = Field(default=10.0, ge=0.1, le=3600)
    #: How long a worker keeps trying to record an outcome (or give a claim back)
    #: while the ledger's server is away, from the first failure. Past it the delivery
    #: goes back to its queue (``RecordAway``), and the lease's expiry settles the
    #: attempt: a write is verified, a read runs again.
    record_patience_s: float = Field(default=60.0, ge=0.1, le=3600)

    @model_validator(mode="after")
    def _two_beats(self) -> WorkerSettings:
        if self.alive_s < 2 * self.beat_s:
            raise ValueError(
                f"worker.alive_s ({self.alive_s:g}) must be at least two beats "
                f"(2 x worker.beat_s = {2 * self.beat_s:g}): a live worker would look gone"
            )
        return self


class ClientSettings(BaseModel):
    #: On its first use in a process, ``tq.aio`` takes the objects alive then (the
    #: imported Celery, kombu, pydantic and the app: ~75k objects that live as long as
    #: the process) out of the garbage collector's full walks (``gc.freeze``). Such a
    #: walk held a 1,000-call event loop 26-63 ms; after it, gen-2 collections
    #: took 0-13 ms (bench/RESULTS.md, "Async client"). Off: the collector is left alone.
    freeze_heap: bool = True


_REF_PATTERN = f"^{_SEGMENT}(?:/{_SEGMENT})*$"
_REF_RE = re.compile(_REF_PATTERN)


class LimitSettings(BaseModel):
    max_args_bytes: int = Field(default=256 * 1024, ge=64)
    #: The largest result (its JSON, in bytes) the ledger keeps, a tool's, a
    #: verifier's or an operator's: past it, a read's attempt fails
    #: (``RESULT_TOO_LARGE``, escalated: the tool needs a fix) and a write goes to
    #: verification (it ran; the lookup's result is kept if it fits). Every result is
    #: held in the server's memory for ``recovery.retention`` and sent whole to the agent.
    max_result_bytes: int = Field(default=1024 * 1024, ge=64)
    #: Redis connections one process opens at most; more callers wait for one.
    max_connections: int = Field(default=256, ge=4, le=10_000)
    #: The longest operation_ref (and call_id) any edge accepts: the client,
    #: the HTTP API and MCP all check with :meth:`is_ref`. At most 200
    #: because the envelope contract carries refs of up to 200 characters; at
    #: least 36 so the refs toolq mints itself (``mcp_`` + 32 hex) fit.
    max_ref_length: int = Field(default=200, ge=36, le=200)

    @property
    def ref_pattern(self) -> str:
        """An acceptable ref's shape, anchored: a JSON Schema ``pattern``, beside
        ``maxLength`` :attr:`max_ref_length` (a length in the pattern would need a
        lookahead, which not every schema reader takes)."""
        return _REF_PATTERN

    def is_ref(self, value: object) -> bool:
        """Whether ``value`` is an acceptable operation_ref: the one rule every edge
        (``tq``, ``tq.aio``, the CLI, HTTP, MCP, the integrations) applies."""
        return (
            isinstance(value, str)
            and 0 < len(value) <= self.max_ref_length
            and _REF_RE.fullmatch(value) is not None
        )


def seed_urls(url: str) -> list[str]:
    """A Cluster's seed nodes, one URL each: ``redis://[user:password@]a:7000,b:7001[/0][?...]``
    gives ``redis://[user:password@]a:7000[/0][?...]`` and the same for ``b:7001``. The
    scheme (``rediss://``: TLS), credentials, database and options of the one URL apply
    to every seed. A URL without a comma is its own only seed. ``ValueError`` (its
    message redacted) for an empty seed or a list of whole URLs."""
    scheme, sep, rest = url.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    tail = rest[len(authority) :]
    userinfo, at, hosts = authority.rpartition("@")
    if "," not in hosts:
        return [url]
    seeds = [h.strip() for h in hosts.split(",")]
    if "://" in rest or any(not h or "@" in h for h in seeds):
        raise ValueError(
            "redis_url lists a Cluster's seed nodes as one URL with comma-separated "
            "host:port pairs (redis://[user:password@]a:7000,b:7001,c:7002)"
        )
    return [f"{scheme}{sep}{userinfo}{at}{seed}{tail}" for seed in seeds]


def seed_nodes(url: str) -> list[tuple[str, int]]:
    """The (host, port) of each seed :func:`seed_urls` finds in ``url``, in its order."""
    out = []
    for seed in seed_urls(url):
        parts = urlsplit(seed)
        out.append((parts.hostname or "localhost", parts.port or 6379))
    return out


#: What a ledger's key prefix may be: letters, digits, ``_``, ``.`` and ``-``.
PREFIX_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"


class ToolqSettings(BaseSettings):
    #: ``hide_input_in_errors``: pydantic's message quotes the value refused
    #: (``input_value='redis://:password@...'``) after toolq's redacted words.
    model_config = SettingsConfigDict(
        env_prefix="TOOLQ_", env_nested_delimiter="__", extra="ignore", hide_input_in_errors=True
    )

    #: The ledger's server. On a Cluster (``cluster``), one URL may list several seed
    #: nodes, comma-separated: ``redis://[user:password@]a:7000,b:7001,c:7002``, the
    #: credentials, TLS (``rediss://``) and options applying to every seed
    #: (:func:`seed_urls`); a client starts from any seed that answers, so one node
    #: down does not stop a process from starting.
    redis_url: SecretStr | None = None
    #: The Celery broker, when it is not the ledger's Redis (``amqp://``/``pyamqp://``
    #: for RabbitMQ, or a Redis/Valkey of its own: ``redis://``, or ``sentinel://`` behind
    #: Sentinel with ``broker_master_name``). Unset: the ledger's scripts push
    #: each message to its queue in the same atomic call as the transition. Set
    #: (**outbox mode**): the scripts append it to the ledger's outbox stream instead,
    #: and ``toolq relay`` publishes it to this broker (docs/brokers.md).
    broker_url: SecretStr | None = None
    #: A ``sentinel://`` ``broker_url`` (a Redis/Valkey broker behind Sentinel): the
    #: name its Sentinels monitor the primary under (``sentinel monitor <name> ...``).
    #: Required with one; any other broker ignores it. kombu's ``master_name`` option.
    broker_master_name: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.:-]{1,128}$")
    #: The ledger's key prefix, inside every key's hash tag (``{toolq}:op:<ref>``): a
    #: brace would end the tag early (a Cluster would scatter one operation's keys),
    #: and an empty one names no ledger.
    prefix: str = Field(default="toolq", pattern=PREFIX_PATTERN)
    #: ``fsync``: a claim is on disk before its tool is called, and a submit before
    #: it is acknowledged, so a power loss cannot undo a claim and run the write again
    #: (the ledger sends ``WAITAOF`` after each, in the same round trip). It needs a
    #: server with ``appendonly yes`` and ``appendfsync always`` (what ``toolq up`` and
    #: docker-compose.yml run); toolq reads the server's setting and warns once per
    #: process when it cannot hold (AOF off, or everysec: on Valkey 9.1 WAITAOF then
    #: answers before the fsync). ``none``: trust the server's own persistence.
    #: Cost and measurements: README "What it guarantees", bench/RESULTS.md "Durability".
    durability: Literal["fsync", "none"] = "fsync"
    #: **Cells mode** (issue 18, docs/cells.md): the ledger is split into this many
    #: cells, each under its own hash tag (``toolq.core.cells.cell_of`` of the ref picks
    #: one), so that a Valkey Cluster can spread them. Fixed for the ledger's life:
    #: the first process records it in ``Keys.meta`` and any other value is refused.
    #: Unset: one tag for the whole ledger, as always (a ledger written that way is
    #: moved into cells by ``toolq cells migrate``). At most 16384
    #: (``toolq.core.cells.MAX_CELLS``: Cluster's slots).
    cells: int | None = Field(default=None, ge=1, le=16384)
    #: ``redis_url`` names a node of a Valkey/Redis Cluster: the ledger's client is a
    #: cluster client (``toolq.adapters.ledger.cluster.LedgerCluster``). Needs ``cells`` (one
    #: tag would be one slot: one node) and outbox mode (``broker_url``: Celery cannot
    #: use a Cluster as its broker, and the ledger's scripts cannot push to the
    #: queues' untagged lists there). With ``durability=fsync`` each write's WAITAOF
    #: goes to the node that ran it, one more round trip. The sync client, workers,
    #: the scheduler and the relay; ``tq.aio`` refuses it for now.
    cluster: bool = False
    lease: LeaseSettings = LeaseSettings()
    queues: QueueSettings = QueueSettings()
    recovery: RecoverySettings = RecoverySettings()
    scheduler: SchedulerSettings = SchedulerSettings()
    relay: RelaySettings = RelaySettings()
    limits: LimitSettings = LimitSettings()
    worker: WorkerSettings = WorkerSettings()
    client: ClientSettings = ClientSettings()
    #: Limits per dependency key (issue 28, README "Limits per dependency"), over those
    #: declared in code (``tq.limit``) field by field:
    #: ``TOOLQ_DEPENDENCIES='{"stripe": {"rate": "20/s", "concurrency": 5}}'``.
    dependencies: dict[str, Limits] = {}

    @field_validator("dependencies")
    @classmethod
    def _dep_keys(cls, value: dict[str, Limits]) -> dict[str, Limits]:
        for key in value:
            if not is_dep_key(key):
                raise ValueError(f"dependencies: {key[:80]!r} is not a dependency key")
        return value

    @field_validator("redis_url")
    @classmethod
    def _scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            url = value.get_secret_value()
            if not url.startswith(("redis://", "rediss://", "unix://")):
                raise ValueError(
                    f"redis_url must start with redis://, rediss:// or unix://: {redact_url(url)}"
                )
            _check_address(url)
        return value

    @field_validator("broker_url", "broker_master_name", mode="before")
    @classmethod
    def _empty_broker(cls, value: object) -> object:
        # An empty TOOLQ_BROKER_URL (docker-compose.yml passes ``${TOOLQ_BROKER_URL:-}``)
        # means none: the ledger's Redis is the broker.
        if value == "" or (isinstance(value, SecretStr) and value.get_secret_value() == ""):
            return None
        return value

    @field_validator("broker_url")
    @classmethod
    def _broker_scheme(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            url = value.get_secret_value()
            if not url.startswith(BROKER_SCHEMES):
                schemes = ", ".join(BROKER_SCHEMES)
                raise ValueError(f"broker_url must start with {schemes}: {redact_url(url)}")
            if url.startswith(SENTINEL_SCHEME):
                parse_sentinel_url(url)
        return value

    def model_post_init(self, context: object, /) -> None:
        say_stray_settings(os.environ)

    @model_validator(mode="after")
    def _master_name(self) -> ToolqSettings:
        if self.sentinel is not None and self.broker_master_name is None:
            raise ValueError(
                "a sentinel:// broker_url needs broker_master_name (TOOLQ_BROKER_MASTER_NAME): "
                "the name its Sentinels monitor the broker's primary under"
            )
        return self

    @model_validator(mode="after")
    def _cluster_needs(self) -> ToolqSettings:
        seeds = seed_urls(self.redis_url.get_secret_value()) if self.redis_url else []
        if len(seeds) > 1 and not self.cluster:
            raise ValueError(
                "redis_url lists several nodes, which only a Cluster client takes: set "
                "TOOLQ_CLUSTER=1 for a Cluster, or name one server"
            )
        if len(seeds) > 1 and seeds[0].startswith("unix://"):
            raise ValueError("redis_url: a Cluster's seeds are redis:// or rediss:// nodes")
        if self.cluster:
            if self.cells is None:
                raise ValueError(
                    "cluster=true needs cells (e.g. TOOLQ_CELLS=256): the single-tag "
                    "ledger lives in one slot, on one node"
                )
            if self.broker_url is None:
                raise ValueError(
                    "cluster=true needs outbox mode (TOOLQ_BROKER_URL): Celery cannot use "
                    "a Cluster as its broker (docs/brokers.md)"
                )
        return self

    @property
    def outbox(self) -> bool:
        """Outbox mode: messages go through the ledger's outbox and a relay (``broker_url``)."""
        return self.broker_url is not None

    @property
    def sentinel(self) -> SentinelUrl | None:
        """The Sentinels of a ``sentinel://`` broker URL (None: another broker, or none)."""
        if self.broker_url is None:
            return None
        url = self.broker_url.get_secret_value()
        return parse_sentinel_url(url) if url.startswith(SENTINEL_SCHEME) else None

    @property
    def broker(self) -> str | None:
        """The Celery broker's URL: ``broker_url``, else the ledger's (None: not known yet)."""
        if self.broker_url is not None:
            return self.broker_url.get_secret_value()
        return self.redis_url.get_secret_value() if self.redis_url else None

    @property
    def safe_broker_url(self) -> str:
        return redact_url(self.broker_url.get_secret_value()) if self.broker_url else "(ledger)"

    @property
    def url(self) -> str:
        if self.redis_url is None:
            raise ValueError("no Redis URL: pass redis_url or set TOOLQ_REDIS_URL")
        return self.redis_url.get_secret_value()

    @property
    def safe_url(self) -> str:
        return redact_url(self.url) if self.redis_url else "(none)"


def stray_nested(environ: Mapping[str, str]) -> list[str]:
    """What the environment's ``TOOLQ_<GROUP>__<NAME>`` variables name that this toolq
    does not read, a line each: pydantic passes over them (``extra="ignore"``), so a
    typo (``TOOLQ_LEASE__SECONDZ``, ``TOOLQ_WORKERS__RESERVE``) left the default in
    force without a word. Only the nested form: toolq's other ``TOOLQ_*`` names (the
    API's, the console's, the CLI's) are read in other places."""
    groups = {
        name: field.annotation.model_fields
        for name, field in ToolqSettings.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    }
    lines = []
    for key in sorted(environ):
        if not key.upper().startswith("TOOLQ_") or "__" not in key:
            continue
        group, _, name = key[len("TOOLQ_") :].partition("__")
        fields = groups.get(group.lower())
        if fields is None:
            lines.append(
                f"{key} is not a setting toolq reads: no settings group {group.lower()!r} "
                f"(the groups: {', '.join(sorted(groups))})"
            )
        elif name.lower() not in fields:
            lines.append(
                f"{key} is not a setting toolq reads: {group.lower()} has "
                f"{', '.join(sorted(fields))}"
            )
    return lines


#: The top-level ``TOOLQ_<NAME>`` variables toolq reads outside these settings (the CLI,
#: the logs, the metrics, the examples): a test keeps the list true to the source.
OTHER_NAMES = frozenset(
    {"APP", "STATE_DIR", "LOG_FORMAT", "METRICS_HOST", "EXAMPLE_PROVIDER_URL",
     "EXAMPLE_PROVIDER_TIMEOUT"}
)  # fmt: skip
#: The prefixes of the API's and the console's own settings (read in toolq.edges).
OTHER_PREFIXES = ("API_", "CONSOLE_")
#: How close (difflib's ratio) an unknown name must be to a known one to be said: a
#: typo (``TOOLQ_REDIS_ULR``, ``TOOLQ_PREFX``), not a name of the user's own
#: (``TOOLQ_TEST_REDIS_URL`` is 0.78 from ``REDIS_URL``).
NEAR = 0.85


def stray_top(environ: Mapping[str, str]) -> list[str]:
    """The environment's top-level ``TOOLQ_<NAME>`` variables that no part of toolq
    reads and that are a near miss of one it does, a line each naming that one.
    pydantic passes over an unknown name, so ``TOOLQ_PREFX=billing`` put an app on the
    default prefix (another app's ledger) without a word. A name not near any of
    toolq's (a deployment's own ``TOOLQ_*``) is left alone."""
    known = {name.upper() for name in ToolqSettings.model_fields} | OTHER_NAMES
    lines = []
    for key in sorted(environ):
        name = key.upper()[len("TOOLQ_") :]
        if not key.upper().startswith("TOOLQ_") or "__" in key or not name:
            continue
        if name in known or name.startswith(OTHER_PREFIXES):
            continue
        near = difflib.get_close_matches(name, sorted(known), n=1, cutoff=NEAR)
        if near:
            lines.append(f"{key} is not a setting toolq reads: did you mean TOOLQ_{near[0]}?")
    return lines


#: The stray variables said already: once a process, however many settings are read.
_stray_said: set[str] = set()


def say_stray_settings(environ: Mapping[str, str]) -> None:
    """Warn once a process of each line :func:`stray_nested` and :func:`stray_top` find."""
    for line in [*stray_nested(environ), *stray_top(environ)]:
        if line not in _stray_said:
            _stray_said.add(line)
            log.warning("%s", line)


def _check_address(url: str) -> None:
    """Each seed's host and port readable, its database a number (``ValueError``,
    redacted, if not): else the first call fails with redis-py's bare "Port out of
    range 0-65535", or a path that is not a number is database 0 without a word."""
    for seed in seed_urls(url):  # its own ValueError says what is wrong, redacted
        if seed.startswith("unix://"):
            continue
        try:
            parts = urlsplit(seed)
            parts.port  # noqa: B018 (raises for a port out of range, or not a number)
        except ValueError:  # not its words: they quote the "port", maybe a password
            raise ValueError(
                f"redis_url: a host or port cannot be read (a port is 0-65535; an IPv6 "
                f"host is in brackets): {redact_url(url)}"
            ) from None
        db = unquote(parts.path).replace("/", "")
        if db and not db.isdecimal():  # redis-py would take it for database 0, silently
            raise ValueError(
                f"redis_url: the database (its path) must be a number: {redact_url(url)}"
            )


def settings_problem(exc: BaseException) -> str | None:
    """An invalid-settings error (pydantic's ValidationError of :class:`ToolqSettings`) as
    one line per problem, named by the environment variable that sets it and without
    the values given (a URL may hold a password); None for any other exception. What a
    bad ``TOOLQ_*`` variable gets at the CLI instead of a traceback."""
    if isinstance(exc, SettingsError):  # a variable of a structured field that is not JSON
        field = re.search(r'field "([^"]+)"', str(exc))
        name = f"TOOLQ_{field.group(1).upper()}" if field else "a TOOLQ_* variable"
        return f"invalid settings: {name}: not valid JSON"
    if type(exc).__name__ != "ValidationError" or getattr(exc, "title", None) != "ToolqSettings":
        return None
    lines = []
    for e in exc.errors(include_url=False, include_input=False):  # type: ignore[attr-defined]
        loc = "__".join(str(part) for part in e.get("loc", ()))
        msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
        lines.append(f"TOOLQ_{loc.upper()}: {msg}" if loc else msg)
    return "invalid settings: " + "; ".join(lines)
