"""The APPLY item a transition becomes (toolq.adapters.ledger.wire), without a server."""

from __future__ import annotations

import json
from typing import Any

import pytest

from toolq.adapters.ledger.scripts import ITEM_HEAD
from toolq.adapters.ledger.wire import InlinePush, ScriptArgs
from toolq.core.keys import Keys
from toolq.core.states import State
from toolq.decisions.recovery.transition import Guard, Transition

S = State
NOTE = {"check": "2", "result": "unavailable", "detail": "UPSTREAM_DOWN"}


def item(t: Transition) -> tuple[dict[str, Any], list[str]]:
    """The item's head fields by name, and the blobs the call passes."""
    _, argv = ScriptArgs(Keys("tq"), InlinePush()).apply([t], 1_000)
    items = json.loads(argv[2])
    assert items[0] == 1
    return dict(zip(ITEM_HEAD, items[1 : 1 + len(ITEM_HEAD)], strict=True)), argv[3:]


def quiet_check(note: dict[str, str] | None) -> Transition:
    guard = Guard(ref="r/1", states=(S.VERIFYING,), by="v")
    return guard.to(S.VERIFYING, quiet=True, set={"vfail": "1"}, note=note)


def test_without_a_note_the_item_is_what_it_always_was() -> None:
    t = quiet_check(None)
    head, blobs = item(t)
    assert (head["quiet"], blobs, t.note) == (True, [], {})
    _, argv = ScriptArgs(Keys("tq"), InlinePush()).apply([t], 1_000)
    # not one byte more than before notes existed
    head = '[1,"r/1","verifying","v",false,true,0,0,false,0,0,0,false,'
    assert argv[2] == head + '1,"verifying",0,1,"vfail","1",0,0]'


@pytest.mark.parametrize(
    ("quiet", "to", "slot"),
    [(True, S.VERIFYING, -1), (False, S.SUCCEEDED, 1)],
)
def test_a_note_is_a_blob_named_in_the_quiet_slot_negative_when_quiet(
    quiet: bool, to: State, slot: int
) -> None:
    guard = Guard(ref="r/1", states=(S.VERIFYING,), by="v")
    head, blobs = item(guard.to(to, quiet=quiet, note=NOTE))
    assert head["quiet"] == slot
    assert json.loads(blobs[abs(slot) - 1]) == NOTE


def test_the_note_blob_follows_the_envelope_and_messages_blobs() -> None:
    t = Transition(
        ref="r/1",
        states=(S.VERIFYING,),
        to=S.QUEUED,
        by="v",
        push=("q", "message"),
        note={"check": "1", "result": "not_found"},
    )
    head, blobs = item(t)
    assert blobs[head["push_message"] - 1] == "message"
    assert json.loads(blobs[head["quiet"] - 1]) == {"check": "1", "result": "not_found"}


def test_a_note_holds_words_only() -> None:
    with pytest.raises(TypeError):
        Transition(
            ref="r", states=(S.VERIFYING,), to=S.VERIFYING, by="v", quiet=True, note={"n": 1}
        )  # type: ignore[dict-item]
