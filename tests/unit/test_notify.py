"""Notices: what the ledger publishes on a settled transition, and how ``wait`` uses it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from pydantic import BaseModel

from tests.helpers import wait_until
from toolq import ToolQueue
from toolq.adapters.notify import Notice, parse_notice
from toolq.core import errors


@pytest.mark.parametrize(
    ("text", "ref", "notice"),
    [
        ('succeeded a/1\n4\n{"ok":true}', "a/1", Notice("succeeded", 4, '{"ok":true}')),
        ("awaiting_approval a/1\n1\n", "a/1", Notice("awaiting_approval", 1, "")),
        # an envelope may hold newlines of its own: only the first two split
        ('failed r\n7\n{"x":\n"y"}', "r", Notice("failed", 7, '{"x":\n"y"}')),
        # the older form, without a revision: wake and read again
        ("succeeded a/1", "a/1", None),
        ("succeeded a/1\nnot-a-rev\n{}", "a/1", None),
    ],
)
def test_a_notice_parses_into_ref_state_revision_and_envelope(
    text: str, ref: str, notice: Notice | None
) -> None:
    assert parse_notice(text) == (ref, notice)


class Args(BaseModel):
    n: int = 0


@pytest.fixture
def tq(fake_redis: fakeredis.FakeRedis) -> Iterator[ToolQueue]:
    q = ToolQueue(redis_url="redis://fake:6379/0")
    q.app._redis = fake_redis

    @q.tool
    def noop(args: Args) -> dict[str, int]:
        return {"n": args.n}

    yield q
    q.close()


def _count_reads(tq: ToolQueue) -> list[tuple[str, ...]]:
    reads: list[tuple[str, ...]] = []
    real = tq.ledger.fields

    def counted(ref: str, *names: str) -> dict[str, str]:
        reads.append(names)
        return real(ref, *names)

    tq.ledger.fields = counted  # type: ignore[method-assign]
    return reads


def _wait_in_thread(tq: ToolQueue, ref: str) -> tuple[threading.Thread, list[Any]]:
    got: list[Any] = []
    t = threading.Thread(target=lambda: got.append(tq.wait(ref, timeout=10)))
    t.start()
    return t, got


def test_wait_takes_the_outcome_from_the_notice_without_reading_again(tq: ToolQueue) -> None:
    ref = tq.submit("noop", {"n": 3}).operation_ref
    reads = _count_reads(tq)
    t, got = _wait_in_thread(tq, ref)
    assert wait_until(lambda: reads, 10, 0.01)  # the waiter subscribed and read "queued"
    assert tq.runtime.run_attempt(ref, 1) == "succeeded"
    t.join(10)
    assert got and got[0].ok and got[0].result == {"n": 3}
    assert len(reads) == 1


def test_a_stale_notice_is_not_taken_for_the_outcome(tq: ToolQueue) -> None:
    # Given a waiter that has read revision r of a running operation
    ref = tq.submit("noop", {"n": 1}).operation_ref
    reads = _count_reads(tq)
    t, got = _wait_in_thread(tq, ref)
    assert wait_until(lambda: reads, 10, 0.01)
    rev = int(tq.ledger.fields(ref, "rev")["rev"])  # counted: reads == 2
    # When a notice of an older revision arrives (published before the read)
    stale = f'failed {ref}\n{rev}\n{{"ok":false}}'
    tq.redis.spublish(tq.ledger.keys.notify, stale)
    # Then the waiter reads the record again and keeps waiting for the real outcome
    assert wait_until(lambda: len(reads) == 3, 10, 0.01)
    assert not got
    assert tq.runtime.run_attempt(ref, 1) == "succeeded"
    t.join(10)
    assert got and got[0].ok and got[0].result == {"n": 1}


def test_a_ref_with_a_trailing_newline_is_refused(tq: ToolQueue) -> None:
    with pytest.raises(errors.InvalidArguments):
        tq.submit("noop", {}, operation_ref="run/1\n")
