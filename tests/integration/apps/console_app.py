"""A tool app for the console's browser tests: one tool per thing an operator acts on.

- ``publish`` needs approval, and can be held at two gates (its run and its
  verifier) and lose its reply once, so a test watches it go queued -> running
  -> verifying -> succeeded on the operation page.
- ``charge`` needs corrected input when the amount is not positive.
- ``notify`` always loses its reply, and its verifier's first lookup fails: it
  waits two minutes for its next check, unless an operator says "verify now".
- ``ping`` is rate limited for ten minutes on its first attempt: it waits to retry
  until an operator says "retry now".

Effects live in the test's own Redis (``posts:<ref>``, ``charges:<ref>``), so the
verifiers look them up by ``operation_ref``.
"""

from __future__ import annotations

from typing import Any, Literal

import redis
from pydantic import BaseModel, Field

from tests.integration.apps.store import ProcessClient
from toolq import CallContext, ToolQueue
from toolq.core import errors
from toolq.core.settings import LeaseSettings, RecoverySettings, SchedulerSettings, ToolqSettings

APP = "tests.integration.apps.console_app:tq"

tq = ToolQueue(
    settings=ToolqSettings(
        lease=LeaseSettings(seconds=3.0),
        recovery=RecoverySettings(unclaimed_after=5.0, approval_timeout=600, input_timeout=600),
        scheduler=SchedulerSettings(hold=2.0, max_sleep=0.5),
    ),
    name="console-test",
)

store = ProcessClient(tq)

#: How long a gated step waits for its gate before going on anyway.
GATE_TIMEOUT_S = 30


def open_gate(client: redis.Redis, ref: str, step: Literal["run", "verify"]) -> None:
    """Let the held ``run`` (or ``verify``) step of ``ref`` go on."""
    client.lpush(f"gate:{ref}:{step}", "open")


class Post(BaseModel):
    text: str = Field(max_length=200)
    #: Hold the attempt, and the verifier, until the test opens their gates.
    gate: bool = False
    #: The first attempt writes, then loses its reply: the outcome is unknown.
    lose_reply: bool = False


@tq.tool(writes=True, requires_approval=True, consistency_window=0.5, max_attempts=3)
def publish(args: Post, ctx: CallContext) -> dict[str, Any]:
    """Publish a post; needs approval."""
    if args.gate:
        store().blpop([f"gate:{ctx.operation_ref}:run"], timeout=GATE_TIMEOUT_S)
    store().set(f"posts:{ctx.operation_ref}", args.text)
    if args.lose_reply and ctx.attempt == 1:
        raise errors.OutcomeUnknown("the reply was lost on the way back")
    return {"post": ctx.operation_ref}


@publish.verifier
def find_post(ctx: CallContext) -> dict[str, Any] | None:
    if getattr(ctx.args, "gate", False):
        store().blpop([f"gate:{ctx.operation_ref}:verify"], timeout=GATE_TIMEOUT_S)
    return {"post": ctx.operation_ref} if store().exists(f"posts:{ctx.operation_ref}") else None


class Charge(BaseModel):
    amount: int = Field(le=1_000_000, description="In cents; more than 0.")
    currency: Literal["EUR", "USD"] = "EUR"
    memo: str | None = Field(default=None, max_length=40)
    #: The provider's key: the console never shows it, and keeps it when left empty.
    api_key: str | None = None


@tq.tool(writes=True, consistency_window=0.5, max_attempts=3)
def charge(args: Charge, ctx: CallContext) -> dict[str, Any]:
    """Charge an amount; needs a positive one."""
    if args.amount <= 0:
        raise errors.InvalidInput(field="amount", rule="positive")
    store().set(f"charges:{ctx.operation_ref}", args.amount)
    return {"charged": args.amount, "currency": args.currency}


@charge.verifier
def find_charge(ctx: CallContext) -> dict[str, Any] | None:
    raw = store().get(f"charges:{ctx.operation_ref}")
    return None if raw is None else {"charged": int(raw)}


class Notice(BaseModel):
    text: str = Field(max_length=200)


@tq.tool(writes=True, consistency_window=0.5, max_attempts=3, verify_backoff=120.0)
def notify(args: Notice, ctx: CallContext) -> dict[str, Any]:
    """Sends a notice, then loses the reply: its outcome is always verified."""
    store().set(f"notices:{ctx.operation_ref}", args.text)
    raise errors.OutcomeUnknown("the reply was lost on the way back")


@notify.verifier
def find_notice(ctx: CallContext) -> dict[str, Any] | None:
    # The first lookup fails: the next check is two minutes away, unless an operator
    # asks for one now.
    if store().incr(f"notice-lookups:{ctx.operation_ref}") == 1:
        raise ConnectionError("the lookup failed")
    return {"notice": ctx.operation_ref} if store().exists(f"notices:{ctx.operation_ref}") else None


class Ping(BaseModel):
    host: str = Field(max_length=100)


@tq.tool(writes=False, max_attempts=3)
def ping(args: Ping, ctx: CallContext) -> dict[str, Any]:
    """Rate limited for ten minutes on the first attempt; fine on the next."""
    if ctx.attempt == 1:
        raise errors.RateLimited(retry_after=600)
    return {"host": args.host, "attempt": ctx.attempt}


celery_app = tq.celery
