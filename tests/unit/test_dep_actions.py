"""An operator's actions on a dependency key, and a key's view: pure, as tables."""

from __future__ import annotations

import json

import pytest

from toolq.adapters.ledger.dep_state import due_calls, limits_of, needs_attention, view_of
from toolq.adapters.ledger.lua_dep_ops import DEP_ACT
from toolq.core.deps import Limits
from toolq.core.layout import Cells, SingleTag
from toolq.decisions.dep_actions import (
    BREAKER_CLOSED,
    CLOSABLE,
    MAX_SPREAD_MS,
    MIN_SPREAD_MS,
    NOT_PAUSED,
    DepAction,
    Refusal,
    check_reason,
    due_times,
    refusal,
    spread_ms,
)
from toolq.edges.deps_text import limit_text, paused_text, seconds_text, status_line

NOW = 1_700_000_000_000
LIFT, CLOSE = DepAction.LIFT, DepAction.CLOSE


@pytest.mark.parametrize(
    ("action", "paused_until", "breaker", "refused"),
    [
        (LIFT, NOW + 1, "closed", None),
        (LIFT, NOW + 30_000, "open", None),
        (LIFT, NOW, "closed", NOT_PAUSED),  # ends now: nothing left to lift
        (LIFT, NOW - 5, "closed", NOT_PAUSED),
        (LIFT, None, "open", NOT_PAUSED),
        (CLOSE, None, "open", None),
        (CLOSE, NOW + 9, "half_open", None),
        (CLOSE, None, "closed", BREAKER_CLOSED),
        (CLOSE, NOW + 9, "closed", BREAKER_CLOSED),
    ],
)
def test_an_action_applies_only_to_what_is_there(
    action: DepAction, paused_until: int | None, breaker: str, refused: Refusal | None
) -> None:
    got = refusal(action, paused_until_ms=paused_until, breaker=breaker, now_ms=NOW)
    assert got == refused


def test_the_lua_closes_exactly_the_breakers_the_table_does() -> None:
    assert {"open", "half_open"} == CLOSABLE
    assert "local CLOSABLE = {['half_open'] = true, ['open'] = true}" in DEP_ACT


@pytest.mark.parametrize(
    ("waiting", "spread"),
    [(0, MIN_SPREAD_MS), (1, MIN_SPREAD_MS), (20, 100), (100, 500), (400, 2000), (10**6, 2000)],
)
def test_the_held_back_calls_spread_with_their_number_within_bounds(
    waiting: int, spread: int
) -> None:
    assert spread_ms(waiting) == spread
    assert MIN_SPREAD_MS <= spread <= MAX_SPREAD_MS


def test_due_times_are_now_plus_a_jitter_within_the_spread_and_repeatable() -> None:
    refs = [f"r{i}" for i in range(300)]
    timed = due_times(refs, NOW, seed=7)
    assert [r for r, _ in timed] == refs
    assert all(NOW <= ms < NOW + spread_ms(300) for _, ms in timed)
    assert len({ms for _, ms in timed}) > 100  # spread, not one instant
    assert timed == due_times(refs, NOW, seed=7)


def test_due_calls_go_to_each_refs_cell_in_batches() -> None:
    refs = [f"run/{i}" for i in range(1200)]
    single = due_calls(SingleTag("tq"), "stripe", refs, NOW, seed=1)
    assert [len(args) for _, args in single] == [3 + 1000, 3 + 1000, 3 + 400]
    assert all(keys[-1] == "{tq}:op:" for keys, _ in single)
    cells = Cells("tq", 8)
    for keys, args in due_calls(cells, "stripe", refs, NOW, seed=1):
        assert args[2] == "stripe"
        cell_refs = args[3::2]
        assert {cells.keys_of(r).op_prefix for r in cell_refs} == {keys[-1]}


@pytest.mark.parametrize(
    ("reason", "ok"), [("provider back", True), ("  x  ", True), ("", False), ("   ", False),
                       (None, False), ("y" * 501, False)],
)  # fmt: skip
def test_a_reason_is_required_and_bounded(reason: object, ok: bool) -> None:
    if ok:
        assert check_reason(reason) == str(reason).strip()
    else:
        with pytest.raises(ValueError):
            check_reason(reason)


@pytest.mark.parametrize(
    ("fields", "limits"),
    [
        ({}, Limits()),
        ({"rate": "20/s", "burst": "5", "concurrency": "3"}, Limits(rate="20/s", burst=5,
                                                                  concurrency=3)),
        ({"breaker_failures": "7", "breaker_window_ms": "10000", "breaker_open_ms": "2500"},
         Limits(breaker_failures=7, breaker_window=10, breaker_open=2.5)),
        ({"rate": "nonsense", "concurrency": "2"}, Limits(concurrency=2)),
        ({"burst": "0", "concurrency": "x"}, Limits()),
    ],
)  # fmt: skip
def test_the_limits_read_from_the_hash(fields: dict[str, str], limits: Limits) -> None:
    assert limits_of(fields) == limits


def test_a_view_shows_a_pause_only_while_it_runs_and_the_breaker_as_stored() -> None:
    log = json.dumps([{"at": NOW, "by": "cli:ann", "what": "close", "why": "back"}])
    fields = {
        "paused_until": str(NOW + 5000),
        "pause_code": "RATE_LIMITED",
        "breaker": "half_open",
        "open_until": str(NOW - 1),
        "probe": "run/1",
        "n_admitted": "12",
        "n_limited": "4",
        "op_log": log,
    }
    v = view_of("stripe", None, fields, in_flight=2, waiting=3, last_used=b"17", now_ms=NOW)
    assert (v.paused_until_ms, v.pause_code, v.breaker, v.probe) == (
        NOW + 5000,
        "RATE_LIMITED",
        "half_open",
        "run/1",
    )
    assert (v.admitted, v.limited, v.in_flight, v.waiting, v.last_used_ms) == (12, 4, 2, 3, 17)
    assert [a.by for a in v.actions] == ["cli:ann"]
    assert needs_attention(v)
    ended = view_of(
        "stripe", 3, {**fields, "paused_until": str(NOW), "breaker": "weird"}, 0, 0, None, NOW
    )
    assert (ended.paused_until_ms, ended.pause_code, ended.breaker, ended.probe) == (
        None,
        None,
        "closed",
        None,
    )
    assert not needs_attention(ended)


@pytest.mark.parametrize(
    ("limits", "text"),
    [
        (Limits(), "-"),
        (Limits(rate="20/s"), "20/s"),
        (Limits(rate="20/s", burst=5, concurrency=2), "20/s burst 5, 2 at once"),
        ({"concurrency": 4}, "4 at once"),
    ],
)
def test_limit_text(limits: Limits, text: str) -> None:
    assert limit_text(limits) == text


@pytest.mark.parametrize(
    ("ms", "text"), [(-3, "0ms"), (850, "850ms"), (12_400, "12s"), (245_000, "4m05s"),
                     (7_800_000, "2h10m")],
)  # fmt: skip
def test_seconds_text(ms: int, text: str) -> None:
    assert seconds_text(ms) == text


def test_the_status_line_names_what_needs_a_look() -> None:
    assert paused_text(None, NOW) == "-"
    dep = {"key": "stripe", "paused_until_ms": NOW + 30_000, "pause_code": "RATE_LIMITED",
           "breaker": "open", "waiting": 12, "in_flight": 0}  # fmt: skip
    assert status_line(dep, NOW) == (
        "stripe: paused 30s (RATE_LIMITED) breaker OPEN 12 waiting, 0 in flight"
    )
