"""What tools raise, what toolq's API refuses, and how failures become envelopes.

One root, two branches::

    ToolqError                      root of everything toolq raises or reads
    ├── ToolFailure                 raised by a tool; maps to an envelope (FAILURE_TABLE)
    │   ├── InvalidInput(field=, rule=)      validation     -> needs_input
    │   ├── NeedsApproval                    authorization  -> awaiting_approval
    │   ├── ForbiddenScope                   authorization  -> failed
    │   ├── NotFound                         conflict       -> failed
    │   ├── Conflict(current_state_ref=)     conflict       -> failed
    │   ├── RateLimited(retry_after=)        dependency     -> waiting_retry
    │   ├── Unavailable(retry_after=None)    dependency     -> waiting_retry
    │   ├── OutcomeUnknown                   dependency     -> verifying (writes),
    │   │                                                      waiting_retry (reads)
    │   └── Misconfigured                    internal       -> failed (nothing was sent)
    └── RequestRefused              raised by toolq's API to its caller; carries ``code``
        ├── UnknownTool                      (and its envelope where one applies)
        ├── InvalidArguments
        │   └── InvalidDependencyKey         not a dependency key's shape (toolq.core.deps)
        ├── IdempotencyKeyReused
        ├── OperationNotFound
        ├── UnknownDependency                no dependency key by that name in the ledger
        ├── InvalidState
        │   ├── StaleRevision                the operation moved on since the operator read it
        │   ├── OperatorRetriesSpent         an escalated write's operator retries are used up
        │   └── DependencyActionRefused      lifting a pause that is not there, closing a
        │                                    closed breaker (code NOT_PAUSED, BREAKER_CLOSED)
        ├── LedgerFormat                     the ledger is stored in another format
        │                                    (an older one: run ``toolq migrate``)
        └── ServerUnavailable                the ledger's server did not answer; a write
            └── NotDurable                   may have happened: the same call again (same
                                             operation_ref) is safe

``BadIdentifier`` (a ``UserWarning``, not in the tree) is said where an ``InvalidInput``
is raised with a ``field`` or ``rule`` that is not an identifier.

A tool raises the ``ToolFailure`` that says what it knows; anything else it
raises is unexpected and is classified by whether the tool writes: an
unexpected failure in a write may have happened after the request left, so its
outcome is unknown and is verified; in a read it is escalated.
(:mod:`toolq.core.classify` turns HTTP statuses and httpx/requests exceptions into
``ToolFailure``\\ s.)

Upstream text is untrusted. Nothing a tool or provider wrote reaches an
envelope as prose: messages come from this module's table; a ``ToolFailure``'s
positional message is for logs only; ``safe_details`` strings survive only as
single secret-free tokens (:func:`toolq.core.redact.safe_value`); a ``code`` that is
not UPPER_SNAKE becomes ``UPSTREAM_ERROR``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, cast

from toolq.core.envelope import (
    SAFE_DETAIL_KEYS,
    Category,
    CommitState,
    DetailValue,
    Directive,
    FieldError,
    NextAction,
    Retry,
    Scalar,
    ToolError,
    is_valid_code,
    utc,
)
from toolq.core.redact import looks_secret, safe_value, scrub, scrub_identifier

#: The neutral code for anything an upstream said that toolq cannot vouch for.
UPSTREAM_ERROR = "UPSTREAM_ERROR"
#: The code when a failure would allow a repeat but the budget is spent.
ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"


class ToolqError(Exception):
    """Root of toolq's exceptions."""


# --------------------------------------------------------------------------- tool failures


def _safe_code(code: str | None, default: str) -> str:
    if code is None:
        return default
    if is_valid_code(code) and not looks_secret(code):
        return code
    return UPSTREAM_ERROR


class ToolFailure(ToolqError):
    """A failure a tool reports on purpose. ``code`` is stable UPPER_SNAKE.

    The optional positional ``message`` is for logs (scrubbed) and never
    reaches an envelope; keyword arguments other than ``code`` are candidate
    ``safe_details``, kept only if allowlisted and token-shaped.
    """

    default_code = "TOOL_FAILURE"

    def __init__(
        self, message: str | None = None, /, *, code: str | None = None, **safe_details: Scalar
    ) -> None:
        self.code = _safe_code(code, self.default_code)
        self.safe_details: dict[str, Scalar] = dict(safe_details)
        self.log_message = scrub(message) if message else None
        super().__init__(f"{self.code}: {self.log_message}" if self.log_message else self.code)


