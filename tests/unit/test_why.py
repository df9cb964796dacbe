"""Why an operation waits (toolq.core.why): the summaries every output shows, as tables."""

from __future__ import annotations

from typing import Any

import pytest

from toolq.core.errors import Unavailable, error_envelope
from toolq.core.own_envelopes import escalation_envelope, fixed_envelope
from toolq.core.record import HistoryEntry, OperationRecord, ms_to_dt
from toolq.core.states import State
from toolq.core.why import (
    REASONS,
    escalation,
    reason_words,
    retry_wait,
    verification,
)
from toolq.edges.cli.operations import _why_lines

S = State
T0 = 1_800_000_000_000
REF = "why/1"


def h(
    at: int, frm: State | None, to: State, by: str = "w", code: str | None = None, **note: str
) -> HistoryEntry:
    return HistoryEntry.model_validate(
        {"at": T0 + at, "from": frm, "to": to, "attempt": 1, "by": by, "code": code, "note": note}
    )


def record(state: State, history: list[HistoryEntry], **fields: Any) -> OperationRecord:
    f = {"ref": REF, "tool": "send", "state": str(state), "attempt": "1", "max_attempts": "3"}
    f.update({k: str(v) for k, v in fields.items()})
    return OperationRecord.from_fields(f, history)


SUBMIT = [h(0, None, S.QUEUED, "submit"), h(1, S.QUEUED, S.RUNNING)]
ENTER = h(5, S.RUNNING, S.VERIFYING, code="OUTCOME_UNKNOWN")
VERIFYING = {"uncertain_at": T0 + 5, "vwindow": T0 + 30_005, "vcheck": 1}


def check(at: int, n: int, result: str, to: State = S.VERIFYING, **more: str) -> HistoryEntry:
    return h(at, S.VERIFYING, to, f"v{n}", None, check=str(n), result=result, **more)


# (name, state, history, fields) -> (checks made, failed, next check, window end, results)
VERIFICATION_TABLE = [
    ("just entered: the first check is published then", S.VERIFYING, [ENTER], VERIFYING,
     (0, 0, T0 + 5, T0 + 30_005, [])),
    ("two unavailable, the next after a backoff", S.VERIFYING,
     [ENTER, check(10, 1, "unavailable", detail="UNAVAILABLE", next=str(T0 + 2_010)),
      check(2_020, 2, "unavailable", detail="UNAVAILABLE", next=str(T0 + 6_020))],
     {**VERIFYING, "vfail": 2},
     (2, 2, T0 + 6_020, T0 + 30_005, ["unavailable", "unavailable"])),
    ("not found too early: the next at the window's end", S.VERIFYING,
     [ENTER, check(10, 1, "not_found", detail="TOO_EARLY", next=str(T0 + 30_005))],
     VERIFYING, (1, 0, T0 + 30_005, T0 + 30_005, ["not_found"])),
    ("verify now after a failure: published at once", S.VERIFYING,
     [ENTER, check(10, 1, "unavailable", next=str(T0 + 2_010)),
      h(500, S.VERIFYING, S.VERIFYING, "operator:verify", "VERIFY_NOW")],
     VERIFYING, (1, 1, T0 + 500, T0 + 30_005, ["unavailable", "asked"])),
    ("found: no next check", S.SUCCEEDED,
     [ENTER, check(10, 1, "unavailable", next="1"), check(2_010, 2, "found", S.SUCCEEDED)],
     VERIFYING, (2, 1, None, T0 + 30_005, ["unavailable", "found"])),
    ("a record from before notes: no check rows, still a verification", S.VERIFYING,
     [ENTER], {"uncertain_at": T0 + 5, "vcheck": 1}, (0, 0, T0 + 5, None, [])),
]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "history", "fields", "expected"),
    [row[1:] for row in VERIFICATION_TABLE],
    ids=[row[0] for row in VERIFICATION_TABLE],
)
def test_verification_summary(
    state: State,
    history: list[HistoryEntry],
    fields: dict[str, Any],
    expected: tuple[int, int, int | None, int | None, list[str]],
) -> None:
    v = verification(record(state, SUBMIT + history, **fields))
    assert v is not None
    got = (v.checks_made, v.failed, v.next_check_ms, v.window_end_ms, [c.result for c in v.checks])
    assert got == expected


