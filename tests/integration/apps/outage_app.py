"""A tool app for the record-outage test: a write whose record meets the ledger's
server away. The provider is a directory (``TOOLQ_TEST_PROVIDER_DIR``), not Redis, so
the tool and its verifier work while the server is down: ``hold`` marks that it
started (``started/<ref>``), waits for the test's ``go`` file, commits
(``effects/<ref>``, one line an attempt), and returns.

A test cuts the record's patience to a few seconds (its setting,
``TOOLQ_WORKER__RECORD_PATIENCE_S``), so that its outage outlasts it without taking a
minute.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from toolq import CallContext, ToolQueue
from toolq.core.settings import LeaseSettings, RecoverySettings, SchedulerSettings, ToolqSettings

APP = "tests.integration.apps.outage_app:tq"

tq = ToolQueue(
    settings=ToolqSettings(
        lease=LeaseSettings(seconds=3.0),
        recovery=RecoverySettings(unclaimed_after=5.0),
        scheduler=SchedulerSettings(hold=2.0, max_sleep=0.5),
    ),
    name="outage-test",
)


def _dir(name: str) -> Path:
    d = Path(os.environ.get("TOOLQ_TEST_PROVIDER_DIR", "/tmp")) / name
    d.mkdir(parents=True, exist_ok=True)
    return d


def _name(ref: str) -> str:
    return ref.replace("/", "_")


class Hold(BaseModel):
    wait_for_go: bool = True


@tq.tool(writes=True, consistency_window=0.5, max_attempts=3, verify_checks=5, verify_backoff=0.2)
def hold(args: Hold, ctx: CallContext) -> dict[str, Any]:
    (_dir("started") / _name(ctx.operation_ref)).touch()
    go = _dir("") / "go"
    while args.wait_for_go and not go.exists():
        time.sleep(0.05)
    with (_dir("effects") / _name(ctx.operation_ref)).open("a") as f:
        f.write(f"{ctx.attempt}\n")
    return {"attempt": ctx.attempt}


@hold.verifier
def find_hold(ctx: CallContext) -> dict[str, Any] | None:
    if (_dir("effects") / _name(ctx.operation_ref)).exists():
        return {"found": True}
    return None
