"""A server that cannot be reached, said as toolq's own error.

The Python API (``tq.submit/wait/get/approve/provide_input/cancel``) and the
async one raise :class:`toolq.errors.ServerUnavailable` instead of a raw
``redis.exceptions.ConnectionError`` traceback: the message names the server
(password redacted), what went wrong in a word, and what to do. The redis-py
exception stays chained (``__cause__``) for logs.

Only failures to reach or hear the server are translated (refused, reset,
timed out, authentication, loading after a restart). A ``ResponseError`` is
the server answering: a bug or a misconfiguration that must show as it is.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, ParamSpec, TypeVar

import redis

from toolq import errors
from toolq.redact import redact_url, scrub

P = ParamSpec("P")
R = TypeVar("R")

#: What redis-py raises when it cannot reach or hear the server
#: (AuthenticationError and BusyLoadingError are ConnectionErrors).
UNREACHABLE: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError)

_WHAT_TO_DO = (
    "start it (`toolq up` in your project directory) or point TOOLQ_REDIS_URL "
    "(or redis_url=) at the server your workers use"
)


def message(url: str, exc: BaseException) -> str:
    """What happened and what to do, for ``url`` (redacted here) and redis-py's ``exc``."""
    where = redact_url(url) if url else "(no URL)"
    said = scrub(str(exc))[:200]
    kind = type(exc).__name__
    if isinstance(exc, redis.AuthenticationError):
        return (
            f"the server at {where} refused toolq's credentials ({kind}: {said}); "
            "check the password in TOOLQ_REDIS_URL"
        )
    if isinstance(exc, redis.BusyLoadingError):
        return (
            f"the server at {where} is loading its data after a restart ({kind}); "
            "the same call again in a moment is safe"
        )
    if isinstance(exc, redis.TimeoutError):
        return (
            f"the server at {where} did not answer in time ({kind}: {said}); it may be "
            f"overloaded, paused or unreachable: the same call again is safe once it answers"
        )
    return f"cannot reach the server at {where} ({kind}: {said}): {_WHAT_TO_DO}"


@contextmanager
def translated(url: Callable[[], str]) -> Iterator[None]:
    """Turn an unreachable server into :class:`errors.ServerUnavailable`.

    ``url`` is called only on failure (it may itself refuse: no URL configured).
    """
    try:
        yield
    except UNREACHABLE as exc:
        try:
            where = url()
        except errors.ToolqError:
            where = ""
        raise errors.ServerUnavailable(message(where, exc)) from exc


def server_errors(fn: Callable[P, R]) -> Callable[P, R]:
    """A method decorator for clients holding ``self.app`` (sync or ``async def``)."""

    def url_of(args: tuple[Any, ...]) -> Callable[[], str]:
        return lambda: str(args[0].app.redis_url)

    if inspect.iscoroutinefunction(fn):

        @functools.wraps(fn)
        async def awrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            with translated(url_of(args)):
                return await fn(*args, **kwargs)

        return awrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with translated(url_of(args)):
            return fn(*args, **kwargs)

    return wrapper