class InvalidInput(ToolFailure):
    default_code = "INVALID_INPUT"

    def __init__(
        self,
        message: str | None = None,
        /,
        *,
        field: str,
        rule: str,
        code: str | None = None,
        **extra: Scalar,
    ) -> None:
        self.field = field
        self.rule = rule
        for what, value, instead in (("field", field, "input"), ("rule", rule, "invalid")):
            if not scrub_identifier(value):
                warnings.warn(BadIdentifier(what, value, instead), stacklevel=2)
        super().__init__(message, code=code, field=field, rule=rule, **extra)


class BadIdentifier(UserWarning):
    """An ``InvalidInput`` whose ``field`` or ``rule`` is not an identifier, said where it
    is raised. The envelope carries the placeholder instead (``"input"``, ``"invalid"``):
    a rule reaches agents and people, so only a short identifier of letters, digits and
    ``_ . : / [ ] -`` that looks like no secret passes (``must_be_positive``,
    ``max_length``, not ``"must be > 0"``). Under pytest's ``filterwarnings = error``
    (toolq's, and most projects') the raise fails the test with this message; in
    production it is a warning and the call goes on, redacted."""

    def __init__(self, what: str, value: str, instead: str) -> None:
        shown = scrub(str(value))[:80]
        super().__init__(
            f"InvalidInput({what}={shown!r}): not an identifier (letters, digits and "
            f"_ . : / [ ] -, at most 64, nothing secret-looking); the envelope will say "
            f"{what}={instead!r}. Name it like 'must_be_positive'."
        )


class NeedsApproval(ToolFailure):
    default_code = "MISSING_APPROVAL"


class ForbiddenScope(ToolFailure):
    default_code = "FORBIDDEN_SCOPE"


class NotFound(ToolFailure):
    default_code = "NOT_FOUND"


class Conflict(ToolFailure):
    default_code = "VERSION_CONFLICT"

    def __init__(
        self,
        message: str | None = None,
        /,
        *,
        current_state_ref: str | None = None,
        code: str | None = None,
        **extra: Scalar,
    ) -> None:
        self.current_state_ref = current_state_ref
        super().__init__(message, code=code, **extra)


class RateLimited(ToolFailure):
    default_code = "RATE_LIMITED"

    def __init__(
        self,
        message: str | None = None,
        /,
        *,
        retry_after: float | datetime,
        code: str | None = None,
        **extra: Scalar,
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, code=code, **extra)


class Unavailable(ToolFailure):
    default_code = "DEPENDENCY_UNAVAILABLE"

    def __init__(
        self,
        message: str | None = None,
        /,
        *,
        retry_after: float | datetime | None = None,
        code: str | None = None,
        **extra: Scalar,
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, code=code, **extra)


class OutcomeUnknown(ToolFailure):
    """The request may have reached the provider: only verification can tell.

    In a read nothing can have been committed, so it is treated as
    ``Unavailable``: repeating a read is safe.
    """

    default_code = "OUTCOME_UNKNOWN"


class Misconfigured(ToolFailure):
    """Nothing was sent and repeating will not help (a bad URL, a bad header).

    Unlike an unexpected exception, this is known not to have committed, so a
    write is escalated instead of being verified.
    """

    default_code = "TOOL_MISCONFIGURED"


# --------------------------------------------------------------------------- API refusals


class RequestRefused(ToolqError):
    """toolq's API refused a request; nothing was written. ``code`` is stable."""

    code = "REQUEST_REFUSED"

    def __init__(self, message: str, *, envelope: ToolError | None = None, **details: Any) -> None:
        self.message = message
        self.envelope = envelope
        self.details = details
        super().__init__(f"{self.code}: {message}")


class UnknownTool(RequestRefused):
    code = "UNKNOWN_TOOL"


class InvalidArguments(RequestRefused):
    code = "INVALID_ARGUMENTS"

    def __init__(
        self, message: str, *, field_errors: list[FieldError] | None = None, **details: Any
    ) -> None:
        self.field_errors = field_errors or []
        super().__init__(message, **details)

    def __str__(self) -> str:
        """The code, the message and the fields at fault, as the CLI shows them:
        ``INVALID_ARGUMENTS: ... (amount: greater_than; currency: missing)``."""
        return f"{self.code}: {self.message}" + field_list(self.field_errors)


