"""A tool app for settling escalated operations, and for approval a tool asks for only
sometimes. The provider is the test's own Redis: it records every write
(``provider:writes:<ref>``, one entry per commit) and every attempt it was sent.

``transfer`` modes:

- ``lost_reply``: the write commits, its reply is lost, and the verifier is down:
  escalated ``VERIFICATION_UNAVAILABLE`` (a person finds it written);
- ``lost_request``: the first attempt fails before anything is written, and the
  verifier is down: escalated the same way (a person finds nothing written); any
  later attempt writes;
- ``exhaust``: rate limited on every attempt: escalated ``ATTEMPTS_EXHAUSTED``.

``payout`` asks for approval only above 10,000 cents, the README's pattern.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.core.settings import RecoverySettings, SchedulerSettings, ToolqSettings

OPERATOR_RETRIES = 2
settings = ToolqSettings(
    recovery=RecoverySettings(unclaimed_after=3.0, operator_retries=OPERATOR_RETRIES),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=1.0),
)
tq = ToolQueue(settings=settings)
provider = ProcessClient(tq)


class Transfer(BaseModel):
    mode: str = "ok"
    cents: int = 100


def write(ref: str, attempt: int) -> None:
    provider().rpush(f"provider:writes:{ref}", attempt)


@tq.tool(
    writes=True,
    max_attempts=2,
    verify_checks=1,
    verify_backoff=0.05,
    consistency_window=0,
    deadline=600,
)
def transfer(args: Transfer, ctx: CallContext) -> dict[str, Any]:
    provider().rpush(f"provider:attempts:{ctx.operation_ref}", ctx.attempt)
    if args.mode == "exhaust":
        raise errors.RateLimited(retry_after=0.05)
    if args.mode == "lost_request" and ctx.attempt == 1:
        raise ConnectionResetError("connection reset before the request was sent")
    write(ctx.operation_ref, ctx.attempt)
    if args.mode == "lost_reply":
        raise ConnectionResetError("connection reset by peer")
    return {"sent": args.cents, "attempt": ctx.attempt}


@transfer.verifier
def find_transfer(ctx: CallContext) -> dict[str, Any] | None:
    raise ConnectionError("the provider's lookup is down")


class Payout(BaseModel):
    amount_cents: int


@tq.tool(writes=True, max_attempts=3)
def payout(args: Payout, ctx: CallContext) -> dict[str, Any]:
    if args.amount_cents > 10_000 and not ctx.approved:
        raise errors.NeedsApproval()
    write(ctx.operation_ref, ctx.attempt)
    return {"paid": args.amount_cents, "approved": ctx.approved}


celery_app = tq.celery
