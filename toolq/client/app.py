"""``App``: what workers and the scheduler need to run one toolq deployment.

Settings, the tool registry, the clock, and the connections made from them
(Redis, the ledger, the Celery app with toolq's two tasks registered, the
message factory, the worker runtime, the notice subscription), each made
lazily and once. The client facade (:class:`toolq.client.queue.ToolQueue`) holds an
App; processes (``toolq worker``, ``toolq scheduler``) run on it.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from celery import Celery
from pydantic import SecretStr, ValidationError

from toolq.adapters import liveness
from toolq.adapters.broker.app import broker_config, make_celery
from toolq.adapters.broker.messages import MessageFactory
from toolq.adapters.ledger import Ledger, lists
from toolq.adapters.ledger.aio import AsyncLedger
from toolq.adapters.ledger.aio_batch import MAX_BATCH
from toolq.adapters.notify import Notifier
from toolq.adapters.stack_state import discover_redis_url, recorded_mode, with_mode
from toolq.core import errors
from toolq.core.deps import Limits, declared, limits_table
from toolq.core.keys import Keys
from toolq.core.redact import redact_url
from toolq.core.settings import ToolqSettings
from toolq.core.states import State
from toolq.core.tools import Registry, ToolOptions, fingerprint, jsonable
from toolq.decisions import operations
from toolq.decisions.recovery import operator, outcome
from toolq.decisions.recovery.transition import Transition
from toolq.services.tasks.celery import register_tasks
from toolq.services.tasks.run import Runtime
from toolq.topology import Topology, topology_for
from toolq.topology.ledger import async_ledger_for, ledger_for

#: Tools whose message builders :meth:`App.outbound_for` keeps (beyond: made each time).
MAX_BOUND_TOOLS = 1024
#: Connections of an asyncio-pool worker's loop to the ledger's server: its claims,
#: renewals and records are short commands, shared by every call in flight.
AIO_WORKER_CONNECTIONS = 32
#: How long a command waits for a free pooled connection before ConnectionError.
POOL_TIMEOUT_S = 20.0


class App:
    """One deployment's settings, tools and connections (thread-safe, lazy)."""

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        settings: ToolqSettings | None = None,
        name: str = "toolq",
        clock: Callable[[], float] = time.time,
    ) -> None:
        settings = settings or ToolqSettings()
        if redis_url is not None:
            settings = settings.model_copy(update={"redis_url": SecretStr(redis_url)})
            ToolqSettings.model_validate(settings.model_dump())  # same checks as the env path
        self.settings = settings
        self.name = name
        self.clock = clock
        self.registry = Registry()
        #: Tools the previous status snapshot saw, so the next one needs one round trip.
        self.seen_tools: frozenset[str] = frozenset()
        self._lock = threading.RLock()
        self._topology: Topology | None = None
        self._redis: redis.Redis | None = None
        self._ledger: Ledger | None = None
        self._celery: Celery | None = None
        self._messages: MessageFactory | None = None
        self._runtime: Runtime | None = None
        self._notifier: Notifier | None = None
        self._liveness: liveness.Liveness | None = None
        self._outbound_for: dict[str, outcome.Messages] = {}

    def __repr__(self) -> str:
        url = self.settings.safe_url if self.settings.redis_url else "(no url yet)"
        return f"<App {self.name} {url} tools={len(self.registry)}>"

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    @property
    def redis_url(self) -> str:
        if self.settings.redis_url is None:
            found = discover_redis_url()
            if found is None:
                raise errors.RequestRefused(
                    "no Redis URL: pass redis_url=, set TOOLQ_REDIS_URL, or run `toolq up` "
                    "in this directory"
                )
            settings = self.settings.model_copy(update={"redis_url": SecretStr(found)})
            if not os.environ.get("TOOLQ_REDIS_URL"):  # the stack's: its mode too
                settings = with_mode(settings, recorded_mode())
            self.settings = settings
            self._topology = None  # chosen again, on the mode that came with it
        return self.settings.url

    @property
    def topology(self) -> Topology:
        """The deployment's layout, nodes and publishing (:mod:`toolq.topology`), chosen
        once the mode is settled: a server ``toolq up`` recorded brings its mode."""
        with self._lock:
            if self._topology is None:
                self._settle()
                self._topology = topology_for(self.settings)
            return self._topology

    def _settle(self) -> None:
        """Find the server now if ``toolq up`` recorded it: the number of cells comes with
        it (a refusal is raised again by the first call that needs the server)."""
        with contextlib.suppress(errors.RequestRefused):
            self.redis_url  # noqa: B018

    @property
    def redis(self) -> redis.Redis:
        with self._lock:
            if self._redis is None:
                url = self.redis_url  # first: found in .toolq/, it brings the mode
                self._redis = self.topology.make_redis(url, self._pool_options())
            return self._redis

    def async_redis(
        self, *, max_connections: int, pool_timeout: float | None = POOL_TIMEOUT_S
    ) -> aioredis.Redis:
        """A new ``redis.asyncio`` client, pooled as :attr:`redis` is, of at most
        ``max_connections`` (never more than the settings allow); a command waits for a
        free connection at most ``pool_timeout`` seconds (None: as long as it takes).

        Not kept here: it belongs to the event loop it first connects on, so
        ``tq.aio`` makes one per loop (and closes it). On a Cluster
        (:class:`~toolq.topology.nodes.ClusterNodes`): ``max_connections`` per node.
        """
        url = self.redis_url  # first: found in .toolq/, it brings the mode
        options = self._pool_options()
        options["max_connections"] = min(options["max_connections"], max_connections)
        options["timeout"] = pool_timeout
        # No CLIENT SETINFO on connect: redis-py reads its version from the package
        # metadata for it, each time (most of a new connection's client-side cost).
        options["driver_info"] = None
        return self.topology.make_async_redis(url, options)

    def _pool_options(self) -> dict[str, Any]:
        # A blocking pool: past max_connections a caller waits for a free
        # connection instead of failing with "Too many connections".
        return {
            "max_connections": self.settings.limits.max_connections,
            "timeout": POOL_TIMEOUT_S,
            "socket_connect_timeout": 5,
            # No socket_keepalive: redis-py 8 turns it on for TCP by default, and the
            # connection class of a unix:// URL refuses it (a TypeError at first use).
            "health_check_interval": 30,
        }

    @property
    def ledger(self) -> Ledger:
        with self._lock:
            if self._ledger is None:
                client = self.redis  # first: it may bring the mode (redis_url)
                t = self.topology
                ledger = ledger_for(t, client, self.settings.durability)
                if t.layout.check_meta_first:  # else at the first submit: no round trip here
                    ledger.record_cells()
                self._ledger = ledger
            return self._ledger

    @property
    def celery(self) -> Celery:
        """The Celery app: ``celery -A module:celery_app worker`` serves every toolq queue."""
        with self._lock:
            if self._celery is None:
                self._celery = self._make_celery()
            return self._celery

    @property
    def messages(self) -> MessageFactory:
        with self._lock:
            if self._messages is None:
                q = self.settings.queues
                self._messages = MessageFactory(self.celery, q.calls, q.verify)
            return self._messages

    @property
    def outbound(self) -> outcome.Messages:
        """The message builders the recovery decisions take."""
        m = self.messages
        return outcome.Messages(run=m.run, verify=m.verify)

    def outbound_for(self, tool: str) -> outcome.Messages:
        """:attr:`outbound` for one tool's operations: their messages name the tool
        where Flower shows a task's arguments
        (:class:`toolq.adapters.broker.messages.MessageFactory`)."""
        found = self._outbound_for.get(tool)
        if found is None:
            m = self.messages
            found = outcome.Messages(
                run=functools.partial(m.run, tool=tool),
                verify=functools.partial(m.verify, tool=tool),
            )
            if len(self._outbound_for) < MAX_BOUND_TOOLS:  # tool names read from the ledger
                self._outbound_for[tool] = found
        return found

    @property
    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = Runtime(
                    self.registry,
                    self.ledger,
                    self.outbound,
                    self.policy,
                    int(self.settings.lease.seconds * 1000),
                    self.clock,
                    renew_every=self.settings.lease.renew_every,
                    claim_patience_s=self.settings.worker.claim_patience_s,
                    record_patience_s=self.settings.worker.record_patience_s,
                    messages_for=self.outbound_for,
                )
                # cells: each cell limits the calls it holds, with its share of the limits
                share = self.topology.layout.cells or 1
                self._runtime.dep_limits = limits_table(self.dependencies(), share)
            return self._runtime

    def dependencies(self) -> dict[str, Limits]:
        """Every declared dependency key's limits: ``tq.limit``'s under the settings'."""
        return declared(self.registry.limits, self.settings.dependencies)

    @property
    def policy(self) -> outcome.Policy:
        r = self.settings.recovery
        return outcome.Policy(
            unclaimed_after_ms=int(r.unclaimed_after * 1000),
            approval_timeout_ms=int(r.approval_timeout * 1000),
            input_timeout_ms=int(r.input_timeout * 1000),
            retention_s=r.retention,
            operator_retries=r.operator_retries,
            max_result_bytes=self.settings.limits.max_result_bytes,
        )

    @property
    def notifier(self) -> Notifier:
        with self._lock:
            if self._notifier is None:
                self._notifier = self.topology.notices.notifier(self.redis, self.notify_channels())
            return self._notifier

    def cell_keys(self) -> list[Keys] | None:
        """Cells mode: the keys of every cell (what lists read and merge); else None."""
        layout = self.topology.layout
        return None if layout.cells is None else layout.every_cell()

    def notify_channels(self, steps: bool = False) -> list[str]:
        """The channels the ledger's scripts announce settled states on (``steps``: the
        other states and progress): one per cell in cells mode."""
        return self.topology.layout.channels(steps)

    # ------------------------------------------------------------------ what clients ask for
    # The sync client (tq) and the async one (tq.aio) only differ in how they send these.

    def new_operation(
        self,
        tool: str,
        args: Any,
        *,
        operation_ref: str | None = None,
        call_id: str | None = None,
        run_id: str | None = None,
        step: str | int | None = None,
        trace: str = "",
    ) -> operations.NewOperation:
        """The operation a submit creates, checked: UnknownTool, InvalidArguments if not.
        ``trace``: the submitter's trace context, stored on the record."""
        limits = self.settings.limits
        t = self.registry.get(tool)
        canonical = operations.canonical_args(t, args, limits)
        ref = operations.operation_ref(operation_ref, run_id, step, limits)
        cid = operations.check_call_id(call_id, limits)
        run = functools.partial(self.messages.run, tool=t.name)
        return operations.new_operation(
            t, canonical, ref, cid, self.now_ms(), self.policy, run, trace
        )

    def approval(self, v: operator.View, by: str) -> Transition:
        return operator.approve(v, self.now_ms(), self.policy, self.outbound_for(v.tool), by)

    def retry_now(self, v: operator.View, by: str) -> Transition:
        return operator.retry_now(v, self.now_ms(), self.policy, self.outbound_for(v.tool), by)

    def verify_now(self, v: operator.View, by: str) -> Transition:
        return operator.verify_now(v, self.now_ms(), self.policy, self.outbound_for(v.tool), by)

    def resolution(
        self, v: operator.View, how: operator.Settle, r: operator.Resolution, result: Any
    ) -> Transition:
        # An operator's retry gets the tool's own deadline from now (the default where
        # this process does not know the tool).
        t = self.registry.get(v.tool) if v.tool in self.registry else None
        window_s = (t.options if t is not None else ToolOptions()).deadline
        messages = self.outbound_for(v.tool)
        return operator.resolve(
            v, how, self.now_ms(), self.policy, messages, r,
            result=self._operator_result(result),
            window_ms=int(window_s * 1000),
        )  # fmt: skip

    def _operator_result(self, result: Any) -> Any:
        """An operator's result for a resolved write, as JSON data, within the size a
        tool's result may have; anything else is refused as the caller's mistake."""
        if result is None:
            return None
        try:
            text = json.dumps(jsonable(result), allow_nan=False, ensure_ascii=False)
        except (TypeError, ValueError) as exc:
            raise errors.InvalidArguments(
                f"the result is not JSON data ({type(exc).__name__})", code_hint="BAD_RESULT"
            ) from None
        if len(text.encode()) > self.settings.limits.max_result_bytes:
            raise errors.InvalidArguments(
                f"the result is over {self.settings.limits.max_result_bytes} bytes",
                code_hint="RESULT_TOO_LARGE",
            )
        return json.loads(text)

    def new_input(self, v: operator.View, args: Any, by: str) -> Transition:
        v.require(State.NEEDS_INPUT)
        canonical = operations.canonical_args(self.registry.get(v.tool), args, self.settings.limits)
        fp = fingerprint(canonical)
        return operator.provide_input(
            v, canonical, fp, self.now_ms(), self.policy, self.outbound_for(v.tool), by
        )

    def list_query(self, state: object, **filters: Any) -> lists.ListQuery:
        """A checked list request (:func:`toolq.adapters.ledger.lists.parse_query`), at this
        app's time."""
        limit = self.settings.limits.max_ref_length
        return lists.parse_query(state, now_ms=self.now_ms(), max_ref_length=limit, **filters)

    def configure(self, *, redis_url: str) -> None:
        """Point this app (and its Celery app) at another server, before use."""
        # Checked before it is taken: a refused URL left the app on it (and on the old
        # connections) before.
        settings = self.settings.model_copy(update={"redis_url": SecretStr(redis_url)})
        ToolqSettings.model_validate(settings.model_dump())
        self.settings = settings
        with self._lock:
            if self._notifier is not None:
                self._notifier.close()
                self._notifier = None
            self._drop_redis()
            self._drop_runtime()
            self._liveness = None  # what it read was about the other server
            if self._celery is not None and not self.topology.publishes_via_outbox:
                self._celery.conf.update(broker_config(redis_url))  # the broker moved too

    def adopt(self, settings: ToolqSettings) -> None:
        """Run on ``settings`` from now on (the mode a ``toolq up`` recorded:
        :func:`toolq.adapters.stack_state.with_mode`), before use."""
        with self._lock:
            if self._notifier is not None:
                self._notifier.close()
                self._notifier = None
            self._drop_redis()
            self.settings = settings
            self._topology = None
            self._drop_runtime()
            self._liveness = None
            self._celery = None
            self._messages = None
            self._outbound_for = {}

    def configure_broker(self, broker_url: str, *, master_name: str | None = None) -> None:
        """Use this Celery broker (outbox mode: :mod:`toolq.services.relay`), before use.
        ``master_name``: a ``sentinel://`` URL's (else the settings' ``broker_master_name``)."""
        update: dict[str, Any] = {"broker_url": SecretStr(broker_url)}
        if master_name is not None:
            update["broker_master_name"] = master_name
        try:
            settings = self.settings.model_copy(update=update)
            ToolqSettings.model_validate(settings.model_dump())
        except ValidationError as exc:  # its message names the URL redacted
            msg = exc.errors()[0]["msg"].removeprefix("Value error, ")
            raise errors.RequestRefused(msg) from None
        with self._lock:
            self.settings = settings
            self._topology = None  # publishes through the outbox now
            self._ledger = None  # its scripts' calls name the outbox now
            self._drop_runtime()
            self._celery = None
            self._messages = None
            self._outbound_for = {}

    @property
    def liveness(self) -> liveness.Liveness:
        """Which queues have a live worker, and whether a scheduler is: read for submits."""
        with self._lock:
            if self._liveness is None:
                keys = self.ledger.keys
                self._liveness = liveness.Liveness(keys.workers, keys.schedulers)
            return self._liveness

    def server_away(self) -> None:
        """A call found the server away (:func:`toolq.adapters.outage.note_away`):
        the beats read right after it comes back are judged as of the outage's start."""
        self.liveness.away()

    def queue_of(self, op: operations.NewOperation) -> str:
        """The queue a submit's message goes to: its tool's own, else the calls queue."""
        return op.queue or self.settings.queues.calls

    def warnings_for(self, op: operations.NewOperation) -> tuple[str, ...]:
        """Advisory, for a submit: nothing serves its queue (read at most every few s)."""
        return self.liveness.check(self.redis, self.queue_of(op))

    def _make_celery(self) -> Celery:
        url: str | None
        try:
            url = self.redis_url
        except errors.RequestRefused:
            url = None  # set later by configure(), before any worker starts
        celery = make_celery(self.settings, self.name, url)
        celery.toolq_app = self  # type: ignore[attr-defined]
        liveness.install()  # its workers beat per queue (what a submit's warnings read)
        register_tasks(celery, lambda: self.runtime, self.aio_worker_ledger)
        return celery

    def aio_worker_ledger(self) -> AsyncLedger:
        """An asyncio ledger for the calling loop, for the asyncio pool's task bodies
        (:mod:`toolq.services.workers.aio_pool`): its own connections, as many as a
        ``tq.aio`` loop's, which thousands of short commands in flight share; its claims
        and records go in batches (:mod:`toolq.adapters.ledger.aio_batch`).

        A command waits for one of them as long as the commands before it take (as
        a Cluster's turns do): on a loop a tool held, that wait is the loop's, not
        the server away, and a claim timed out by it would be requeued for nothing."""
        client = self.async_redis(max_connections=AIO_WORKER_CONNECTIONS, pool_timeout=None)
        t = self.topology
        in_flight = t.nodes.bound(client, AIO_WORKER_CONNECTIONS - 4)
        return async_ledger_for(t, client, self.settings.durability, in_flight, MAX_BATCH)

    def close(self) -> None:
        with self._lock:
            if self._notifier is not None:
                self._notifier.close()
                self._notifier = None
            self._drop_runtime()
            self._drop_redis()

    def _drop_runtime(self) -> None:
        # Its lease thread renews through the ledger it was made with: stopped with it.
        if self._runtime is not None:
            self._runtime.leases.stop()
        self._runtime = None

    def _drop_redis(self) -> None:
        if self._redis is not None:
            self.topology.close_redis(self._redis)  # made by this topology: not reset yet
        self._redis = None
        self._ledger = None

    def describe(self) -> dict[str, Any]:
        return {
            "redis_url": redact_url(self.redis_url),
            "tools": [
                {"name": t.name, "writes": t.writes, "verifier": t.verification_tool}
                for t in self.registry
            ],
        }
