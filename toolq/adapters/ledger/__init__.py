"""The operation ledger in Redis: the source of truth for every operation.

Modules, each with one reason to change: :mod:`~toolq.adapters.ledger.scripts` (the Lua),
:mod:`~toolq.adapters.ledger.wire` (KEYS and ARGV), :mod:`~toolq.adapters.ledger.replies` (reading
the answers), :mod:`~toolq.adapters.ledger.runner` (FCALL or EVALSHA),
:mod:`~toolq.adapters.ledger.durability` / :mod:`~toolq.adapters.ledger.route` /
:mod:`~toolq.adapters.ledger.durable` (on disk first: the plan, the Cluster's routing,
the sync and async shells), :mod:`~toolq.adapters.ledger.ack` (Celery deliveries
acknowledged by a script), :mod:`~toolq.adapters.ledger.store` (the sync ledger) with
:mod:`~toolq.adapters.ledger.schedule` (the scheduler's calls), :mod:`~toolq.adapters.ledger.aio`
(the async one).
"""

from toolq.adapters.ledger.replies import Claim, Claimed, SubmitResult, Submitted
from toolq.adapters.ledger.store import Ledger

__all__ = ["Claim", "Claimed", "Ledger", "SubmitResult", "Submitted"]
