"""What the agent-framework adapter tests share (one module per framework).

The ``agents_tq`` fixture (tests/integration/conftest.py) points
:mod:`tests.integration.apps.agents_app` at the module's own database and runs
one real worker (threads pool) and one scheduler for it, for the whole module.
``effects`` and ``attempts`` read what the provider recorded;
``assert_retried_after_not_before`` checks the scheduler's retry of a rate limit;
``run_async`` runs a coroutine on a new event loop and closes ``tq.aio``'s
connections on it after; ``run_example`` runs one of ``examples/``.
``assert_no_upstream_text`` checks what a model read for the failing upstream's
text; the ``*_INVOICE`` arguments are what each framework's model sends to
``create_invoice`` to be told to fix its input.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Awaitable, Callable
from typing import TypeVar, cast

from tests.helpers import REPO_ROOT, run_aio, toolq_env
from tests.integration import conftest
from tests.integration.apps.agents_app import APP, SECRET
from toolq import State, ToolQueue

T = TypeVar("T")

__all__ = [
    "APP",
    "BAD_INVOICE",
    "GOOD_INVOICE",
    "SECRET",
    "TOO_BIG_INVOICE",
    "assert_no_upstream_text",
    "assert_retried_after_not_before",
    "attempts",
    "effects",
    "run_async",
    "run_example",
]

#: Arguments ``create_invoice``'s model refuses: three fields to fix.
BAD_INVOICE = {"customer_id": "bob", "amount_cents": 0, "currency": "GBP"}
#: Arguments the model accepts and the tool refuses (its own rule on amount_cents).
TOO_BIG_INVOICE = {"customer_id": "cus_abcd", "amount_cents": 5_000_000, "currency": "EUR"}
GOOD_INVOICE = {"customer_id": "cus_abcd", "amount_cents": 1200, "currency": "EUR"}


def effects(tq: ToolQueue, ref: str) -> int:
    """Side effects the provider committed under ``ref``."""
    return conftest.effects(tq.redis, ref)


def attempts(tq: ToolQueue, ref: str) -> list[int]:
    """The attempt numbers the provider was called with under ``ref``, in order."""
    return [int(x) for x in tq.redis.lrange(f"provider:attempts:{ref}", 0, -1)]


def run_async(tq: ToolQueue, body: Callable[[], Awaitable[T]]) -> T:
    """``body()`` on a new event loop, ``tq.aio`` closed on it after."""
    return cast(T, run_aio(tq, body))


def assert_retried_after_not_before(tq: ToolQueue, ref: str) -> None:
    """The second attempt of a rate-limited ``notify`` was queued by the scheduler no
    sooner than the limit's ``not_before`` (1 s), by the operation's history and the
    retry's due time the ledger kept (``retry_due``: not_before plus jitter)."""
    rec = tq.get(ref)
    assert rec is not None
    started = next(h for h in rec.history if h.to is State.RUNNING and h.attempt == 1)
    requeued = next(h for h in rec.history if h.to is State.QUEUED and h.attempt == 2)
    due = int(tq.ledger.fields(ref, "retry_due")["retry_due"])
    # not_before counts from when the worker decided the failure: after attempt 1 began,
    # and before the waiting_retry entry's own stamp (when it was recorded), so neither
    # entry's distance to the requeue is exactly 1 s; the due time is what it waits for.
    assert due - started.at >= 1000
    assert requeued.at >= due


def assert_no_upstream_text(seen: str) -> None:
    """Nothing of ``lookup_customer``'s upstream error is in ``seen`` (what a model read):
    not its secret, nor its text (which also tries to instruct the model)."""
    for leaked in (SECRET, "sk-live", "ignore previous instructions", "CRM said"):
        assert leaked not in seen


def run_example(name: str, redis_url: str | None = None) -> str:
    """``examples/<name>`` run as a user runs it, on ``redis_url``'s server (else on the
    embedded one it starts itself): what it printed, once it exited 0."""
    done = subprocess.run(
        [sys.executable, str(REPO_ROOT / "examples" / name)],
        env=toolq_env({"TOOLQ_REDIS_URL": redis_url} if redis_url else None),
        cwd=str(REPO_ROOT),
        capture_output=True,
        text=True,
        timeout=100,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout
