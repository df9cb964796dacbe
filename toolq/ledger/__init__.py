"""The operation ledger in Redis: the source of truth for every operation."""

from toolq.ledger.store import Claim, Ledger, SubmitResult

__all__ = ["Claim", "Ledger", "SubmitResult"]
