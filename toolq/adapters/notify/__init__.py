"""Notices: what the ledger and the workers publish, and the subscriptions that wake waiters.

Two kinds of notice (:mod:`toolq.adapters.notify.format`): a transition entered a state,
and a tool's progress (:mod:`toolq.adapters.notify.progress` publishes those). Settled
states go to ``Keys.notify``, everything else (unsettled states, progress) to
``Keys.notify_steps``: one SPUBLISH per transition either way, and a process
that only waits subscribes to the first and hears one notice per call. Both
channels carry the cell's hash tag: notices are sharded Pub/Sub, on one server
as on a Cluster, where each stays on the node of its cell.

- subscriptions, one class per mode: :class:`Subscription` (one server) and
  :class:`ShardedSubscription` (a Cluster), :class:`AsyncSubscription` and
  :class:`AsyncShardedSubscription` on ``redis.asyncio``; one sans-I/O core,
  :mod:`toolq.adapters.notify.placement`. The caller picks the class
  (:mod:`toolq.topology.notices`); the scheduler and the relay of a Cluster
  hear notices through them too.
- notifiers, each one subscription shared by every waiter it serves:
  :class:`Notifier` for the sync client (one thread per process, settled states
  only), :class:`AsyncNotifier` for ``tq.aio`` (one task per event loop); one
  sans-I/O core, :mod:`toolq.adapters.notify.dispatch`. Both subscribe again after a lost
  connection or a moved slot, and then wake every waiter to read its record
  again: notices published meanwhile are gone.
"""

from toolq.adapters.notify.aio_notifier import (
    DISPATCH_PER_PASS,
    WAITER_BACKLOG,
    AsyncNotifier,
    Waiter,
)
from toolq.adapters.notify.aio_subscription import AsyncShardedSubscription, AsyncSubscription
from toolq.adapters.notify.format import (
    PROGRESS,
    PROGRESS_MESSAGE_MAX,
    Event,
    Notice,
    Progress,
    notice_ref,
    parse_notice,
    progress_notice,
    to_event,
)
from toolq.adapters.notify.notifier import Notifier, Wake
from toolq.adapters.notify.placement import PLACE_RETRY_S
from toolq.adapters.notify.progress import PROGRESS_EVERY_S, PROGRESS_PAUSE_S, ProgressPublisher
from toolq.adapters.notify.subscription import ShardedSubscription, Subscription

__all__ = [
    "DISPATCH_PER_PASS",
    "PLACE_RETRY_S",
    "PROGRESS",
    "PROGRESS_EVERY_S",
    "PROGRESS_MESSAGE_MAX",
    "PROGRESS_PAUSE_S",
    "WAITER_BACKLOG",
    "AsyncNotifier",
    "AsyncShardedSubscription",
    "AsyncSubscription",
    "Event",
    "Notice",
    "Notifier",
    "Progress",
    "ProgressPublisher",
    "ShardedSubscription",
    "Subscription",
    "Waiter",
    "Wake",
    "notice_ref",
    "parse_notice",
    "progress_notice",
    "to_event",
]
