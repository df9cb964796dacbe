"""A result longer than the ledger keeps (``limits.max_result_bytes``): the ledger holds
every result in the server's memory for the retention and sends it whole to the agent,
so a tool that returned 10 MB filled both. On fakeredis, with a limit of 1,000 bytes.

A read's attempt fails as any result that cannot be kept does (escalated: the tool
needs a fix); a write, which ran, goes to verification; a verifier's or an operator's
result past the limit is refused the same way. Nothing of the result reaches a log
line or an envelope: only its size."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from pydantic import BaseModel

from tests.helpers import fail_every_check
from toolq import CallContext, State, ToolQueue
from toolq.core import errors
from toolq.core.settings import LimitSettings
from toolq.core.tools.data import ResultTooLarge, jsonable

LIMIT = 1000


class Args(BaseModel):
    size: int = 10
    found: int = 500


@pytest.fixture
def tq(fake_redis: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch) -> Iterator[ToolQueue]:
    monkeypatch.setenv("TOOLQ_LIMITS__MAX_RESULT_BYTES", str(LIMIT))
    q = ToolQueue(redis_url="redis://fake:6379/0")
    q.app._redis = fake_redis

    @q.tool(writes=False, max_attempts=3)
    def fetch(args: Args) -> dict[str, Any]:
        return {"body": "x" * args.size}

    @q.tool(writes=True, max_attempts=3, consistency_window=0, verify_checks=2)
    def export(args: Args, ctx: CallContext) -> dict[str, Any]:
        return {"body": "x" * args.size}

    @export.verifier
    def find(ctx: CallContext) -> dict[str, Any]:
        return {"found": "y" * int(ctx.args.found)}

    yield q
    q.close()


def _stored_with(text: str, tq: ToolQueue) -> list[bytes]:
    """The ledger's keys holding ``text`` anywhere (strings, hashes, lists, streams)."""
    r = tq.redis
    found = []
    for key in r.scan_iter():
        kind = r.type(key)
        if kind == b"string":
            values = [r.get(key)]
        elif kind == b"hash":
            values = list(r.hgetall(key).values())
        elif kind == b"list":
            values = r.lrange(key, 0, -1)
        elif kind == b"stream":
            values = [v for _, e in r.xrange(key) for v in e.values()]
        else:
            values = []
        if any(text.encode() in (v or b"") for v in values):
            found.append(key)
    return found


@pytest.mark.parametrize(
    ("value", "limit", "fits"),
    [
        ({"a": "x" * 10}, 100, True),
        ({"a": "x" * 92}, 100, True),  # {"a":"..."} is 8 bytes around it: 100 exactly
        ({"a": "x" * 93}, 100, False),
        ({"a": "é" * 46}, 100, True),  # bytes of UTF-8, not characters: 92
        ({"a": "é" * 47}, 100, False),
        ({"a": "x" * 10_000}, None, True),  # no limit given
    ],
)
def test_the_limit_is_on_the_results_json_in_bytes(
    value: dict[str, str], limit: int | None, fits: bool
) -> None:
    if fits:
        assert jsonable(value, limit) == value
    else:
        with pytest.raises(ResultTooLarge) as caught:
            jsonable(value, limit)
        assert caught.value.limit == limit and caught.value.size > limit
        assert "x" * 20 not in str(caught.value) and "é" not in str(caught.value)


def test_the_default_is_one_mebibyte_and_at_least_64() -> None:
    assert LimitSettings().max_result_bytes == 1024 * 1024
    with pytest.raises(ValueError, match="max_result_bytes"):
        LimitSettings(max_result_bytes=10)


def test_a_result_within_the_limit_is_kept(tq: ToolQueue) -> None:
    ref = tq.submit("fetch", {"size": 900}, operation_ref="fits/1").operation_ref
    tq.runtime.run_attempt(ref, 1)
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.SUCCEEDED
    assert rec.envelope is not None and rec.envelope.result == {"body": "x" * 900}  # type: ignore[union-attr]


def test_a_reads_result_past_the_limit_escalates_and_no_log_carries_it(
    tq: ToolQueue, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a read that returns 2,000 bytes of body
    ref = tq.submit("fetch", {"size": 2000}, operation_ref="big/read").operation_ref
    # When a worker runs it
    with caplog.at_level(logging.INFO):
        tq.runtime.run_attempt(ref, 1)
    # Then the attempt failed, in a code of its own, as an unexpected error of the tool
    # does: escalated, not retried (the same call returns the same), nothing stored
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.ESCALATED
    env = rec.envelope
    assert env is not None and not env.ok
    assert env.commit_state.value == "not_committed"  # type: ignore[union-attr]
    assert env.code == "RESULT_TOO_LARGE" and env.next_action.value == "escalate"  # type: ignore[union-attr]
    assert not _stored_with("x" * 1000, tq)
    # ... and the log says why, in sizes
    logged = caplog.text  # the lines and their tracebacks, formatted
    assert (
        "tool fetch: big/read attempt 1: RESULT_TOO_LARGE: the result's JSON is 2011 bytes, "
        "over the 1000 the ledger keeps (TOOLQ_LIMITS__MAX_RESULT_BYTES)"
    ) in logged, logged
    assert "x" * 100 not in logged


def test_a_writes_result_past_the_limit_goes_to_verification_and_its_lookup_is_kept(
    tq: ToolQueue,
) -> None:
    # Given a write that ran and returned 2,000 bytes; its verifier finds it, in 500
    ref = tq.submit("export", {"size": 2000}, operation_ref="big/write").operation_ref
    tq.runtime.run_attempt(ref, 1)
    # Then it is not said done nor failed: it ran, so it is looked up
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.VERIFYING
    assert rec.envelope is not None and rec.envelope.code == "OUTCOME_UNKNOWN"  # type: ignore[union-attr]
    assert not _stored_with("x" * 1000, tq)
    # When the check runs with a verifier whose answer fits
    vcheck = int(tq.ledger.fields(ref, "vcheck")["vcheck"])
    tq.runtime.run_check(ref, 1, vcheck)
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.SUCCEEDED
    assert rec.envelope.result == {"found": "y" * 500}  # type: ignore[union-attr]


def test_a_verifiers_result_past_the_limit_is_a_failed_check(tq: ToolQueue) -> None:
    # Given a write sent to verification, and a verifier that answers 2,000 bytes
    ref = tq.submit("export", {"size": 2000, "found": 2000}, operation_ref="big/check")
    ref = ref.operation_ref
    tq.runtime.run_attempt(ref, 1)
    # When its checks run: each fails, the last escalates, the detail names the size
    fail_every_check(tq, ref, 2)
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.ESCALATED
    assert rec.history[-1].note.get("detail") == "result_too_large"


def test_an_operators_result_past_the_limit_is_refused(tq: ToolQueue) -> None:
    ref = tq.submit("fetch", {"size": 2000}, operation_ref="big/op").operation_ref
    tq.runtime.run_attempt(ref, 1)
    assert tq.get(ref).state is State.ESCALATED  # type: ignore[union-attr]
    with pytest.raises(errors.InvalidArguments, match="over 1000 bytes"):
        tq.resolve(ref, "committed", reason="found it", result={"id": "x" * 2000})
    assert tq.get(ref).state is State.ESCALATED  # type: ignore[union-attr]
