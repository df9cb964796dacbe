"""The toolq side of the benchmarks: tools that do (almost) nothing.

``noop`` measures toolq's own cost; ``sleep100`` an I/O-bound tool;
``unknown_once`` a write whose first attempt commits and then reports an
unknown outcome, so every call goes through verification once.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from pydantic import BaseModel

from toolq import CallContext, ToolQueue
from toolq.core import errors

tq = ToolQueue(name="bench")
#: For ``celery -A bench.apps:celery_app worker`` (pools the toolq CLI does not offer:
#: gevent), with the server in ``TOOLQ_REDIS_URL``.
celery_app = tq.celery
if os.environ.get("BENCH_TOOLQ_PREFETCH"):
    # What-if: toolq's worker reserving more than one message per pool slot (its
    # default is 1; Celery's is 4).
    celery_app.conf.worker_prefetch_multiplier = int(os.environ["BENCH_TOOLQ_PREFETCH"])

if os.environ.get("BENCH_TRACING"):
    # `python -m bench tracing`: the SDK in the worker too (a dropping exporter).
    from bench.tracing_bench import install_sdk

    install_sdk()

COMMITTED = "bench:committed"


class NoArgs(BaseModel):
    n: int = 0


@tq.tool(writes=True)
def noop(args: NoArgs) -> dict[str, Any]:
    return {}


@noop.verifier
def _noop_found(ctx: CallContext) -> Any:
    return None


@tq.tool(writes=True)
def sleep100(args: NoArgs) -> dict[str, Any]:
    time.sleep(0.1)
    return {}


@sleep100.verifier
def _sleep_found(ctx: CallContext) -> Any:
    return None


_client: redis.Redis | None = None
_pid = 0


def provider() -> redis.Redis:
    """A client of the bench's stand-in provider (a set in the same server), per process."""
    global _client, _pid
    if _client is None or _pid != os.getpid():
        _client = redis.Redis.from_url(tq.redis_url)
        _pid = os.getpid()
    return _client


@tq.tool(writes=True, consistency_window=0.0, max_attempts=3)
def unknown_once(args: NoArgs, ctx: CallContext) -> dict[str, Any]:
    provider().sadd(COMMITTED, ctx.operation_ref)
    if ctx.attempt == 1:
        raise errors.OutcomeUnknown("the reply was lost (benchmark)")
    return {}


@unknown_once.verifier
def _unknown_found(ctx: CallContext) -> Any:
    if provider().sismember(COMMITTED, ctx.operation_ref):
        return {"found": True}
    return None


@tq.tool(writes=True)
def write_once(args: NoArgs, ctx: CallContext) -> dict[str, Any]:
    """A write that makes one provider round trip, like ``unknown_once``'s verifier does."""
    provider().sadd(COMMITTED, ctx.operation_ref)
    return {}


@write_once.verifier
def _write_found(ctx: CallContext) -> Any:
    return {"found": True} if provider().sismember(COMMITTED, ctx.operation_ref) else None


@tq.tool(writes=True)
def crash_write(args: NoArgs, ctx: CallContext) -> dict[str, Any]:
    """The peers crash bench's write: a counter that never deduplicates, mid-call."""
    from bench.peers import crash_key

    time.sleep(0.05)
    provider().incr(crash_key("toolq", args.n))
    time.sleep(0.05)
    return {}


@crash_write.verifier
def _crash_found(ctx: CallContext) -> Any:
    from bench.peers import crash_key

    assert isinstance(ctx.args, NoArgs)
    n = ctx.args.n
    return {"found": True} if int(provider().get(crash_key("toolq", n)) or 0) else None
