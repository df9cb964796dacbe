"""A tool app for the outbox tests (issue 18): Celery's broker is RabbitMQ (or another
Redis), the ledger the test's Valkey; messages go through the outbox and a relay.

The provider stub is the runtime app's: side effects (``provider:effects``) and the
attempts each ref was sent (``provider:seen:<ref>``) in the ledger's Redis.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core.settings import (
    LeaseSettings,
    RecoverySettings,
    RelaySettings,
    SchedulerSettings,
    ToolqSettings,
)

APP = "tests.integration.apps.outbox_app:tq"

# The broker URL comes from TOOLQ_BROKER_URL in the processes the tests start, and
# from configure_broker() in the test process.
settings = ToolqSettings(
    lease=LeaseSettings(seconds=1.5),
    recovery=RecoverySettings(unclaimed_after=3.0, approval_timeout=60, input_timeout=60),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=1.0),
    relay=RelaySettings(block=0.5, claim_after=1.0),
)
tq = ToolQueue(settings=settings)
provider = ProcessClient(tq)


class Pay(BaseModel):
    amount_cents: int = 100
    sleep: float = 0.0


@tq.tool(writes=True, consistency_window=0.5, max_attempts=5, verify_checks=3, verify_backoff=0.1)
def pay(args: Pay, ctx: CallContext) -> dict[str, Any]:
    p = provider()
    p.rpush(f"provider:seen:{ctx.operation_ref}", f"{ctx.attempt}:{time.time()}")
    with p.pipeline(transaction=True) as pipe:  # one commit (runtime_app says why)
        pipe.rpush("provider:effects", ctx.operation_ref)
        pipe.set(f"provider:committed:{ctx.operation_ref}", "1")
        pipe.execute()
    if args.sleep:
        time.sleep(args.sleep)  # inside the write: after the side effect, before the reply
    return {"paid": ctx.operation_ref, "attempt": ctx.attempt}


@pay.verifier
def find_payment(ctx: CallContext) -> dict[str, Any] | None:
    if provider().get(f"provider:committed:{ctx.operation_ref}"):
        return {"paid": ctx.operation_ref, "found": True}
    return None
