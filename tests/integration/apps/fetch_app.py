"""A tool app for many messages per fetch (issue 29): queues of its own, a short
visibility timeout swept every second, and no republish by the scheduler within a
test's time, so only kombu's restore of the unacked hash brings a dead worker's
messages back.

``note`` records each run in the same Redis (``fetch:runs:<ref>``), after waiting for
``fetch:open`` when asked to (a gated call holds its pool slot without running).
"""

from __future__ import annotations

import time
from typing import Any

import redis
from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core.settings import (
    LeaseSettings,
    QueueSettings,
    RecoverySettings,
    SchedulerSettings,
    ToolqSettings,
)

APP = "tests.integration.apps.fetch_app:tq"
GATE = "fetch:open"

tq = ToolQueue(
    settings=ToolqSettings(
        queues=QueueSettings(calls="fetch.calls", verify="fetch.verify", visibility_timeout=10),
        recovery=RecoverySettings(unclaimed_after=3600.0),
        # A dead worker's running call is taken over soon after its redelivery.
        lease=LeaseSettings(seconds=1.0),
        scheduler=SchedulerSettings(hold=2.0, max_sleep=0.5),
    ),
    name="fetch-test",
)
# kombu sweeps the unacked set every unacked_restore_interval * unacked_restore_throttle
# seconds (100 by default): once a second here (as in lease_app).
tq.celery.conf.broker_transport_options = {
    **tq.celery.conf.broker_transport_options,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}

client = ProcessClient(tq)


class Note(BaseModel):
    gated: bool = False


@tq.tool(writes=False)
def note(args: Note, ctx: CallContext) -> dict[str, Any]:
    c = client()
    while args.gated and not c.exists(GATE):
        time.sleep(0.05)
    c.rpush(f"fetch:runs:{ctx.operation_ref}", ctx.attempt)
    return {"noted": ctx.operation_ref}


def runs(c: redis.Redis, ref: str) -> list[int]:
    """The attempts of ``ref`` that ran the tool."""
    return [int(x) for x in c.lrange(f"fetch:runs:{ref}", 0, -1)]


celery_app = tq.celery
