"""A server that cannot be reached, said as toolq's own error.

The Python API (``tq.submit/wait/get/approve/provide_input/cancel``) and the
async one raise :class:`toolq.core.errors.ServerUnavailable` instead of a raw
``redis.exceptions.ConnectionError`` traceback: the message names the server
(password redacted), what went wrong in a word, and what to do. The redis-py
exception stays chained (``__cause__``) for logs.

Only failures to reach or hear the server are translated (refused, reset,
timed out, authentication, loading after a restart). A ``ResponseError`` is
the server answering: a bug or a misconfiguration that must show as it is.

On a Cluster (``cluster=True``) redis-py's cluster clients say the same with
exceptions of their own (:data:`CLUSTER_UNREACHABLE`), and the node that failed
is not the URL's: the message names the node redis-py tried (the ``connection``
it attaches to the exception, or the address in a connect error), else the
seeds. ``CLUSTERDOWN``/``MASTERDOWN`` are answers, but answers that mean the
slot has no primary yet (a failover): translated too.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import redis
from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    CrossSlotTransactionError,
    InvalidPipelineStack,
    MaxConnectionsError,
    RedisClusterException,
    SlotNotCoveredError,
)

from toolq.core import errors
from toolq.core.redact import CREDENTIALS_ADVICE, redact_url, scrub
from toolq.core.settings import seed_nodes

P = ParamSpec("P")
R = TypeVar("R")

#: What redis-py raises when it cannot reach or hear the server
#: (AuthenticationError, BusyLoadingError and MaxConnectionsError are ConnectionErrors).
SERVER_UNREACHABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)
#: What redis-py's Cluster clients (sync and asyncio) raise besides, with a node away
#: or a slot without a primary: ``RedisClusterException`` (no seed answered, "All
#: slots are not covered", seeds disagreeing mid-failover; not a RedisError) and its
#: ``SlotNotCoveredError``; ``ClusterError``: ``ClusterDownError`` (CLUSTERDOWN, and
#: MASTERDOWN: ``MasterDownError``) and "TTL exhausted" after too many redirections.
CLUSTER_UNREACHABLE: tuple[type[Exception], ...] = (RedisClusterException, ClusterError)
#: Everything that means "unreachable, try again later" on one server or a Cluster:
#: what long-running processes wait out. Use :func:`unreachable` to leave out
#: :data:`MISUSE`.
UNREACHABLE: tuple[type[Exception], ...] = (*SERVER_UNREACHABLE, *CLUSTER_UNREACHABLE)
#: RedisClusterExceptions that are a caller's mistake, not an outage: never translated.
MISUSE: tuple[type[Exception], ...] = (CrossSlotTransactionError, InvalidPipelineStack)


def unreachable(exc: BaseException) -> bool:
    """True for an exception that means the server (or a Cluster's node) is away."""
    return isinstance(exc, UNREACHABLE) and not isinstance(exc, MISUSE)


#: What a rediss:// URL to a server that does not speak TLS on that port gets: a TLS
#: error, or a wait for the handshake's answer until the socket's timeout (the server
#: reads the greeting as the start of a command and waits for its end).
TLS_ADVICE = "a rediss:// URL speaks TLS: if the server does not on that port, use redis://"


def tls_hint(url: str | None, exc: BaseException) -> str:
    """``"; <TLS_ADVICE>"`` when ``exc`` may be a rediss:// URL's TLS greeting to a
    server that does not speak TLS (timed out connecting, or a TLS error), else "".
    A refused connection is not: nothing listens there, TLS or not."""
    if not (url or "").startswith("rediss://"):
        return ""
    said = str(exc)
    connecting = isinstance(exc, redis.TimeoutError) and "connecting" in said
    tls = isinstance(exc, redis.ConnectionError) and "SSL" in said
    return f"; {TLS_ADVICE}" if connecting or tls else ""


_WHAT_TO_DO = (
    "start it (`toolq up` in your project directory) or point TOOLQ_REDIS_URL "
    "(or redis_url=) at the server your workers use"
)


def message(url: str, exc: BaseException, *, cluster: bool = False) -> str:
    """What happened and what to do, for ``url`` (redacted here) and redis-py's ``exc``;
    ``cluster``: ``url`` names a Cluster's seed nodes."""
    if cluster:
        return cluster_message(url, exc)
    where = redact_url(url) if url else "(no URL)"
    said = scrub(str(exc))[:200]
    kind = type(exc).__name__
    if isinstance(exc, redis.AuthenticationError):
        return (
            f"the server at {where} refused toolq's credentials ({kind}: {said}); "
            f"{CREDENTIALS_ADVICE}"
        )
    if isinstance(exc, redis.BusyLoadingError):
        return (
            f"the server at {where} is loading its data after a restart ({kind}); "
            "the same call again in a moment is safe"
        )
    if isinstance(exc, redis.TimeoutError):
        return (
            f"the server at {where} did not answer in time ({kind}: {said}); it may be "
            f"overloaded, paused or unreachable: the same call again is safe once it "
            f"answers{tls_hint(url, exc)}"
        )
    return f"cannot reach the server at {where} ({kind}: {said}): {_WHAT_TO_DO}{tls_hint(url, exc)}"


#: The address in redis-py's connect errors ("Error 111 connecting to host:port. ...").
_CONNECTING = re.compile(r"connecting to (\S+:\d+)\.")


def failed_node(exc: BaseException) -> str | None:
    """``host:port`` of the node whose failure ``exc`` reports, if redis-py says: the
    ``connection`` (a connection or a ClusterNode) its cluster clients attach, or the
    address of a connect error, in ``exc`` or what it was raised from."""
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in seen and len(seen) < 8:
        seen.append(e)
        conn = getattr(e, "connection", None)
        host, port = getattr(conn, "host", None), getattr(conn, "port", None)
        if isinstance(host, str) and host and isinstance(port, int):
            return f"{host}:{port}"
        found = _CONNECTING.search(str(e))
        if found:
            return found.group(1)
        e = e.__cause__ or e.__context__
    return None


def _seeds(url: str) -> str:
    try:
        return ", ".join(f"{host}:{port}" for host, port in seed_nodes(url)) or "(no URL)"
    except ValueError:
        return redact_url(url) if url else "(no URL)"


def cluster_message(url: str, exc: BaseException) -> str:
    """:func:`message` for a Cluster whose seeds ``url`` lists: names the node that failed."""
    seeds = _seeds(url)
    said = scrub(str(exc))[:200]
    kind = type(exc).__name__
    node = failed_node(exc)
    which = f"the Cluster's node {node}" if node else f"a node of the Cluster (seeds {seeds})"
    if isinstance(exc, RedisClusterException) and "cannot be connected" in str(exc):
        if "Cluster mode is not enabled" in str(exc):
            return (
                f"the server at {seeds} is not a Cluster node ({kind}): unset TOOLQ_CLUSTER, "
                "or point TOOLQ_REDIS_URL at a Cluster's nodes"
            )
        last = exc.__cause__ or exc  # the last seed's failure, without redis-py's preamble
        return (
            f"cannot reach any seed node of the Cluster ({seeds}) ({type(last).__name__}: "
            f"{scrub(str(last))[:200]}): start them, or list more seeds in TOOLQ_REDIS_URL "
            "(redis://a:7000,b:7001,c:7002)"
        )
    if isinstance(exc, ClusterDownError | SlotNotCoveredError) or (
        isinstance(exc, RedisClusterException) and "not covered" in str(exc)
    ):
        return (
            f"a node of the Cluster (seeds {seeds}) is down and no replica has taken over "
            f"(yet): the Cluster does not serve every slot ({kind}: {said}); the same call "
            "again is safe once one has"
        )
    if isinstance(exc, redis.AuthenticationError):
        return f"{which} refused toolq's credentials ({kind}: {said}); {CREDENTIALS_ADVICE}"
    if isinstance(exc, MaxConnectionsError):
        return (
            f"no free connection to {which} ({kind}): too many calls at once; the same "
            "call again is safe"
        )
    if isinstance(exc, redis.TimeoutError):
        return (
            f"{which} did not answer in time ({kind}: {said}); it may be overloaded, paused "
            "or unreachable: the same call again is safe once it answers"
        )
    return (
        f"cannot reach {which} ({kind}: {said}): if it failed, its replica takes over "
        "and the same call again is safe; if none does, start it"
    )


#: Whether the URL names a Cluster's seeds: known, or asked only on failure.
OnCluster = bool | Callable[[], bool]


@contextmanager
def translated(
    url: Callable[[], str],
    cluster: OnCluster = False,
    away: Callable[[], None] | None = None,
) -> Iterator[None]:
    """Turn an unreachable server into :class:`errors.ServerUnavailable`.

    ``url`` is called only on failure (it may itself refuse: no URL configured);
    ``cluster`` (or what it returns, called only then): it names a Cluster's seeds;
    ``away``, if given, is told (:func:`note_away`).
    """
    try:
        yield
    except UNREACHABLE as exc:
        if isinstance(exc, MISUSE):
            raise
        if away is not None:
            away()
        raise unavailable(url, exc, cluster) from exc


def note_away(client: Any) -> None:
    """Tell a client's app that its server did not answer (``app.server_away``: what
    it last read of the workers' beats is judged as of the outage's start). Advisory:
    never raises."""
    note = getattr(getattr(client, "app", None), "server_away", None)
    if callable(note):
        # advisory bookkeeping: the caller's own error is what matters
        with contextlib.suppress(Exception):
            note()


def unavailable(
    url: Callable[[], str], exc: BaseException, cluster: OnCluster = False
) -> errors.ServerUnavailable:
    """:class:`errors.ServerUnavailable` for ``exc``, one of :data:`UNREACHABLE`."""
    try:
        where = url()
    except errors.ToolqError:
        where = ""
    on_cluster = cluster() if callable(cluster) else cluster
    return errors.ServerUnavailable(message(where, exc, cluster=on_cluster))


def server_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """A method decorator for clients holding ``self.app`` (sync or ``async def``)."""

    def url_of(args: tuple[Any, ...]) -> Callable[[], str]:
        return lambda: str(args[0].app.redis_url)

    def cluster_of(args: tuple[Any, ...]) -> Callable[[], bool]:
        return lambda: bool(getattr(getattr(args[0].app, "settings", None), "cluster", False))

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            with translated(url_of(args), cluster_of(args), lambda: note_away(args[0])):
                return await fn(*args, **kwargs)

        return awrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with translated(url_of(args), cluster_of(args), lambda: note_away(args[0])):
            return fn(*args, **kwargs)

    return wrapper
