"""A tool app for leases, redelivery and retention: short lease, short visibility timeout.

``slow_write`` holds its attempt open for ``seconds`` and then commits, so a lost
lease or a second delivery would show as a second commit. Everything the tool
and its verifier do is counted in the same Redis (``lease:*``), for the test to read.
"""

from __future__ import annotations

import time
from typing import Any

import redis
from pydantic import BaseModel, Field

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core.settings import (
    LeaseSettings,
    QueueSettings,
    RecoverySettings,
    SchedulerSettings,
    ToolqSettings,
)

APP = "tests.integration.apps.lease_app:tq"
#: Finished records are kept this long (the smallest retention the settings allow).
RETENTION_S = 60

tq = ToolQueue(
    settings=ToolqSettings(
        # A lease renewed every third of a second: a tool of a few seconds outlives it
        # many times over, so only renewal keeps it.
        lease=LeaseSettings(seconds=1.0),
        # The smallest visibility timeout the settings allow: a longer tool is
        # delivered again while it runs.
        queues=QueueSettings(visibility_timeout=10),
        recovery=RecoverySettings(unclaimed_after=30.0, retention=RETENTION_S),
        scheduler=SchedulerSettings(hold=2.0, max_sleep=0.5),
    ),
    name="lease-test",
)
# kombu sweeps the unacked set every unacked_restore_interval * unacked_restore_throttle
# seconds (10 * 10 by default in kombu 5.7): once a second here, so a message past the
# visibility timeout is restored to its queue within about a second, not 100.
tq.celery.conf.broker_transport_options = {
    **tq.celery.conf.broker_transport_options,
    "unacked_restore_interval": 1,
    "unacked_restore_throttle": 1,
}

client = ProcessClient(tq)


class Hold(BaseModel):
    seconds: float = Field(ge=0, le=60)


@tq.tool(writes=True, consistency_window=0.5, max_attempts=3, verify_checks=3, verify_backoff=0.1)
def slow_write(args: Hold, ctx: CallContext) -> dict[str, Any]:
    """Hold the attempt open, then commit: the commit lands at the end, as a slow upstream's."""
    c = client()
    c.rpush(f"lease:attempts:{ctx.operation_ref}", ctx.attempt)
    time.sleep(args.seconds)
    c.rpush(f"lease:effects:{ctx.operation_ref}", ctx.attempt)
    return {"held": args.seconds, "attempt": ctx.attempt}


@slow_write.verifier
def find_slow_write(ctx: CallContext) -> dict[str, Any] | None:
    c = client()
    c.incr(f"lease:verifications:{ctx.operation_ref}")
    return {"found": True} if c.exists(f"lease:effects:{ctx.operation_ref}") else None


@tq.tool(writes=True, requires_approval=True)
def approved_write(args: Hold, ctx: CallContext) -> dict[str, Any]:
    """Waits for a person's approval: an operation that stays unfinished."""
    return {"held": args.seconds}


def attempts(c: redis.Redis, ref: str) -> list[int]:
    """The attempts of ``ref`` that reached the tool."""
    return [int(x) for x in c.lrange(f"lease:attempts:{ref}", 0, -1)]


def effects(c: redis.Redis, ref: str) -> list[int]:
    """The attempts of ``ref`` that committed."""
    return [int(x) for x in c.lrange(f"lease:effects:{ref}", 0, -1)]


def verifications(c: redis.Redis, ref: str) -> int:
    return int(c.get(f"lease:verifications:{ref}") or 0)


celery_app = tq.celery
