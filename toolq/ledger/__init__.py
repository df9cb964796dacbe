"""The operation ledger in Redis: the source of truth for every operation.

Modules, each with one reason to change: :mod:`~toolq.ledger.scripts` (the Lua),
:mod:`~toolq.ledger.wire` (KEYS and ARGV), :mod:`~toolq.ledger.replies` (reading
the answers), :mod:`~toolq.ledger.runner` (FCALL or EVALSHA),
:mod:`~toolq.ledger.durability` / :mod:`~toolq.ledger.route` /
:mod:`~toolq.ledger.durable` (on disk first: the plan, the Cluster's routing,
the sync and async shells), :mod:`~toolq.ledger.ack` (Celery deliveries
acknowledged by a script), :mod:`~toolq.ledger.store` (the sync ledger) with
:mod:`~toolq.ledger.schedule` (the scheduler's calls), :mod:`~toolq.ledger.aio`
(the async one).
"""

from toolq.ledger.replies import Claim, Claimed, SubmitResult, Submitted
from toolq.ledger.store import Ledger

__all__ = ["Claim", "Claimed", "Ledger", "SubmitResult", "Submitted"]
