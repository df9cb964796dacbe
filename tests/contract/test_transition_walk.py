"""Every state change a script can make is one the transition table allows.

The Python table (:data:`toolq.core.states.ALLOWED`) is rendered into the scripts;
these walks ask each script for every move, bypassing the Python check, and
read what it did from the record and the history it appends.
"""

from __future__ import annotations

import pytest
import redis

from tests.contract.ops import LEASE, NOW, history, put, submit, unchecked
from toolq.adapters.ledger import Ledger
from toolq.core.states import INITIAL, State, allowed

PAIRS = [(a, b) for a in State for b in State]


def test_apply_moves_a_record_exactly_as_the_table_allows(ledger: Ledger) -> None:
    wrong = []
    for a, b in PAIRS:
        ref = f"walk/{a}/{b}"
        put(ledger, ref, a)
        res = ledger.apply_one(unchecked(ref, (a,), b), NOW)
        got = (
            res,
            ledger.fields(ref, "state")["state"],
            [(h.from_, h.to) for h in history(ledger, ref)],
        )
        want = ("ok", b, [(a, b)]) if allowed(a, b) else (a, a, [])
        if got != want:
            wrong.append((a, b, got))
    assert wrong == []


def test_a_quiet_update_is_applied_only_in_the_state_it_names(ledger: Ledger) -> None:
    wrong = []
    for a, b in PAIRS:
        ref = f"quiet/{a}/{b}"
        put(ledger, ref, a)
        t = unchecked(ref, (a,), b, quiet=True)
        t.set = {"note": "x"}
        res = ledger.apply_one(t, NOW)
        f = ledger.fields(ref, "state", "note")
        got = (res, f["state"], f.get("note"), history(ledger, ref))
        want = ("ok", a, "x", []) if a is b else (a, a, None, [])
        if got != want:
            wrong.append((a, b, got))
    assert wrong == []


def test_every_state_change_a_claim_makes_is_in_the_table(ledger: Ledger) -> None:
    changes: set[tuple[State | None, State]] = set()
    for a in State:
        for kind in ("run", "verify"):
            ref = f"claim/{a}/{kind}"
            put(ledger, ref, a)
            # the first claimer, a second one, and the first one again
            for holder, at in (("w1", NOW), ("w2", NOW + 1), ("w1", NOW + LEASE + 1)):
                ledger.claim(ref, 1, holder, at, LEASE, kind=kind, vcheck=0)
            moves = [(h.from_, h.to) for h in history(ledger, ref)]
            changes.update(moves)
            assert ledger.fields(ref, "state")["state"] == (moves[-1][1] if moves else a)
    assert all(a is not None and allowed(a, b) for a, b in changes), changes
    assert changes == {(State.QUEUED, State.RUNNING)}  # the walk reached the one move a claim makes


def test_submit_creates_only_in_an_initial_state_and_moves_no_existing_one(
    ledger: Ledger,
) -> None:
    for s in State:
        ref = f"new/{s}"
        if s in INITIAL:
            assert submit(ledger, ref, state=s).outcome == "created"
            assert [(h.from_, h.to) for h in history(ledger, ref)] == [(None, s)]
        else:
            with pytest.raises(redis.ResponseError, match="never created"):
                submit(ledger, ref, state=s)
            assert not ledger.redis.exists(ledger.keys.op(ref))
    for s in State:
        ref = f"old/{s}"
        put(ledger, ref, s, submit_fp="fp-1")
        res = submit(ledger, ref)
        assert (res.outcome, res.state) == ("exists", s)
        assert history(ledger, ref) == [] and ledger.fields(ref, "state")["state"] == s