def test_no_verification_for_an_operation_never_verifying() -> None:
    assert verification(record(S.RUNNING, SUBMIT)) is None


def test_the_window_left_counts_down_to_zero() -> None:
    v = verification(record(S.VERIFYING, [*SUBMIT, ENTER], **VERIFYING))
    assert v is not None
    assert (
        v.window_left_s(T0 + 5),
        v.window_left_s(T0 + 20_005),
        v.window_left_s(T0 + 90_000),
    ) == (
        30.0,
        10.0,
        0.0,
    )


@pytest.mark.parametrize(
    ("result", "detail", "next_ms", "words"),
    [
        ("found", "", None, "found: the write happened"),
        (
            "not_found",
            "TOO_EARLY",
            5,
            "not found, too early to believe: checks again when the window ends",
        ),
        (
            "not_found",
            "",
            None,
            "not found after the consistency window: runs again, same operation_ref",
        ),
        ("not_found", "ATTEMPTS_EXHAUSTED", None, "not found: ATTEMPTS_EXHAUSTED"),
        (
            "unavailable",
            "UNAVAILABLE reason=maintenance",
            5,
            "verifier unavailable: checks again later",
        ),
        ("unavailable", "UNAVAILABLE", None, "verifier unavailable"),
    ],
)
def test_each_check_in_words(result: str, detail: str, next_ms: int | None, words: str) -> None:
    more = {"detail": detail} if detail else {}
    if next_ms is not None:
        more["next"] = str(next_ms)
    v = verification(
        record(S.VERIFYING, [*SUBMIT, ENTER, check(10, 1, result, **more)], **VERIFYING)
    )
    assert v is not None and [(c.detail, c.words) for c in v.checks] == [(detail, words)]


def test_a_verify_now_says_who_asked() -> None:
    asked = h(500, S.VERIFYING, S.VERIFYING, "console:ops:verify", "VERIFY_NOW")
    v = verification(record(S.VERIFYING, [*SUBMIT, ENTER, asked], **VERIFYING))
    assert v is not None and v.checks[0].words == "check asked for now by console:ops:verify"


def test_a_waiting_retry_shows_its_last_failure_and_budget() -> None:
    env = error_envelope(
        Unavailable(code="PROVIDER_DOWN", retry_after=30, reason="maintenance"),
        writes=False,
        operation_ref=REF,
        operation="send",
        call_id=None,
        attempts_remaining=1,
        now=ms_to_dt(T0),
    )
    rec = record(S.WAITING_RETRY, SUBMIT, attempt=2, envelope=env.model_dump_json())
    w = retry_wait(rec)
    assert w is not None
    assert (w.code, w.safe_details, w.attempts_used, w.attempts_left, w.not_before_ms) == (
        "PROVIDER_DOWN",
        {"reason": "maintenance", "retry_after": "30.0"},
        2,
        1,
        T0 + 30_000,
    )
    assert retry_wait(record(S.RUNNING, SUBMIT)) is None


@pytest.mark.parametrize(
    ("code", "reason", "cause", "words"),
    [
        ("VERIFICATION_UNAVAILABLE", None, None, REASONS["VERIFICATION_UNAVAILABLE"]),
        (
            "ATTEMPTS_EXHAUSTED",
            "UNAVAILABLE",
            "UNAVAILABLE",
            REASONS["ATTEMPTS_EXHAUSTED"] + " The last failure: UNAVAILABLE.",
        ),
        (
            "OUTCOME_UNVERIFIABLE",
            "LEASE_EXPIRED",
            "LEASE_EXPIRED",
            REASONS["OUTCOME_UNVERIFIABLE"] + " The last failure: LEASE_EXPIRED.",
        ),
        ("DEADLINE_EXCEEDED", None, None, REASONS["DEADLINE_EXCEEDED"]),
    ],
)
def test_an_escalation_says_why_in_words_and_what_was_tried(
    code: str, reason: str | None, cause: str | None, words: str
) -> None:
    details = {"reason": reason} if reason else None
    env = fixed_envelope(code, REF, "send", None, details)
    hist = [*SUBMIT, ENTER, check(10, 1, "unavailable"), check(20, 2, "unavailable", S.ESCALATED)]
    e = escalation(record(S.ESCALATED, hist, envelope=env.model_dump_json(), **VERIFYING))
    assert e is not None
    tried = (e.attempts_used, e.max_attempts, e.checks_made, e.checks_failed)
    assert (e.code, e.cause, e.words, tried) == (code, cause, words, (1, 3, 2, 2))