def field_list(fields: list[FieldError], limit: int = 5) -> str:
    """`` (field: rule; ...)`` for the first ``limit`` field errors, or ``""``."""
    if not fields:
        return ""
    shown = "; ".join(f"{fe.field}: {fe.rule}" for fe in fields[:limit])
    more = f"; {len(fields) - limit} more" if len(fields) > limit else ""
    return f" ({shown}{more})"


class IdempotencyKeyReused(RequestRefused):
    code = "IDEMPOTENCY_KEY_REUSED"


class OperationNotFound(RequestRefused):
    code = "OPERATION_NOT_FOUND"


class InvalidState(RequestRefused):
    code = "INVALID_STATE"


class StaleRevision(InvalidState):
    """An operator acted on a revision of the operation that is no longer current:
    read it again (what they decided on may have changed)."""

    code = "STALE_REVISION"


class OperatorRetriesSpent(InvalidState):
    """An escalated operation was retried by operators as many times as
    ``recovery.operator_retries`` allows; resolve it as committed or not committed."""

    code = "OPERATOR_RETRIES_SPENT"


class InvalidDependencyKey(InvalidArguments):
    """Not a dependency key (:data:`toolq.core.deps.DEP_KEY_PATTERN`)."""

    code = "INVALID_DEPENDENCY_KEY"


class UnknownDependency(RequestRefused):
    """No dependency key by that name has been used (none in the ledger)."""

    code = "UNKNOWN_DEPENDENCY"


class DependencyActionRefused(InvalidState):
    """An operator's action that does not apply to the key as it is
    (:mod:`toolq.decisions.dep_actions`); nothing was written. ``code`` says which."""

    def __init__(self, code: str, message: str, **details: Any) -> None:
        self.code = code
        super().__init__(message, **details)


class LedgerFormat(RequestRefused):
    """The ledger is stored in a format this toolq does not read
    (:mod:`toolq.decisions.formats`): an older one (the message names ``toolq migrate``)
    or a newer one (upgrade toolq). ``found`` and ``expected`` are the formats."""

    code = "LEDGER_FORMAT"


class ServerUnavailable(RequestRefused):
    """The ledger's server did not answer (refused, reset, timed out, loading).

    Unlike the other refusals, a write may have reached the server before the
    answer was lost: submitting again with the same ``operation_ref`` is safe
    (an existing operation is returned), and so is repeating an operator action
    (one that already happened is refused as ``INVALID_STATE``). The message
    names the server (password redacted) and what to check. The code is the one
    the HTTP API answers 503 with.
    """

    code = "QUEUE_UNAVAILABLE"


class NotDurable(ServerUnavailable):
    """The server took a write but did not confirm it on disk in time
    (``durability="fsync"``, :mod:`toolq.adapters.ledger.durability`): a power loss now
    could still undo it, so toolq does not act on it."""

    code = "WRITE_NOT_DURABLE"


# --------------------------------------------------------------------------- the table


@dataclass(frozen=True)
class Rule:
    """How one kind of failure maps to an envelope."""

    category: Category
    commit_state: CommitState
    directive: Directive
    next_action: NextAction
    agent_message: str
    user_message: str


_UNKNOWN = Rule(
    Category.DEPENDENCY,
    CommitState.UNKNOWN,
    Directive.NEVER,
    NextAction.VERIFY_OPERATION,
    "The write may have completed. Verify operation_ref before any new write.",
    "The request is being checked before anything is sent again.",
)

