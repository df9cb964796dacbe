"""Why an operation waits, as data (pure): its verification checks, its last failure
while it waits to retry, its escalation's reason in words.

Computed once here from the record (its fields and its history) and shown by every
output: ``toolq show``, the HTTP API's operation view and event stream, the console's
operation page. The history entries a check writes carry a note
(:attr:`toolq.core.record.HistoryEntry.note`): ``check`` (its number), ``result``
(``found``, ``not_found``, ``unavailable``), ``detail`` (the verifier's safe words, or
``TOO_EARLY``: not found inside the consistency window), ``next`` (ms: when the next
check is due, if one is). An operator's "verify now" is an entry with code
``VERIFY_NOW`` whose ``by`` says who asked.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from toolq.core.envelope import ToolError
from toolq.core.record import HistoryEntry, OperationRecord
from toolq.core.states import State

#: A check's results, as the note spells them.
FOUND, NOT_FOUND, UNAVAILABLE = "found", "not_found", "unavailable"
#: The detail of a "not found" inside the consistency window.
TOO_EARLY = "TOO_EARLY"
#: The code of an operator's "verify now" entry.
VERIFY_NOW = "VERIFY_NOW"

#: An escalation's reason, for the person who must settle it: what happened, in words.
REASONS: dict[str, str] = {
    "VERIFICATION_UNAVAILABLE": (
        "The verifier failed on every check it was allowed: nobody could tell whether "
        "the write happened."
    ),
    "OUTCOME_UNVERIFIABLE": (
        "The write's outcome is unknown and nothing can verify it (the tool has no "
        "verifier, or this process does not know the tool)."
    ),
    "ATTEMPTS_EXHAUSTED": "Every attempt its budget allows was used without success.",
    "DEADLINE_EXCEEDED": "Its deadline passed before it could finish.",
    "RETRY_BEYOND_DEADLINE": "Its next retry would have come after its deadline.",
    "LEASE_EXPIRED": (
        "The worker running it stopped answering (its lease expired) and what it did "
        "cannot be checked."
    ),
    "APPROVAL_TIMEOUT": "Nobody approved it in time.",
    "INPUT_TIMEOUT": "Nobody corrected its arguments in time.",
}


def reason_words(code: str | None) -> str:
    """The sentence for an escalation's code (a code without one: said as it is)."""
    if code is None:
        return "Escalated without a recorded reason."
    return REASONS.get(code, f"Escalated with code {code}.")


class CheckRow(BaseModel):
    """One verification check (or an operator's request for one) from the history."""

    model_config = ConfigDict(frozen=True)

    #: The history index (1-based): the event id of its ``state`` event.
    index: int
    at_ms: int
    attempt: int
    #: The check's number (the record's ``vcheck`` when it was made); 0 if unknown.
    check: int
    #: ``found``, ``not_found``, ``unavailable``; ``asked`` for a "verify now".
    result: str
    #: The verifier's safe words, ``TOO_EARLY``, or the code the verdict recorded.
    detail: str
    #: When the check after this one was due (ms), if it scheduled one.
    next_ms: int | None
    by: str

    @property
    def words(self) -> str:
        """What the check found, in a few words."""
        if self.result == "asked":
            return f"check asked for now by {self.by or 'an operator'}"
        if self.result == FOUND:
            return "found: the write happened"
        if self.result == NOT_FOUND:
            if self.detail == TOO_EARLY:
                return "not found, too early to believe: checks again when the window ends"
            if self.detail:
                return f"not found: {self.detail}"
            return "not found after the consistency window: runs again, same operation_ref"
        if self.result == UNAVAILABLE:
            later = ": checks again later" if self.next_ms else ""
            return f"verifier unavailable{later}"
        if self.result == "escalated":
            return "gave up: escalated"
        return self.result


class VerificationSummary(BaseModel):
    """What verification did and will do for one operation."""

    model_config = ConfigDict(frozen=True)

    #: Checks whose verdict was written (found, not found, unavailable).
    checks_made: int
    #: Of those, the checks whose verifier failed (unavailable).
    failed: int
    #: The record's count of failed checks in a row in the current verification.
    failed_in_a_row: int
    #: When the next check is due (ms): None when none is (not verifying).
    next_check_ms: int | None
    #: When the current verification began (ms), and when its consistency window ends.
    uncertain_at_ms: int | None
    window_end_ms: int | None
    checks: list[CheckRow]

    def window_left_s(self, now_ms: int) -> float | None:
        """Seconds of the consistency window left (0 once it passed; None: unknown)."""
        if self.window_end_ms is None:
            return None
        return max(0.0, (self.window_end_ms - now_ms) / 1000)


_OLD_VERDICTS = {State.SUCCEEDED: FOUND, State.QUEUED: NOT_FOUND, State.ESCALATED: "escalated"}