def test_every_escalation_code_toolq_writes_has_words() -> None:
    codes = (
        "VERIFICATION_UNAVAILABLE",
        "OUTCOME_UNVERIFIABLE",
        "ATTEMPTS_EXHAUSTED",
        "DEADLINE_EXCEEDED",
        "RETRY_BEYOND_DEADLINE",
        "APPROVAL_TIMEOUT",
        "INPUT_TIMEOUT",
    )
    for code in codes:
        escalation_envelope(code, REF, "send", None)  # a code toolq writes
        assert reason_words(code) == REASONS[code]
    assert reason_words("SOMETHING_ELSE") == "Escalated with code SOMETHING_ELSE."


def test_toolq_show_says_why_under_the_timeline() -> None:
    env = error_envelope(
        Unavailable(code="PROVIDER_DOWN", retry_after=30),
        writes=False,
        operation_ref=REF,
        operation="send",
        call_id=None,
        attempts_remaining=1,
        now=ms_to_dt(T0),
    )
    waiting = record(S.WAITING_RETRY, SUBMIT, attempt=2, envelope=env.model_dump_json())
    assert _why_lines(waiting, T0) == [
        "last failure: PROVIDER_DOWN retry_after=30.0; attempts: 2 used, 1 left; "
        "next retry at 08:00:30.000 UTC"
    ]
    down = check(10, 1, "unavailable", detail="UNAVAILABLE", next=str(T0 + 2_010))
    verifying = record(S.VERIFYING, [*SUBMIT, ENTER, down], **VERIFYING)
    assert _why_lines(verifying, T0 + 20_005) == [
        "verification: 1 checks made, 1 failed; next check at 08:00:02.010 UTC; "
        "consistency window: 10 s left"
    ]
    esc = fixed_envelope("VERIFICATION_UNAVAILABLE", REF, "send", None)
    escalated = record(S.ESCALATED, [*SUBMIT, ENTER], envelope=esc.model_dump_json())
    assert _why_lines(escalated, T0)[1:] == [
        f"escalated: {REASONS['VERIFICATION_UNAVAILABLE']}",
        "tried: 1 of 3 attempts, 0 verification checks (0 failed)",
    ]


# (history, state) -> approved: an APPROVED entry, whoever made it, whatever came after
APPROVED_TABLE = [
    ([h(0, None, S.AWAITING_APPROVAL, "submit")], S.AWAITING_APPROVAL, False),
    ([h(0, None, S.AWAITING_APPROVAL, "submit"),
      h(1, S.AWAITING_APPROVAL, S.CANCELLED, "openai-agents:reject", "CANCELLED")],
     S.CANCELLED, False),
    ([h(0, None, S.AWAITING_APPROVAL, "submit"),
      h(1, S.AWAITING_APPROVAL, S.ESCALATED, "scheduler", "APPROVAL_TIMEOUT")],
     S.ESCALATED, False),
    ([h(0, None, S.AWAITING_APPROVAL, "submit"),
      h(1, S.AWAITING_APPROVAL, S.QUEUED, "operator:approve", "APPROVED")], S.QUEUED, True),
    ([h(0, None, S.AWAITING_APPROVAL, "submit"),
      h(1, S.AWAITING_APPROVAL, S.QUEUED, "langgraph:approve", "APPROVED"),
      h(2, S.QUEUED, S.RUNNING), h(3, S.RUNNING, S.SUCCEEDED)], S.SUCCEEDED, True),
]  # fmt: skip


@pytest.mark.parametrize(("history", "state", "approved"), APPROVED_TABLE)
def test_a_record_says_whether_toolq_approved_it(
    history: list[HistoryEntry], state: State, approved: bool
) -> None:
    assert record(state, history).approved is approved
