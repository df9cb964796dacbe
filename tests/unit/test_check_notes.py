"""Every verdict of a verification check carries its note (toolq.decisions.recovery.outcome):
which check, what it found, the verifier's safe detail, when the next check is due."""

from __future__ import annotations

from typing import Any

import pytest

from toolq.client.queue import ToolQueue
from toolq.core import errors
from toolq.core.states import State
from toolq.core.tools import Tool
from toolq.decisions.recovery import outcome
from toolq.decisions.recovery.transition import Transition

S = State
NOW = 1_800_000_000_000
POLICY = outcome.Policy(
    unclaimed_after_ms=1000, approval_timeout_ms=50_000, input_timeout_ms=50_000, retention_s=60
)
MESSAGES = outcome.Messages(
    run=lambda ref, attempt: ("calls", f"run:{ref}:{attempt}"),
    verify=lambda ref, attempt, vcheck: ("verify", f"verify:{ref}:{attempt}:{vcheck}"),
)

_tq = ToolQueue(redis_url="redis://unused/0")


@_tq.tool(
    name="send",
    writes=True,
    max_attempts=3,
    consistency_window=30,
    verify_checks=3,
    verify_backoff=2,
    safe_details=["provider"],
)
def send() -> None: ...


@send.verifier
def find(ctx: Any) -> None: ...


SEND: Tool[Any] = _tq.registry.get("send")


def check(
    vcheck: int = 2, vfail: int = 0, attempt: int = 1, uncertain_at: int = NOW
) -> outcome.Check:
    return outcome.Check(
        ref="r",
        tool=SEND,
        call_id="c",
        attempt=attempt,
        max_attempts=3,
        deadline_ms=0,
        vcheck=vcheck,
        vfail=vfail,
        uncertain_at_ms=uncertain_at,
        holder="v:1:x",
    )


def unavailable(vfail: int) -> Transition:
    exc = errors.Unavailable(
        "upstream said: secret=hunter2", code="PROVIDER_DOWN", provider="acme", token="x"
    )
    detail = errors.safe_words(exc, SEND.options.safe_details)
    return outcome.verifier_failed(check(vfail=vfail), NOW + 10, POLICY, detail)


def note(result: str, detail: str = "", nxt: int | None = None) -> dict[str, str]:
    out = {"check": "2", "result": result} | ({"detail": detail} if detail else {})
    return out | ({"next": str(nxt)} if nxt is not None else {})


DOWN = "PROVIDER_DOWN provider=acme"  # the code and the allowlisted detail, nothing else

# name -> (transition, (to, quiet, note))
TABLE: dict[str, tuple[Transition, tuple[State, bool, dict[str, str]]]] = {
    "found": (
        outcome.verified_found(check(), {"id": 1}, NOW + 10, POLICY),
        (S.SUCCEEDED, False, note("found")),
    ),
    "not found inside the window: again at its end": (
        outcome.verified_not_found(check(), NOW + 10, POLICY, MESSAGES),
        (S.VERIFYING, True, note("not_found", "TOO_EARLY", NOW + 30_000)),
    ),
    "not found past the window: runs again": (
        outcome.verified_not_found(check(), NOW + 40_000, POLICY, MESSAGES),
        (S.QUEUED, False, note("not_found")),
    ),
    "not found past the window, no attempt left": (
        outcome.verified_not_found(check(attempt=3), NOW + 40_000, POLICY, MESSAGES),
        (S.ESCALATED, False, note("not_found", "ATTEMPTS_EXHAUSTED")),
    ),
    "unavailable: again after a backoff": (
        unavailable(vfail=0),
        (S.VERIFYING, True, note("unavailable", DOWN, NOW + 10 + 2_000)),
    ),
    "unavailable the last allowed time: escalated": (
        unavailable(vfail=2),
        (S.ESCALATED, False, note("unavailable", DOWN)),
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", list(TABLE))
def test_each_verdict_notes_its_check(name: str) -> None:
    t, expected = TABLE[name]
    assert (t.to, t.quiet, t.note) == expected


def test_a_verifiers_words_never_carry_its_message() -> None:
    exc = RuntimeError("Traceback: password=hunter2 at https://x")
    assert errors.safe_words(exc) == "UPSTREAM_ERROR"
    assert "hunter2" not in str(unavailable(0).note)


def test_entering_verification_records_when_its_window_ends() -> None:
    u = outcome.Uncertain("r", SEND, "c", 1, 0)
    guard = outcome.Guard(ref="r", states=(S.RUNNING,), by="w", code="OUTCOME_UNKNOWN")
    t = outcome.enter_verifying(u, NOW, POLICY, MESSAGES, base=guard)
    assert (t.set["uncertain_at"], t.set["vwindow"]) == (str(NOW), str(NOW + 30_000))
