"""What the operation page shows of an escalated operation's settling (pure): the three
things a person may do with it, and each resolution made so far, with who and why.
The route that carries them out is :meth:`toolq.edges.api.console.actions.Actions.resolve`.
"""

from __future__ import annotations

from dataclasses import dataclass

from toolq.core.record import OperationRecord
from toolq.decisions.recovery.transition import RESOLUTIONS

#: The scope the three resolutions need (as ``POST /v1/operations/{ref}:resolve``).
SCOPE = "resolve"

#: outcome -> (its button, what it says was found, what happens)
CHOICES: tuple[tuple[str, str, str], ...] = (
    (
        "committed",
        "Resolve as committed",
        "You found the write at the provider: it ends succeeded, with the result or "
        "reference you give, marked as confirmed by you.",
    ),
    (
        "not_committed",
        "Resolve as not committed",
        "You found nothing written: it ends failed; nothing will be sent.",
    ),
    (
        "retry",
        "Retry",
        "You found nothing written: one attempt more, under the same operation_ref.",
    ),
)

#: A resolution's code, as the page says it.
WORDS = {
    "RESOLVED_COMMITTED": "resolved as committed",
    "RESOLVED_NOT_COMMITTED": "resolved as not committed",
    "RESOLVED_RETRY": "retried",
}


@dataclass(frozen=True)
class Resolved:
    """One resolution from the history."""

    index: int
    at_ms: int
    what: str
    by: str
    reason: str
    reference: str


def resolutions(rec: OperationRecord) -> list[Resolved]:
    """Every resolution of ``rec``, oldest first."""
    return [
        Resolved(
            index=i,
            at_ms=h.at,
            what=WORDS[h.code],
            by=h.by,
            reason=h.note.get("reason", ""),
            reference=h.note.get("reference", ""),
        )
        for i, h in enumerate(rec.history, 1)
        if h.code in RESOLUTIONS
    ]
