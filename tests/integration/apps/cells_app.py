"""A tool app for cells mode (issue 18): the ledger in cells, on one server or a Cluster.

The processes a test starts read ``TOOLQ_CELLS`` (and ``TOOLQ_CLUSTER``,
``TOOLQ_BROKER_URL``, ``TOOLQ_DURABILITY``) from their environment; the test
process builds its own client with :func:`make`. The provider stub writes its side
effects (``provider:effects``, ``provider:committed:<ref>``) to ``PROVIDER_URL``
when set (a Cluster's node would answer MOVED to a plain client), else to the
ledger's server.

Modes of ``pay``: ``ok``; ``rate_limited`` (429 on the first two attempts);
``lost_reply`` (commits, then its reply is lost on the first attempt). ``sleep``
holds the tool inside the write (after the side effect, before the reply): where a
test kills its worker.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.core.settings import (
    LeaseSettings,
    RecoverySettings,
    RelaySettings,
    SchedulerSettings,
    ToolqSettings,
)

APP = "tests.integration.apps.cells_app:tq"

SETTINGS = ToolqSettings(
    lease=LeaseSettings(seconds=1.5),
    recovery=RecoverySettings(unclaimed_after=3.0, approval_timeout=60, input_timeout=60),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=1.0),
    relay=RelaySettings(block=0.5, claim_after=1.0),
)


class Pay(BaseModel):
    mode: str = "ok"
    sleep: float = 0.0


def make(settings: ToolqSettings) -> ToolQueue:
    """The app's tools on a ToolQueue of these settings."""
    tq = ToolQueue(settings=settings)
    provider = ProcessClient(tq, url_env="PROVIDER_URL")

    @tq.tool(
        writes=True, consistency_window=0.5, max_attempts=5, verify_checks=3, verify_backoff=0.1
    )
    def pay(args: Pay, ctx: CallContext) -> dict[str, Any]:
        p = provider()
        if args.mode == "rate_limited" and ctx.attempt < 3:
            raise errors.RateLimited(retry_after=0.3)
        with p.pipeline(transaction=True) as pipe:  # one commit (runtime_app says why)
            pipe.rpush("provider:effects", ctx.operation_ref)
            pipe.set(f"provider:committed:{ctx.operation_ref}", "1")
            pipe.execute()
        if args.sleep:
            time.sleep(args.sleep)  # inside the write: after the side effect, before the reply
        if args.mode == "lost_reply" and ctx.attempt == 1:
            raise ConnectionResetError("connection reset by peer")
        return {"paid": ctx.operation_ref, "attempt": ctx.attempt}

    @pay.verifier
    def find_payment(ctx: CallContext) -> dict[str, Any] | None:
        if provider().get(f"provider:committed:{ctx.operation_ref}"):
            return {"paid": ctx.operation_ref, "found": True}
        return None

    return tq


tq = make(SETTINGS)
celery_app = tq.celery
