"""The scheduler's pure decisions, as tables, with an injected clock and random source."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toolq.core.states import State
from toolq.core.tools import Jitter
from toolq.decisions.recovery.budget import attempts_remaining
from toolq.decisions.recovery.policy import (
    Action,
    Queues,
    Snapshot,
    Timeouts,
    decide,
    jittered_due,
    republish_delay_ms,
    sleep_seconds,
    verify_backoff_ms,
)

T = Timeouts(unclaimed_after_ms=60_000, approval_timeout_ms=10_000, input_timeout_ms=20_000)
NOW = 1_000_000


def snap(state: State, **kw: int | str) -> Snapshot:
    base: dict[str, int | str] = dict(
        ref="r",
        state=state,
        tool="t",
        attempt=1,
        max_attempts=3,
        deadline_ms=0,
        lease_until_ms=0,
        entered_ms=NOW,
        vlease_until_ms=0,
        vholder="",
        vcheck=1,
        retry_due_ms=0,
        repubs=0,
        rev=1,
    )
    base.update(kw)
    return Snapshot(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("s", "action", "code", "at"),
    [
        (snap(State.WAITING_RETRY, retry_due_ms=NOW), Action.DISPATCH, None, None),
        (snap(State.WAITING_RETRY, retry_due_ms=NOW + 5), Action.RESCHEDULE, None, NOW + 5),
        (
            snap(State.WAITING_RETRY, retry_due_ms=NOW, attempt=3),
            Action.ESCALATE,
            "ATTEMPTS_EXHAUSTED",
            None,
        ),
        (
            snap(State.WAITING_RETRY, retry_due_ms=NOW, deadline_ms=NOW - 1),
            Action.ESCALATE,
            "DEADLINE_EXCEEDED",
            None,
        ),
        (snap(State.QUEUED), Action.REPUBLISH, None, None),
        # past its deadline a queued operation escalates instead of being published again
        (snap(State.QUEUED, deadline_ms=NOW - 1), Action.ESCALATE, "DEADLINE_EXCEEDED", None),
        (snap(State.QUEUED, deadline_ms=NOW), Action.REPUBLISH, None, None),
        # both spent: the deadline is checked first, on every path
        (
            snap(State.WAITING_RETRY, retry_due_ms=NOW, attempt=3, deadline_ms=NOW - 1),
            Action.ESCALATE,
            "DEADLINE_EXCEEDED",
            None,
        ),
        (snap(State.RUNNING, lease_until_ms=NOW + 1), Action.RESCHEDULE, None, NOW + 1),
        (snap(State.RUNNING, lease_until_ms=NOW), Action.LEASE_EXPIRED, None, None),
        (snap(State.VERIFYING), Action.VERIFY, None, None),
        (
            snap(State.VERIFYING, vholder="w", vlease_until_ms=NOW + 9),
            Action.RESCHEDULE,
            None,
            NOW + 9,
        ),
        (snap(State.VERIFYING, vholder="w", vlease_until_ms=NOW - 1), Action.VERIFY, None, None),
        (
            snap(State.AWAITING_APPROVAL, entered_ms=NOW - 10_000),
            Action.ESCALATE,
            "APPROVAL_TIMEOUT",
            None,
        ),
        (snap(State.AWAITING_APPROVAL, entered_ms=NOW - 1), Action.RESCHEDULE, None, NOW + 9_999),
        (snap(State.NEEDS_INPUT, entered_ms=NOW - 20_000), Action.ESCALATE, "INPUT_TIMEOUT", None),
        (snap(State.SUCCEEDED), Action.DROP, None, None),
        (snap(State.CANCELLED), Action.DROP, None, None),
    ],
)
def test_decide(s: Snapshot, action: Action, code: str | None, at: int | None) -> None:
    d = decide(s, NOW, T)
    assert (d.action, d.code, d.at_ms) == (action, code, at)


LATER = NOW + T.unclaimed_after_ms


@pytest.mark.parametrize(
    ("s", "queues", "action", "at"),
    [
        # published before the oldest waiting message: it left the queue, yet unclaimed
        (snap(State.QUEUED, published_ms=100), Queues(oldest_call_ms=200), Action.REPUBLISH, None),
        # published after it: may be waiting behind a backlog; never double the backlog
        (
            snap(State.QUEUED, published_ms=300),
            Queues(oldest_call_ms=200),
            Action.RESCHEDULE,
            LATER,
        ),
        (
            snap(State.QUEUED, published_ms=200),
            Queues(oldest_call_ms=200),
            Action.RESCHEDULE,
            LATER,
        ),
        (snap(State.QUEUED, published_ms=300), Queues(oldest_call_ms=None), Action.REPUBLISH, None),
        # a verification check outstanding behind a verify backlog
        (
            snap(State.VERIFYING, published_ms=300, vclaimed_ms=100),
            Queues(oldest_verify_ms=250),
            Action.RESCHEDULE,
            LATER,
        ),
        (
            snap(State.VERIFYING, published_ms=300, vclaimed_ms=100),
            Queues(oldest_verify_ms=400),
            Action.VERIFY,
            None,
        ),
        # no check outstanding (the last was taken; a recheck is due): publish one
        (
            snap(State.VERIFYING, published_ms=100, vclaimed_ms=300),
            Queues(oldest_verify_ms=50),
            Action.VERIFY,
            None,
        ),
        # the calls backlog does not hold back verification
        (
            snap(State.VERIFYING, published_ms=300, vclaimed_ms=100),
            Queues(oldest_call_ms=10),
            Action.VERIFY,
            None,
        ),
    ],
)
def test_decide_never_republishes_what_may_still_be_queued(
    s: Snapshot, queues: Queues, action: Action, at: int | None
) -> None:
    d = decide(s, NOW, T, queues)
    assert (d.action, d.at_ms) == (action, at)


@pytest.mark.parametrize(
    ("deadline", "action", "at"),
    [
        # still waiting behind a backlog: looked at again by its deadline, not later
        (NOW + 10, Action.RESCHEDULE, NOW + 11),
        (LATER + 5, Action.RESCHEDULE, LATER),
        # a message still in the queue does not keep an expired operation alive
        (NOW - 1, Action.ESCALATE, None),
    ],
)
def test_a_queued_operation_is_looked_at_by_its_deadline(
    deadline: int, action: Action, at: int | None
) -> None:
    s = snap(State.QUEUED, published_ms=300, deadline_ms=deadline)
    d = decide(s, NOW, T, Queues(oldest_call_ms=200))
    assert (d.action, d.at_ms) == (action, at)


@given(
    not_before=st.integers(0, 10**7),
    now=st.integers(0, 10**7),
    kind=st.sampled_from(["full", "equal", "none"]),
    ratio=st.floats(0, 2),
    cap=st.floats(0, 30),
    seed=st.integers(),
)
def test_jitter_is_never_before_not_before_and_within_bounds(
    not_before: int, now: int, kind: str, ratio: float, cap: float, seed: int
) -> None:
    j = Jitter(kind=kind, ratio=ratio, max_seconds=cap)  # type: ignore[arg-type]
    due = jittered_due(not_before, now, j, random.Random(seed))
    base = max(not_before, now)
    assert base <= due <= base + j.bound_ms(base - now)
    if kind == "equal":
        assert due >= base + j.bound_ms(base - now) // 2


@pytest.mark.parametrize(
    ("kind", "delay", "lo", "hi"),
    [
        ("full", 10_000, 0, 1000),
        ("equal", 10_000, 500, 1000),
        ("none", 10_000, 0, 0),
        ("full", 100_000, 0, 5000),
        ("full", 0, 0, 0),
    ],
)
def test_jitter_table(kind: str, delay: int, lo: int, hi: int) -> None:
    j = Jitter(kind=kind)  # type: ignore[arg-type]
    extras = {j.extra_ms(delay, random.Random(s)) for s in range(200)}
    assert min(extras) >= lo and max(extras) <= hi
    if hi > lo:
        assert len(extras) > 10  # it does spread


def test_a_past_not_before_is_due_now() -> None:
    assert jittered_due(NOW - 5000, NOW, Jitter(), random.Random(1)) == NOW


@pytest.mark.parametrize(
    ("attempt", "max_attempts", "left"), [(1, 5, 4), (5, 5, 0), (6, 5, 0), (0, 1, 1)]
)
def test_attempts_remaining(attempt: int, max_attempts: int, left: int) -> None:
    assert attempts_remaining(attempt, max_attempts) == left


@pytest.mark.parametrize(
    ("fn", "args", "expected"),
    [
        (republish_delay_ms, (1000, 0), 1000),
        (republish_delay_ms, (1000, 3), 8000),
        (republish_delay_ms, (60_000, 40), 3_600_000),
        (verify_backoff_ms, (1.0, 1), 1000),
        (verify_backoff_ms, (1.0, 3), 4000),
        (verify_backoff_ms, (1.0, 30), 300_000),
        (sleep_seconds, (None, NOW, 5.0), 5.0),
        (sleep_seconds, (NOW + 250, NOW, 5.0), 0.25),
        (sleep_seconds, (NOW - 1, NOW, 5.0), 0.0),
    ],
)
def test_delays(fn: object, args: tuple[object, ...], expected: float) -> None:
    assert fn(*args) == expected  # type: ignore[operator]


def test_bad_jitter_is_refused() -> None:
    with pytest.raises(ValueError):
        Jitter(kind="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Jitter(ratio=-1)
