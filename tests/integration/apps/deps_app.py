"""A tool app for limits per dependency (issue 28): tools that call a fake provider.

The "provider" is the test's own Redis: every call the provider sees is a timestamp
pushed to ``provider:seen:<tool>`` (ms) and a count of calls in flight
(``provider:inflight:<tool>``, its peak in ``provider:peak:<tool>``), so a test counts
what reached the provider, whatever the ledger says.
"""

from __future__ import annotations

import time

from pydantic import BaseModel

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.core.settings import LeaseSettings, RecoverySettings, SchedulerSettings, ToolqSettings

APP = "tests.integration.apps.deps_app:tq"

settings = ToolqSettings(
    lease=LeaseSettings(seconds=2.0),
    recovery=RecoverySettings(unclaimed_after=1.0, approval_timeout=60, input_timeout=60),
    scheduler=SchedulerSettings(hold=2.0, max_sleep=0.2),
)
tq = ToolQueue(name="deps-test", settings=settings)

tq.limit("rated", rate="10/s")
tq.limit("narrow", concurrency=2)
tq.limit("flaky", breaker_failures=2, breaker_window=30, breaker_open=1)

provider = ProcessClient(tq)


class Args(BaseModel):
    n: int = 0
    sleep: float = 0.0
    account: str = "a"


def seen(tool: str) -> None:
    provider().rpush(f"provider:seen:{tool}", int(time.time() * 1000))


@tq.tool(writes=False, dependency="rated", max_attempts=1)
def rated(args: Args, ctx: CallContext) -> int:
    """At most 10/s across every worker."""
    seen("rated")
    return args.n


@tq.tool(writes=False, dependency="narrow", max_attempts=1)
def narrow(args: Args, ctx: CallContext) -> int:
    """At most 2 in flight across every worker; takes ``sleep`` seconds."""
    p = provider()
    now = p.incr("provider:inflight:narrow")
    p.execute_command("EVAL", _PEAK, 1, "provider:peak:narrow", now)
    try:
        seen("narrow")
        time.sleep(args.sleep)
    finally:
        p.decr("provider:inflight:narrow")
    return args.n


_PEAK = "if tonumber(ARGV[1]) > tonumber(redis.call('GET', KEYS[1]) or '0') then " \
    "redis.call('SET', KEYS[1], ARGV[1]) end"  # fmt: skip


@tq.tool(writes=False, dependency="busy", max_attempts=2)
def busy(args: Args, ctx: CallContext) -> int:
    """The provider answers 429 (retry after 1 s) to its first call and to every call
    in the second after it (counted in ``provider:429:busy``)."""
    seen("busy")
    p = provider()
    now = int(time.time() * 1000)
    p.set("provider:busy:until", now + 1000, nx=True)
    if now < int(p.get("provider:busy:until") or 0):
        p.incr("provider:429:busy")
        raise errors.RateLimited(retry_after=1.0)
    return args.n


@tq.tool(writes=False, dependency="flaky", max_attempts=5)
def flaky(args: Args, ctx: CallContext) -> int:
    """Down while ``provider:down`` is set."""
    seen("flaky")
    if provider().get("provider:down"):
        raise errors.Unavailable()
    return args.n


@tq.tool(writes=False, dependency=lambda a: f"acct:{a.account}", deadline=1.5, max_attempts=2)
def per_account(args: Args, ctx: CallContext) -> int:
    """A key per account, a deadline of 1.5 s."""
    seen("per_account")
    return args.n


@tq.tool(writes=False, dependency=lambda a: f"acct:{a.account}", max_attempts=2)
def account(args: Args, ctx: CallContext) -> int:
    """A key per account."""
    seen("account")
    return args.n


@tq.tool(writes=False, dependency=lambda a: "no key!" if a.n else str(1 / a.n), max_attempts=1)
def bad_key(args: Args, ctx: CallContext) -> int:
    """Its key function raises for n=0, returns no key (a bool) otherwise."""
    return args.n


@tq.tool(writes=False)
def plain(args: Args, ctx: CallContext) -> int:
    """No dependency."""
    return args.n


celery_app = tq.celery
