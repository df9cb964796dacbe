"""A tool app for the operator actions (retry now, verify now) and Flower.

``charge`` is a write whose next step is far off unless an operator acts: its
first attempt is rate limited for half an hour (``slow_retry``), or its reply is
lost after it committed and its verifier is down (``unknown``: the next check
after a failed one is minutes away). The provider is the test's own Redis.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.core.settings import RecoverySettings, SchedulerSettings, ToolqSettings

settings = ToolqSettings(
    recovery=RecoverySettings(unclaimed_after=3.0),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=1.0),
)
tq = ToolQueue(settings=settings)
provider = ProcessClient(tq)

#: While this key is set the verifier fails (its backend is down).
VERIFIER_DOWN = "provider:verifier_down"


class Charge(BaseModel):
    mode: str = "ok"
    cents: int = 100


@tq.tool(writes=True, max_attempts=3, verify_checks=5, verify_backoff=300, consistency_window=0)
def charge(args: Charge, ctx: CallContext) -> dict[str, Any]:
    p = provider()
    p.rpush(f"provider:seen:{ctx.operation_ref}", ctx.attempt)
    if args.mode == "slow_retry" and ctx.attempt == 1:
        raise errors.RateLimited(retry_after=1800.0)
    if args.mode == "fail":
        raise errors.Conflict(current_state_ref="charge/other")
    if args.mode == "exhaust":
        raise errors.RateLimited(retry_after=0.1)
    p.set(f"provider:committed:{ctx.operation_ref}", "1")
    if args.mode == "unknown":
        raise ConnectionResetError("connection reset by peer")
    return {"charged": args.cents, "attempt": ctx.attempt}


@charge.verifier
def find_charge(ctx: CallContext) -> dict[str, Any] | None:
    p = provider()
    p.incr("provider:verifications")
    if p.get(VERIFIER_DOWN):
        raise ConnectionError("verifier backend down")
    if p.get(f"provider:committed:{ctx.operation_ref}"):
        return {"charged": True}
    return None


@tq.tool(writes=False, max_attempts=2)
def lookup(args: Charge, ctx: CallContext) -> dict[str, Any]:
    if args.mode == "crash":
        raise RuntimeError("unexpected: a read that cannot go on is escalated")
    return {"cents": args.cents}


celery_app = tq.celery
