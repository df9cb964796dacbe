"""A tool app for the deadline tests: tools whose deadline is a second, and tools
whose deadline a test ends itself (:data:`LONG`).

Every tool counts its calls in the same Redis (``provider:calls:<ref>``), so a
test sees whether a tool was ever called, whatever the ledger says.
"""

from __future__ import annotations

import time

import redis
from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.core.settings import LeaseSettings, RecoverySettings, SchedulerSettings, ToolqSettings

APP = "tests.integration.apps.deadline_app:tq"

settings = ToolqSettings(
    lease=LeaseSettings(seconds=1.0),
    recovery=RecoverySettings(unclaimed_after=0.5, approval_timeout=60, input_timeout=60),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=0.5),
)
tq = ToolQueue(name="deadline-test", settings=settings)

#: The deadline of the tools whose attempt 1 must start before it: never reached in a
#: test, which ends it once that attempt has run (test_deadline.end_deadline). A
#: deadline of seconds was a bet that a loaded machine starts the attempt in time.
LONG = 3600.0


class Args(BaseModel):
    n: int = 1
    sleep: float = 0.0


provider = ProcessClient(tq)


def called(ctx: CallContext) -> None:
    provider().incr(f"provider:calls:{ctx.operation_ref}")


def calls(p: redis.Redis, ref: str) -> int:
    return int(p.get(f"provider:calls:{ref}") or 0)


@tq.tool(writes=True, deadline=1.0)
def pay(args: Args, ctx: CallContext) -> str:
    """A write that must start within a second of its submit."""
    called(ctx)
    return "paid"


@tq.tool(writes=True, deadline=1.0, requires_approval=True)
def transfer(args: Args, ctx: CallContext) -> str:
    """A write that waits for approval, and must start within a second of its submit."""
    called(ctx)
    return "sent"


@tq.tool(writes=True, deadline=LONG)
def charge(args: Args, ctx: CallContext) -> str:
    """Needs a positive ``n`` (to reach needs_input)."""
    called(ctx)
    if args.n <= 0:
        raise errors.InvalidInput(field="n", rule="positive")
    return "charged"


@tq.tool(writes=False, deadline=LONG, max_attempts=3)
def scan(args: Args, ctx: CallContext) -> str:
    """A read that takes ``sleep`` seconds."""
    called(ctx)
    time.sleep(args.sleep)
    return "scanned"


@tq.tool(writes=False, deadline=LONG, max_attempts=3)
def quote(args: Args, ctx: CallContext) -> str:
    """A read rate limited on its first attempt."""
    called(ctx)
    if ctx.attempt == 1:
        raise errors.RateLimited(retry_after=0.1)
    return "quoted"


@tq.tool(writes=True, deadline=LONG, consistency_window=0.5, verify_backoff=0.1)
def book(args: Args, ctx: CallContext) -> str:
    """A write whose first attempt times out before it commits (the test ends its
    deadline before it lets a verifier check, so "not found" is believed too late)."""
    called(ctx)
    if ctx.attempt == 1:
        raise TimeoutError("read timed out")
    return "booked"


@book.verifier
def find_booking(ctx: CallContext) -> str | None:
    provider().incr(f"provider:verifications:{ctx.operation_ref}")
    return None


celery_app = tq.celery
