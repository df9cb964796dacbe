"""The allowed-transition table, as a table (pure)."""

from __future__ import annotations

import pytest

from toolq.recovery.transition import Transition
from toolq.states import ALLOWED, SETTLED, TERMINAL, State, allowed, sources

S = State
EXPECTED = {
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.QUEUED),
    (S.QUEUED, S.CANCELLED),
    (S.QUEUED, S.ESCALATED),
    (S.RUNNING, S.SUCCEEDED),
    (S.RUNNING, S.FAILED),
    (S.RUNNING, S.WAITING_RETRY),
    (S.RUNNING, S.NEEDS_INPUT),
    (S.RUNNING, S.AWAITING_APPROVAL),
    (S.RUNNING, S.VERIFYING),
    (S.RUNNING, S.ESCALATED),
    (S.RUNNING, S.QUEUED),
    (S.WAITING_RETRY, S.QUEUED),
    (S.WAITING_RETRY, S.ESCALATED),
    (S.WAITING_RETRY, S.CANCELLED),
    (S.NEEDS_INPUT, S.QUEUED),
    (S.NEEDS_INPUT, S.ESCALATED),
    (S.NEEDS_INPUT, S.CANCELLED),
    (S.AWAITING_APPROVAL, S.QUEUED),
    (S.AWAITING_APPROVAL, S.ESCALATED),
    (S.AWAITING_APPROVAL, S.CANCELLED),
    (S.VERIFYING, S.VERIFYING),
    (S.VERIFYING, S.SUCCEEDED),
    (S.VERIFYING, S.QUEUED),
    (S.VERIFYING, S.ESCALATED),
}


@pytest.mark.parametrize("current", list(S))
@pytest.mark.parametrize("target", list(S))
def test_transition_table(current: State, target: State) -> None:
    assert allowed(current, target) is ((current, target) in EXPECTED)


def test_terminal_states_have_no_way_out() -> None:
    assert all(not ALLOWED[s] for s in TERMINAL)
    assert TERMINAL < SETTLED


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (S.SUCCEEDED, {S.RUNNING, S.VERIFYING}),
        (S.CANCELLED, {S.QUEUED, S.WAITING_RETRY, S.NEEDS_INPUT, S.AWAITING_APPROVAL}),
        (S.RUNNING, {S.QUEUED}),
    ],
)
def test_sources(target: State, expected: set[State]) -> None:
    assert set(sources(target)) == expected


def test_a_disallowed_transition_cannot_be_built() -> None:
    with pytest.raises(ValueError, match="not allowed"):
        Transition(ref="r", states=(S.VERIFYING,), to=S.FAILED, by="t")
    with pytest.raises(ValueError, match="not allowed"):
        Transition(ref="r", states=(S.SUCCEEDED,), to=S.QUEUED, by="t")
    # a verified write never goes back to running without a new attempt
    with pytest.raises(ValueError):
        Transition(ref="r", states=(S.VERIFYING,), to=S.RUNNING, by="t")