#: The one table from raised failure to envelope (DESIGN.md). Keys are the
#: failure classes; ``"unexpected_write"``/``"unexpected_read"`` are anything else.
FAILURE_TABLE: Mapping[type[ToolFailure] | str, Rule] = {
    InvalidInput: Rule(
        Category.VALIDATION,
        CommitState.NOT_COMMITTED,
        Directive.AFTER_INPUT_FIX,
        NextAction.CORRECT_INPUT,
        "An argument is invalid; correct it and submit changed arguments.",
        "I need a corrected value before I can do this.",
    ),
    NeedsApproval: Rule(
        Category.AUTHORIZATION,
        CommitState.NOT_COMMITTED,
        Directive.NEVER,
        NextAction.REQUEST_APPROVAL,
        "This action needs approval before it can run.",
        "This needs your approval before it can go ahead.",
    ),
    ForbiddenScope: Rule(
        Category.AUTHORIZATION,
        CommitState.NOT_COMMITTED,
        Directive.NEVER,
        NextAction.CHOOSE_ALLOWED_OPERATION,
        "This action is outside the allowed scope; choose an allowed operation.",
        "I am not allowed to do that.",
    ),
    NotFound: Rule(
        Category.CONFLICT,
        CommitState.NOT_COMMITTED,
        Directive.NEVER,
        NextAction.REREAD_STATE,
        "The target was not found; reread the current state before acting.",
        "I could not find what this refers to.",
    ),
    Conflict: Rule(
        Category.CONFLICT,
        CommitState.NOT_COMMITTED,
        Directive.NEVER,
        NextAction.REREAD_STATE,
        "The target changed or is in a state that forbids this; reread it first.",
        "Something changed in the meantime; I need to look again.",
    ),
    RateLimited: Rule(
        Category.DEPENDENCY,
        CommitState.NOT_COMMITTED,
        Directive.AFTER_DELAY,
        NextAction.WAIT_AND_RETRY,
        "Rate limited; toolq retries after not_before.",
        "The service is busy; this will be retried shortly.",
    ),
    Unavailable: Rule(
        Category.DEPENDENCY,
        CommitState.NOT_COMMITTED,
        Directive.AFTER_DELAY,
        NextAction.WAIT_AND_RETRY,
        "A dependency is unavailable; toolq retries after not_before.",
        "The service is unavailable; this will be retried shortly.",
    ),
    OutcomeUnknown: _UNKNOWN,
    Misconfigured: Rule(
        Category.INTERNAL,
        CommitState.NOT_COMMITTED,
        Directive.NEVER,
        NextAction.ESCALATE,
        "The tool is misconfigured and sent nothing; this needs an operator.",
        "Something went wrong; a person will look at it.",
    ),
    "unexpected_write": Rule(
        Category.INTERNAL,
        CommitState.UNKNOWN,
        Directive.NEVER,
        NextAction.VERIFY_OPERATION,
        "The write failed unexpectedly and may have completed. toolq verifies it.",
        "The request is being checked before anything is sent again.",
    ),
    "unexpected_read": Rule(
        Category.INTERNAL,
        CommitState.NOT_COMMITTED,
        Directive.NEVER,
        NextAction.ESCALATE,
        "The tool failed unexpectedly; this needs an operator.",
        "Something went wrong; a person will look at it.",
    ),
}

_EXHAUSTED_AGENT = "No attempts remain for this operation; it needs an operator."
_EXHAUSTED_USER = "This could not be completed; a person will look at it."

#: Unavailable without a retry_after waits this long.
DEFAULT_UNAVAILABLE_DELAY = 2.0
#: An upstream's Retry-After is untrusted: no single wait is longer than this.
MAX_RETRY_DELAY = timedelta(days=1)


def _table_key(exc: BaseException, *, writes: bool) -> type[ToolFailure] | str:
    for cls in type(exc).__mro__:
        if cls in FAILURE_TABLE:
            if cls is OutcomeUnknown and not writes:
                return Unavailable
            return cast("type[ToolFailure]", cls)
    return "unexpected_write" if writes else "unexpected_read"


def rule_for(exc: BaseException, *, writes: bool) -> Rule:
    """The table row for a raised exception."""
    return FAILURE_TABLE[_table_key(exc, writes=writes)]


def code_for(exc: BaseException, *, writes: bool) -> str:
    if isinstance(exc, ToolFailure):
        if isinstance(exc, OutcomeUnknown) and not writes and exc.code == exc.default_code:
            # "OUTCOME_UNKNOWN" next to commit_state not_committed would mislead.
            return UPSTREAM_ERROR
        return exc.code
    return "OUTCOME_UNKNOWN" if writes else UPSTREAM_ERROR


def not_before_for(exc: BaseException, now: datetime) -> datetime | None:
    """The absolute time a delayed retry may run, for the failures that wait.

    A naive ``retry_after`` datetime is read as UTC; the wait is capped at
    ``MAX_RETRY_DELAY``, and a time in the past means now.
    """
    if not isinstance(exc, RateLimited | Unavailable):
        return None
    return _delay_until(exc.retry_after, utc(now))


