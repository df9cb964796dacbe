"""A tool app for the requeue test (issue 25): outbox mode, queues of its own, and no
republish by the scheduler within a test's time (``recovery.unclaimed_after`` an
hour): a call whose message was acknowledged unrun stays ``queued``, so only a
redelivery of its message can run it.

The provider stub is the outbox app's: side effects (``provider:effects``) in the
ledger's Redis.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core.settings import (
    QueueSettings,
    RecoverySettings,
    RelaySettings,
    ToolqSettings,
    WorkerSettings,
)

APP = "tests.integration.apps.requeue_app:tq"

# The broker URL comes from TOOLQ_BROKER_URL in the processes the test starts, and
# from configure_broker() in the test process.
settings = ToolqSettings(
    queues=QueueSettings(calls="requeue.calls", verify="requeue.verify"),
    recovery=RecoverySettings(unclaimed_after=3600.0),
    relay=RelaySettings(block=0.5, claim_after=1.0),
    # A claim gives up 3 s after its first failure (10 s by default): the test keeps
    # the ledger's server down past it, and waits that out.
    worker=WorkerSettings(claim_patience_s=3.0),
)
tq = ToolQueue(settings=settings)
provider = ProcessClient(tq)


class Pay(BaseModel):
    amount_cents: int = 100


@tq.tool(writes=True, max_attempts=3)
def pay(args: Pay, ctx: CallContext) -> dict[str, Any]:
    with provider().pipeline(transaction=True) as pipe:  # one commit (runtime_app says why)
        pipe.rpush("provider:effects", ctx.operation_ref)
        pipe.set(f"provider:committed:{ctx.operation_ref}", "1")
        pipe.execute()
    return {"paid": ctx.operation_ref, "attempt": ctx.attempt}


@pay.verifier
def find_payment(ctx: CallContext) -> dict[str, Any] | None:
    if provider().get(f"provider:committed:{ctx.operation_ref}"):
        return {"paid": ctx.operation_ref, "found": True}
    return None
