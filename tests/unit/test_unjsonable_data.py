"""Data JSON cannot hold, from a caller or a tool, is refused where it enters.

A lone surrogate (``"\\ud800"``: Python's json and the in-memory MCP client pass
it, UTF-8 refuses it) and NaN or an infinity (a float field takes ``"inf"``).
Arguments and an operator's result are refused as ``InvalidArguments`` with
nothing written; a tool's result as the attempt's failure, recorded at once,
not when the record is written (that raised after the tool ran, and the
operation sat in ``running`` until its lease ran out). On fakeredis.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from pydantic import BaseModel

from tests.helpers import fail_every_check
from toolq import CallContext, State, ToolQueue
from toolq.core import errors

LONE = "\ud800"


class Args(BaseModel):
    text: str = ""
    amount: float = 1.0
    n: int = 1


@pytest.fixture
def tq(fake_redis: fakeredis.FakeRedis) -> Iterator[ToolQueue]:
    q = ToolQueue(redis_url="redis://fake:6379/0")
    q.app._redis = fake_redis

    @q.tool(writes=False, max_attempts=1)
    def echo(args: Args) -> dict[str, Any]:
        return {"text": args.text}

    @q.tool(writes=True, max_attempts=3)
    def charge(args: Args, ctx: CallContext) -> dict[str, Any]:
        if args.n < 1:
            raise errors.InvalidInput(field="n", rule="positive")
        return {"text": args.text}

    @charge.verifier
    def find(ctx: CallContext) -> None:
        return None

    @q.tool(writes=False, max_attempts=1)
    def crash(args: Args) -> None:
        raise RuntimeError("boom")

    yield q
    q.close()


def records(tq: ToolQueue) -> list[bytes]:
    return sorted(tq.redis.scan_iter(match="*:op:*"))


@pytest.mark.parametrize(
    "args",
    [
        {"text": LONE},
        {"text": f"ok {LONE} ok"},
        {"amount": float("nan")},
        {"amount": float("inf")},
        {"amount": "-inf"},
    ],
)
def test_arguments_json_cannot_hold_are_refused_and_nothing_is_written(
    tq: ToolQueue, args: dict[str, Any]
) -> None:
    with pytest.raises(errors.InvalidArguments, match="not JSON-serialisable"):
        tq.submit("echo", args, operation_ref="bad/1")
    with pytest.raises(errors.InvalidArguments, match="not JSON-serialisable"):
        tq.call("echo", args, operation_ref="bad/2", timeout=0)
    assert records(tq) == []


def test_corrected_arguments_json_cannot_hold_are_refused_and_the_question_stays(
    tq: ToolQueue,
) -> None:
    ref = tq.submit("charge", {"n": 0}, operation_ref="fix/1").operation_ref
    tq.runtime.run_attempt(ref, 1)
    assert tq.get(ref).state is State.NEEDS_INPUT  # type: ignore[union-attr]
    rev = tq.ledger.fields(ref, "rev")["rev"]

    with pytest.raises(errors.InvalidArguments):
        tq.provide_input(ref, {"n": 2, "text": LONE})

    assert tq.ledger.fields(ref, "rev")["rev"] == rev
    assert tq.get(ref).state is State.NEEDS_INPUT  # type: ignore[union-attr]


def test_an_operators_result_json_cannot_hold_is_refused(tq: ToolQueue) -> None:
    ref = tq.submit("crash", {}, operation_ref="esc/1").operation_ref
    tq.runtime.run_attempt(ref, 1)
    assert tq.get(ref).state is State.ESCALATED  # type: ignore[union-attr]

    with pytest.raises(errors.InvalidArguments, match="not JSON data"):
        tq.resolve(ref, "committed", reason="found it", result={"id": LONE})

    assert tq.get(ref).state is State.ESCALATED  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("tool", "state", "code"),
    [
        ("echo", State.ESCALATED, "UPSTREAM_ERROR"),  # a read: a failure of the tool
        ("charge", State.VERIFYING, "OUTCOME_UNKNOWN"),  # a write ran: look it up
    ],
)
def test_a_result_json_cannot_hold_is_the_attempts_failure_recorded_at_once(
    tq: ToolQueue, tool: str, state: State, code: str
) -> None:
    # Given a tool whose result holds a lone surrogate (bytes decoded with surrogateescape)
    tq.registry.get(tool).fn = lambda *_: {"text": b"caf\xe9".decode("utf-8", "surrogateescape")}
    ref = tq.submit(tool, {}, operation_ref=f"res/{tool}").operation_ref

    # When a worker runs it: its record is written, nothing raises past the task
    tq.runtime.run_attempt(ref, 1)

    # Then the attempt is recorded as any result that is not JSON is
    rec = tq.get(ref)
    assert rec is not None and rec.state is state
    assert rec.envelope is not None and rec.envelope.code == code  # type: ignore[union-attr]


@pytest.mark.parametrize("found", [{"id": LONE}, {"id": object()}])
def test_a_verifiers_result_json_cannot_hold_is_a_failed_check(
    tq: ToolQueue, found: dict[str, Any]
) -> None:
    # Given a write whose attempt timed out after sending, and a verifier that finds it
    # but answers what JSON cannot hold
    @tq.tool(writes=True, consistency_window=0, verify_checks=2)
    def send(args: Args) -> None:
        raise TimeoutError("after the request left")

    send.verifier(lambda ctx: found)
    ref = tq.submit("send", {}, operation_ref="verify/1").operation_ref
    tq.runtime.run_attempt(ref, 1)
    assert tq.get(ref).state is State.VERIFYING  # type: ignore[union-attr]

    # When its checks run: each is recorded as a check that failed (it raised past the
    # task before), and the last one escalates
    fail_every_check(tq, ref, 2)

    rec = tq.get(ref)
    assert rec is not None and rec.state is State.ESCALATED
    assert rec.envelope is not None and rec.envelope.code == "VERIFICATION_UNAVAILABLE"  # type: ignore[union-attr]
    assert rec.history[-1].note.get("detail") == "result_not_json"
