"""The tools of the ledgers earlier formats wrote (``tests/data/ledgers/make.py``), as
today's code: same names and arguments, and every call counted in the same Redis
(``provider:calls:<ref>``), so a test sees how often each operation really ran."""

from __future__ import annotations

import redis
from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core.settings import LeaseSettings, RecoverySettings, SchedulerSettings, ToolqSettings

APP = "tests.integration.apps.legacy_app:tq"

settings = ToolqSettings(
    lease=LeaseSettings(seconds=2.0),
    recovery=RecoverySettings(unclaimed_after=1.0),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=0.5),
)
tq = ToolQueue(name="legacy-test", settings=settings)
provider = ProcessClient(tq)

YEARS = 10 * 365 * 86400.0


class Args(BaseModel):
    n: int = 1


def calls(p: redis.Redis, ref: str) -> int:
    return int(p.get(f"provider:calls:{ref}") or 0)


def _called(ctx: CallContext) -> None:
    provider().incr(f"provider:calls:{ctx.operation_ref}")


@tq.tool(writes=True, deadline=YEARS, consistency_window=0.1)
def legacy_pay(args: Args, ctx: CallContext) -> dict[str, int]:
    _called(ctx)
    return {"paid": args.n}


@legacy_pay.verifier
def legacy_pay_found(ctx: CallContext) -> object:
    """The earlier version's uncertain write (legacy/verify) did reach the provider."""
    return {"paid": 3}


@tq.tool(writes=True, deadline=YEARS, max_attempts=1)
def legacy_once(args: Args, ctx: CallContext) -> dict[str, int]:
    _called(ctx)
    return {"once": args.n}


@legacy_once.verifier
def legacy_once_found(ctx: CallContext) -> object:
    return None


@tq.tool(writes=True, deadline=YEARS, requires_approval=True)
def legacy_approve(args: Args, ctx: CallContext) -> dict[str, int]:
    _called(ctx)
    return {"approved": args.n}


@legacy_approve.verifier
def legacy_approve_found(ctx: CallContext) -> object:
    return None
