"""The operation ledger: the source of truth for every operation."""

from toolq.ledger.record import HistoryEntry, OperationRecord
from toolq.ledger.states import PENDING_RECOVERY, SETTLED, TERMINAL, State
from toolq.ledger.store import Claim, Ledger, SubmitResult, Transition

__all__ = [
    "PENDING_RECOVERY",
    "SETTLED",
    "TERMINAL",
    "Claim",
    "HistoryEntry",
    "Ledger",
    "OperationRecord",
    "State",
    "SubmitResult",
    "Transition",
]