def _delay_until(after: float | datetime | None, now: datetime) -> datetime:
    if isinstance(after, datetime):
        when = utc(after) if after.tzinfo is not None else after.replace(tzinfo=now.tzinfo)
        return min(max(when, now), now + MAX_RETRY_DELAY)
    try:
        seconds = DEFAULT_UNAVAILABLE_DELAY if after is None else float(after)
    except OverflowError:  # an int past any float: as long as a wait may be
        seconds = MAX_RETRY_DELAY.total_seconds()
    if not math.isfinite(seconds) or seconds < 0:
        seconds = DEFAULT_UNAVAILABLE_DELAY
    # Capped before timedelta() takes it: past ~8.6e13 s it raises OverflowError (in the
    # worker, after the tool ran: the attempt was never recorded).
    return now + timedelta(seconds=min(seconds, MAX_RETRY_DELAY.total_seconds()))


def error_envelope(
    exc: BaseException,
    *,
    writes: bool,
    operation_ref: str,
    operation: str | None,
    call_id: str | None,
    attempts_remaining: int,
    now: datetime,
    verification_tool: str | None = None,
    safe_detail_keys: frozenset[str] = frozenset(),
) -> ToolError:
    """Build the envelope for a failure, by the table. Never copies free text.

    ``attempts_remaining`` is what the operation's budget allows after this
    attempt. When a row would allow a repeat and none is left, the envelope
    escalates instead: code ``ATTEMPTS_EXHAUSTED``, the failure's own code in
    ``safe_details.reason``, its category and commit state kept.
    """
    now = utc(now)
    rule = rule_for(exc, writes=writes)
    details: dict[str, DetailValue] = {}
    field_errors: list[FieldError] | None = None
    current_state_ref: str | None = None
    if isinstance(exc, ToolFailure):
        allowed = SAFE_DETAIL_KEYS | safe_detail_keys
        for key, value in exc.safe_details.items():
            clean = _safe_scalar(value)
            if key in allowed and clean is not None:
                details[key] = clean
        if isinstance(exc, InvalidInput):
            field = scrub_identifier(exc.field) or "input"
            rule_name = scrub_identifier(exc.rule) or "invalid"
            field_errors = [FieldError(field=field, rule=rule_name)]
            details["field"], details["rule"] = field, rule_name
        if isinstance(exc, Conflict) and exc.current_state_ref:
            current_state_ref = safe_value(exc.current_state_ref)

    code = code_for(exc, writes=writes)
    not_before: datetime | None = None
    if rule.directive is not Directive.NEVER and attempts_remaining < 1:
        rule = replace(
            rule,
            directive=Directive.NEVER,
            next_action=NextAction.ESCALATE,
            agent_message=_EXHAUSTED_AGENT,
            user_message=_EXHAUSTED_USER,
        )
        code, details["reason"] = ATTEMPTS_EXHAUSTED, code
    elif rule.directive is Directive.AFTER_DELAY:
        after = exc.retry_after if isinstance(exc, RateLimited | Unavailable) else None
        not_before = _delay_until(after, now)
        details["retry_after"] = round((not_before - now).total_seconds(), 3)

    tool = scrub_identifier(verification_tool) if verification_tool else ""
    if rule.commit_state is CommitState.UNKNOWN and tool:
        details["verification_tool"] = tool
    remaining = 0 if rule.directive is Directive.NEVER else attempts_remaining
    return ToolError.model_validate(
        {
            "code": code,
            "category": rule.category,
            "commit_state": rule.commit_state,
            "retry": Retry(
                directive=rule.directive,
                not_before=not_before,
                max_attempts_remaining=remaining,
            ),
            "next_action": rule.next_action,
            "operation_ref": operation_ref,
            "operation": operation,
            "call_id": call_id,
            "safe_details": details,
            "field_errors": field_errors,
            "current_state_ref": current_state_ref,
            "agent_message": rule.agent_message,
            "user_message": rule.user_message,
        },
        context={"safe_detail_keys": safe_detail_keys},
    )


def safe_words(exc: BaseException, safe_detail_keys: frozenset[str] = frozenset()) -> str:
    """A failure in a few safe words, for a history note (a verifier's failure): its
    code, then its allowlisted safe details as ``key=value``, what an envelope would
    keep of it. Never its message."""
    words = [code_for(exc, writes=False)]
    if isinstance(exc, ToolFailure):
        allowed = SAFE_DETAIL_KEYS | safe_detail_keys
        for key, value in sorted(exc.safe_details.items()):
            clean = _safe_scalar(value)
            if key in allowed and clean is not None:
                words.append(f"{key}={clean}")
    return " ".join(words)


def _safe_scalar(value: Scalar) -> DetailValue | None:
    if isinstance(value, str):
        return safe_value(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
