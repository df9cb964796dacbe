"""The operation record as callers see it (``tq.get``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from toolq.core.envelope import ToolError, ToolSuccess, parse_envelope
from toolq.core.states import PENDING_RECOVERY, SETTLED, TERMINAL, State


def ms_to_dt(ms: int | float) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def load_envelope(raw: str | bytes | ToolSuccess | ToolError) -> ToolSuccess | ToolError:
    """Parse an envelope the ledger stored: it was checked against its tool's
    allowlist when it was written, so its own ``safe_details`` keys are allowed.
    An envelope already parsed (``tq.aio.watch``'s ``event.envelope``) is returned as is."""
    if isinstance(raw, ToolSuccess | ToolError):
        return raw
    data = json.loads(raw)
    keys = frozenset((data.get("safe_details") or {}).keys())
    return parse_envelope(data, safe_detail_keys=keys)


class HistoryEntry(BaseModel):
    """One transition, as appended by the ledger's scripts."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    at: int
    from_: State | None = Field(default=None, alias="from")
    to: State
    attempt: int = 0
    by: str = ""
    code: str | None = None
    #: Extra words the transition wrote (a verification check's result, ...): safe words only.
    note: dict[str, str] = Field(default_factory=dict)

    @property
    def at_time(self) -> datetime:
        return ms_to_dt(self.at)


class OperationRecord(BaseModel):
    model_config = ConfigDict(frozen=True)

    operation_ref: str
    tool: str
    args: dict[str, Any]
    call_id: str | None
    state: State
    attempt: int
    max_attempts: int
    created_at: datetime
    updated_at: datetime
    entered_at: datetime
    deadline: datetime | None
    lease_holder: str | None
    lease_until: datetime | None
    envelope: ToolSuccess | ToolError | None
    history: list[HistoryEntry]
    #: The record's revision: an operator action may name the one it was decided on.
    rev: int = 0
    #: Attempts operators added after an escalation (``tq.resolve(..., "retry")``).
    operator_retries: int = 0
    #: Verification (:mod:`toolq.core.why` sums it up): the number of the check last
    #: published, the checks failed in a row, when the outcome became unknown, and
    #: when that verification's consistency window ends (None: never verified).
    vcheck: int = 0
    vfail: int = 0
    uncertain_at: datetime | None = None
    window_end: datetime | None = None

    @property
    def settled(self) -> bool:
        return self.state in SETTLED

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def pending_recovery(self) -> bool:
        return self.state in PENDING_RECOVERY

    @property
    def approved(self) -> bool:
        """Whether someone approved it in toolq (an ``APPROVED`` entry in its history):
        a later rejection elsewhere cannot undo it (docs/integrations.md)."""
        return any(h.code == "APPROVED" for h in self.history)

    @classmethod
    def from_fields(cls, f: dict[str, str], history: list[HistoryEntry]) -> OperationRecord:
        def ms(name: str) -> int:
            return int(float(f.get(name) or 0))

        raw_env = f.get("envelope")
        return cls(
            operation_ref=f["ref"],
            tool=f["tool"],
            args=json.loads(f.get("args") or "{}"),
            call_id=f.get("call_id") or None,
            state=State(f["state"]),
            attempt=int(f.get("attempt") or 0),
            max_attempts=int(f.get("max_attempts") or 0),
            created_at=ms_to_dt(ms("created")),
            updated_at=ms_to_dt(ms("updated")),
            entered_at=ms_to_dt(ms("entered")),
            deadline=ms_to_dt(ms("deadline")) if ms("deadline") else None,
            lease_holder=f.get("lease_holder") or None,
            lease_until=ms_to_dt(ms("lease_until")) if ms("lease_until") else None,
            envelope=load_envelope(raw_env) if raw_env else None,
            history=history,
            rev=int(f.get("rev") or 0),
            operator_retries=int(f.get("op_retries") or 0),
            vcheck=int(f.get("vcheck") or 0),
            vfail=int(f.get("vfail") or 0),
            uncertain_at=ms_to_dt(ms("uncertain_at")) if ms("uncertain_at") else None,
            window_end=ms_to_dt(ms("vwindow")) if ms("vwindow") else None,
        )


class OperationSummary(BaseModel):
    """One row of a list of operations in a state (``tq.aio.list_operations``).

    Read from the state's index (the entry time) and a few fields of the
    record; the arguments, history and envelope stay with :class:`OperationRecord`.
    """

    model_config = ConfigDict(frozen=True)

    operation_ref: str
    tool: str
    state: State
    #: When the operation entered ``state`` (ms since the epoch): the index's score.
    entered_ms: int
    attempt: int
    max_attempts: int
    #: The code of the operation's latest envelope (``RATE_LIMITED``, ...); None for a success.
    code: str | None = None
    #: The envelope's ``retry.not_before`` (ms): the earliest the caller was told to retry.
    not_before_ms: int | None = None
    #: When the scheduler looks at the operation next (ms; None: nothing is due for it):
    #: a waiting retry's dispatch, a verification's next check, an approval's timeout.
    due_ms: int | None = None
    #: When the operation was submitted (ms); None from a ledger that did not say.
    created_ms: int | None = None

    def duration_ms(self, now_ms: int) -> int | None:
        """Submitted to finished (a terminal state), or to ``now_ms`` while it is not."""
        if self.created_ms is None:
            return None
        end = self.entered_ms if self.state in TERMINAL else now_ms
        return max(0, end - self.created_ms)


class OperationPage(BaseModel):
    """A page of :class:`OperationSummary`, oldest first unless asked otherwise.

    ``next_cursor`` continues after the last index entry this page examined;
    None when there is nothing after it. ``total`` is the number of operations
    the list holds (under the ``older_than`` bound), None when a filter the
    index cannot count (``code``, ``ref_contains``) is set. A filtered read
    examines a bounded number of entries: ``partial`` says it stopped there
    before the page was full (more may match past ``next_cursor``).
    """

    model_config = ConfigDict(frozen=True)

    items: list[OperationSummary]
    next_cursor: str | None
    #: The page before this one (None on the first page, or when there is none).
    prev_cursor: str | None = None
    total: int | None
    partial: bool = False
    #: Index entries examined for this page.
    scanned: int = 0
