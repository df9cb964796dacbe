"""A tool app for what a user sees when things go wrong: exit codes, worker log lines."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from toolq import ToolQueue
from toolq.core import errors
from toolq.core.classify import classify_exception

APP = "tests.integration.apps.cli_app:tq"
#: What the ``leak`` tool's exception carries; no log line may repeat it.
TOKEN = "sk-live-abcdef0123456789abcdef"

tq = ToolQueue(name="cli-test")


class Text(BaseModel):
    text: str = Field(default="hi", max_length=100)


@tq.tool(writes=False)
def echo(args: Text) -> dict[str, str]:
    """Return the text."""
    return {"text": args.text}


@tq.tool(writes=False, max_attempts=1)
def leak(args: Text) -> dict[str, Any]:
    """Fail unexpectedly, with a credential in the message (escalated: a read, no retry left)."""
    raise RuntimeError(f"upstream said: token {TOKEN}")


@tq.tool(writes=False, max_attempts=1)
def dropped(args: Text) -> dict[str, Any]:
    """Lose the connection, classified as an adapter does it (a routine failure)."""
    try:
        raise ConnectionResetError(104, "Connection reset by peer")
    except ConnectionResetError as exc:
        raise classify_exception(exc, writes=False) from exc


@tq.tool(writes=False, max_attempts=3)
def limited(args: Text) -> dict[str, Any]:
    """Rate limited for ten minutes: waits in waiting_retry (no scheduler runs in these tests)."""
    raise errors.RateLimited(retry_after=600)


@tq.tool(writes=True, requires_approval=True)
def transfer(args: Text) -> dict[str, str]:
    """A write that waits for a person's approval first."""
    return {"sent": args.text}


class Login(BaseModel):
    user: str
    password: str
    api_key: str
    note: str = Field(max_length=2000)


@tq.tool(writes=True, requires_approval=True)
def login(args: Login) -> dict[str, str]:
    """A write whose arguments carry secrets; it waits for approval (shown redacted)."""
    return {"user": args.user}


#: ``celery -A tests.integration.apps.cli_app:celery_app worker`` serves these tools too.
celery_app = tq.celery
