"""The README's code blocks marked ``<!-- doc-test: NAME -->`` run here as they are shown.

``conditional-approval``: a tool that asks for approval only above 10,000 cents; the
approved run (``ctx.approved``) goes through. tests/integration/test_resolutions.py runs
the same tool with a real worker: one approval, one write.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from toolq import CallContext, ToolQueue, errors

README = Path(__file__).resolve().parents[2] / "README.md"


def block(name: str) -> str:
    """The python block that follows the marker ``<!-- doc-test: name ...-->``."""
    text = README.read_text(encoding="utf-8")
    found = re.search(rf"<!-- doc-test: {name}\b[^>]*-->\n```python\n(.*?)\n```", text, re.S)
    assert found, f"no doc-test block {name!r} in the README"
    return found.group(1)


class Bank:
    def __init__(self) -> None:
        self.paid: list[tuple[int, str]] = []

    def pay(self, cents: int, idempotency_key: str) -> dict[str, Any]:
        self.paid.append((cents, idempotency_key))
        return {"paid": cents}


def context(args: BaseModel, approved: bool) -> CallContext:
    return CallContext(
        operation_ref="run_1/step_1",
        tool="payout",
        call_id=None,
        attempt=2 if approved else 1,
        max_attempts=5,
        approved=approved,
        args=args,
    )


def test_conditional_approval_asks_only_above_the_limit_and_lets_the_approved_run_pay() -> None:
    bank = Bank()
    ns: dict[str, Any] = {
        "BaseModel": BaseModel,
        "CallContext": CallContext,
        "errors": errors,
        "tq": ToolQueue(redis_url="redis://127.0.0.1:1/0"),  # never connected: registers only
        "bank": bank,
    }
    exec(block("conditional-approval"), ns)
    payout, model = ns["payout"], ns["Payout"]

    small = model(amount_cents=500)
    assert payout(small, context(small, approved=False)) == {"paid": 500}
    large = model(amount_cents=25_000)
    with pytest.raises(errors.NeedsApproval):
        payout(large, context(large, approved=False))
    assert payout(large, context(large, approved=True)) == {"paid": 25_000}
    assert bank.paid == [(500, "run_1/step_1"), (25_000, "run_1/step_1")]
    ns["tq"].close()


def test_traces_the_readmes_provider_setup_turns_toolqs_tracing_on() -> None:
    from tests.otel import _reset
    from toolq.process import tracing

    _reset()
    ns: dict[str, Any] = {}
    try:
        assert not tracing.enabled()
        exec(compile(block("traces"), "README.md", "exec"), ns)
        assert tracing.enabled()
        with tracing.submitting("send_invoice") as span:
            assert span.carrier().startswith("00-")
    finally:
        # The block's console exporter writes to this test's captured stdout: flushed
        # and shut down here, not at the interpreter's exit (a closed file by then).
        if "provider" in ns:
            ns["provider"].shutdown()
        _reset()
