"""The allowed-transition table, as a table (pure)."""

from __future__ import annotations

import json
from typing import Any

import fakeredis
import pytest

from toolq.adapters.ledger import scripts
from toolq.core.keys import Keys
from toolq.core.states import ALLOWED, INITIAL, SETTLED, TERMINAL, State, allowed, sources
from toolq.decisions.recovery.transition import Guard, Transition

S = State
EXPECTED = {
    (S.QUEUED, S.RUNNING),
    (S.QUEUED, S.QUEUED),
    (S.QUEUED, S.CANCELLED),
    (S.QUEUED, S.ESCALATED),
    (S.QUEUED, S.WAITING_RETRY),  # held back by its dependency key (issue 28)
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
    # an operator's resolution only (RESOLUTIONS)
    (S.ESCALATED, S.SUCCEEDED),
    (S.ESCALATED, S.FAILED),
    (S.ESCALATED, S.QUEUED),
}


@pytest.mark.parametrize("current", list(S))
@pytest.mark.parametrize("target", list(S))
def test_transition_table(current: State, target: State) -> None:
    assert allowed(current, target) is ((current, target) in EXPECTED)


def test_terminal_states_have_no_way_out_but_an_operators_resolution() -> None:
    assert all(not ALLOWED[s] for s in TERMINAL - {S.ESCALATED})
    assert ALLOWED[S.ESCALATED] == {S.SUCCEEDED, S.FAILED, S.QUEUED}
    assert TERMINAL < SETTLED
    with pytest.raises(ValueError, match="only an operator's resolution"):
        Transition(ref="r", states=(S.ESCALATED,), to=S.FAILED, by="t", code="FAILED")
    Transition(ref="r", states=(S.ESCALATED,), to=S.FAILED, by="t", code="RESOLVED_NOT_COMMITTED")


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (S.SUCCEEDED, {S.RUNNING, S.VERIFYING, S.ESCALATED}),
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


def test_a_quiet_update_stays_in_the_state_it_names() -> None:
    # a same-state field update, even where the table has no self-loop
    Transition(ref="r", states=(S.WAITING_RETRY,), to=S.WAITING_RETRY, by="t", quiet=True)
    with pytest.raises(ValueError, match="quiet"):
        Transition(ref="r", states=(S.QUEUED,), to=S.RUNNING, by="t", quiet=True)
    with pytest.raises(ValueError, match="quiet"):
        Transition(ref="r", states=(S.QUEUED, S.VERIFYING), to=S.QUEUED, by="t", quiet=True)


RUNNING_GUARD = Guard(
    ref="r",
    states=(S.RUNNING,),
    by="w1",
    expect={"running": {"attempt": "1", "lease_holder": "w1"}},
    code="RATE_LIMITED",
    delete=("lease_holder", "lease_until"),
)
GUARD_CASES = [
    # guard, where it goes, what the decision adds -> the transition built by hand
    (
        RUNNING_GUARD,
        S.WAITING_RETRY,
        {"due_ms": 5, "set": {"retry_due": "5"}},
        Transition(
            ref="r",
            states=(S.RUNNING,),
            to=S.WAITING_RETRY,
            by="w1",
            code="RATE_LIMITED",
            expect={"running": {"attempt": "1", "lease_holder": "w1"}},
            delete=("lease_holder", "lease_until"),
            due_ms=5,
            set={"retry_due": "5"},
        ),
    ),
    (
        Guard(ref="r", states=(S.VERIFYING,), by="v1", delete=("vholder", "vlease_until")),
        S.QUEUED,
        {"attempt_incr": 1, "push": ("calls", "m"), "stats": ("verify_not_found",)},
        Transition(
            ref="r",
            states=(S.VERIFYING,),
            to=S.QUEUED,
            by="v1",
            delete=("vholder", "vlease_until"),
            attempt_incr=1,
            push=("calls", "m"),
            stats=("verify_not_found",),
        ),
    ),
    (
        Guard(ref="r", states=(S.QUEUED,), by="scheduler", expect={"*": {"rev": "3"}}),
        S.QUEUED,
        {"quiet": True, "due_ms": 9},
        Transition(
            ref="r",
            states=(S.QUEUED,),
            to=S.QUEUED,
            by="scheduler",
            expect={"*": {"rev": "3"}},
            quiet=True,
            due_ms=9,
        ),
    ),
]


@pytest.mark.parametrize(("guard", "to", "adds", "expected"), GUARD_CASES)
def test_a_guard_carries_its_fields_into_each_transition(
    guard: Guard, to: State, adds: dict[str, Any], expected: Transition
) -> None:
    assert guard.to(to, **adds) == expected


def test_a_guard_checks_the_table_as_a_transition_does() -> None:
    with pytest.raises(ValueError, match="not allowed"):
        RUNNING_GUARD.to(S.CANCELLED)


def test_the_scripts_state_tables_are_the_python_ones(fake_redis: fakeredis.FakeRedis) -> None:
    got = json.loads(
        fake_redis.eval(
            scripts.PRELUDE
            + "return cjson.encode({settled = SETTLED, initial = INITIAL, allowed = ALLOWED})",
            0,
        )
    )
    assert set(got["settled"]) == set(SETTLED)
    assert set(got["initial"]) == set(INITIAL)
    assert {State(a): {State(b) for b in to} for a, to in got["allowed"].items()} == ALLOWED


def test_the_scripts_read_their_fixed_keys_in_the_order_they_are_passed(
    fake_redis: fakeredis.FakeRedis,
) -> None:
    k = Keys("p")
    keys = scripts.fixed_keys(k)
    seen = fake_redis.eval(
        scripts.PRELUDE + f"begin(KEYS, ARGV)\nreturn {{{', '.join(scripts.FIXED)}, DEPS}}",
        len(keys),
        *keys,
    )
    assert dict(zip((*scripts.FIXED, "DEPS"), (v.decode() for v in seen), strict=True)) == {
        "DUE": k.due,
        "WAKE": k.wake,
        "SLEEP": k.sleep_until,
        "STATS": k.stats,
        "TOOLS": k.tools,
        "IDX": k.index_prefix,
        "DEP": k.dep_prefix,
        "DEPS": k.deps,  # built from DEP (lua_prelude's begin)
    }


def test_every_ledger_key_carries_the_prefix_as_its_hash_tag() -> None:
    k = Keys("toolq")
    names = [k.op("r/1"), k.due, k.wake, k.sleep_until, k.notify, k.tools]
    names += [k.stats, k.index("send", "queued"), k.schedulers, k.op_prefix, k.index_prefix]
    assert all(n.startswith("{toolq}:") for n in names)
    assert (k.op("r/1"), k.due, k.index("send", "queued")) == (
        "{toolq}:op:r/1",
        "{toolq}:due",
        "{toolq}:idx:send:queued",
    )
    assert k.index("send", "queued") == k.index_prefix + "send:queued"
    assert k.op("r/1") == k.op_prefix + "r/1"