def check_row(index: int, h: HistoryEntry) -> CheckRow | None:
    """The check an entry records, or None for an entry that is not one."""
    if h.note.get("result"):
        nxt = h.note.get("next", "")
        return CheckRow(
            index=index,
            at_ms=h.at,
            attempt=h.attempt,
            check=_int(h.note.get("check", "")),
            result=h.note["result"],
            detail=h.note.get("detail", ""),
            next_ms=_int(nxt) if nxt else None,
            by=h.by,
        )
    if h.from_ is State.VERIFYING and h.to in _OLD_VERDICTS:
        # written before checks had notes: what the move says, no more
        return CheckRow(
            index=index,
            at_ms=h.at,
            attempt=h.attempt,
            check=0,
            result=_OLD_VERDICTS[h.to],
            detail=h.code if h.to is State.ESCALATED and h.code else "",
            next_ms=None,
            by=h.by,
        )
    if h.from_ is State.VERIFYING and h.to is State.VERIFYING and h.code == VERIFY_NOW:
        check = _int(h.note.get("check", ""))
        return CheckRow(
            index=index,
            at_ms=h.at,
            attempt=h.attempt,
            check=check,
            result="asked",
            detail="",
            next_ms=h.at,
            by=h.by,
        )
    return None


def verification(rec: OperationRecord) -> VerificationSummary | None:
    """The record's verification: None for an operation that was never verifying."""
    history = rec.history
    if rec.uncertain_at is None and not any(h.to is State.VERIFYING for h in history):
        return None
    rows = [r for i, h in enumerate(history, 1) if (r := check_row(i, h)) is not None]
    made = [r for r in rows if r.result != "asked"]
    return VerificationSummary(
        checks_made=len(made),
        failed=sum(r.result == UNAVAILABLE for r in made),
        failed_in_a_row=rec.vfail if rec.state is State.VERIFYING else 0,
        next_check_ms=_next_check(rec) if rec.state is State.VERIFYING else None,
        uncertain_at_ms=_ms(rec.uncertain_at),
        window_end_ms=_ms(rec.window_end),
        checks=rows,
    )


def _next_check(rec: OperationRecord) -> int | None:
    """When the next check of a verifying record is due: the time its last check
    named, or, when the last entry published one (entering ``verifying``, "verify
    now"), that entry's time: the check was sent then."""
    for h in reversed(rec.history):
        if h.to is not State.VERIFYING:
            continue
        nxt = h.note.get("next")
        if nxt:
            return _int(nxt)
        return h.at
    return None


class RetryWait(BaseModel):
    """Why an operation waits to retry: the last failure, its safe details, the budget."""

    model_config = ConfigDict(frozen=True)

    code: str
    safe_details: dict[str, str]
    attempts_used: int
    attempts_left: int
    #: The earliest the retry runs (ms), as the failure's envelope says.
    not_before_ms: int | None


def retry_wait(rec: OperationRecord) -> RetryWait | None:
    env = rec.envelope
    if rec.state is not State.WAITING_RETRY or not isinstance(env, ToolError):
        return None
    nb = env.retry.not_before
    return RetryWait(
        code=env.code,
        safe_details={k: _word(v) for k, v in (env.safe_details or {}).items()},
        attempts_used=rec.attempt,
        attempts_left=max(0, rec.max_attempts - rec.attempt),
        not_before_ms=None if nb is None else int(nb.timestamp() * 1000),
    )


class Escalation(BaseModel):
    """Why an operation was escalated, in words, and what was tried before."""

    model_config = ConfigDict(frozen=True)

    code: str | None
    #: The code behind it (``ATTEMPTS_EXHAUSTED``'s failure), when the envelope says.
    cause: str | None
    words: str
    attempts_used: int
    max_attempts: int
    checks_made: int
    checks_failed: int


def escalation(rec: OperationRecord) -> Escalation | None:
    if rec.state is not State.ESCALATED:
        return None
    env = rec.envelope
    code = env.code if isinstance(env, ToolError) else None
    if code is None:  # the history's last entry says why, when the envelope cannot
        code = rec.history[-1].code if rec.history else None
    cause = None
    if isinstance(env, ToolError) and env.safe_details:
        reason = env.safe_details.get("reason")
        cause = reason if isinstance(reason, str) and reason else None
    v = verification(rec)
    words = reason_words(code)
    if cause:
        words += f" The last failure: {cause}."
    return Escalation(
        code=code,
        cause=cause,
        words=words,
        attempts_used=rec.attempt,
        max_attempts=rec.max_attempts,
        checks_made=0 if v is None else v.checks_made,
        checks_failed=0 if v is None else v.failed,
    )


def _int(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return 0


def _ms(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp() * 1000)


def _word(value: object) -> str:
    return value if isinstance(value, str) else str(value)


def explain(rec: OperationRecord, now_ms: int) -> dict[str, Any]:
    """Why ``rec`` waits, as JSON every output adds to the record (``toolq show --json``,
    the API's operation view): ``verification``, ``retry``, ``escalation``, each only
    where it applies. Times are ms since the epoch."""
    out: dict[str, Any] = {}
    v = verification(rec)
    if v is not None:
        body = v.model_dump(exclude={"checks"})
        body["window_left_s"] = v.window_left_s(now_ms)
        body["checks"] = [{**c.model_dump(), "words": c.words} for c in v.checks]
        out["verification"] = body
    w = retry_wait(rec)
    if w is not None:
        out["retry"] = w.model_dump()
    e = escalation(rec)
    if e is not None:
        out["escalation"] = e.model_dump()
    return out
