"""Celery's task request, for toolq's two tasks: knows when the ledger acknowledged.

A toolq task body passes its delivery tag to the ledger call that ends the
delivery when the ledger's server is the broker too (the Celery setting
``toolq_acks_in_ledger``, set by :func:`toolq.adapters.broker.app.broker_config`), and
that call acknowledges it in the same script. A body that started and then
returned, or raised :class:`toolq.adapters.broker.messages.OperationNotSucceeded`
(raised only after the ledger recorded the outcome), ended that way; a body
that never started (revoked, expired), failed otherwise, or timed out may not
have, and Celery's own ack goes to Redis as usual. A body that gives its
delivery back (:class:`toolq.adapters.broker.messages.Requeue`: its claim never reached
the ledger) is rejected with requeue by Celery, not acknowledged here. In a
prefork worker this runs in the parent process, which acknowledges for its children.

Celery builds a subclass per task (``create_request_cls``) that replaces
``on_success``; ``acknowledge``, ``on_accepted``, ``on_failure`` and
``on_timeout`` are what it leaves to this class.
"""

from __future__ import annotations

from typing import Any

from billiard.einfo import ExceptionWithTraceback  # type: ignore[attr-defined]
from celery.worker.request import Request as CeleryRequest

from toolq.adapters.broker.ack import acked_by_ledger, ended_in_ledger
from toolq.adapters.broker.messages import OperationNotSucceeded


class Request(CeleryRequest):
    _toolq_started = False
    _toolq_unsettled = False

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(message, *args, **kwargs)
        # Celery passes the task only some of the delivery info: add the tag, which
        # the body hands to the ledger (the dict goes to a prefork child as it is).
        self.delivery_info["delivery_tag"] = message.delivery_tag  # type: ignore[typeddict-unknown-key]

    def on_accepted(self, pid: Any, time_accepted: Any) -> Any:
        self._toolq_started = True
        return super().on_accepted(pid, time_accepted)

    def on_timeout(self, soft: bool, timeout: Any) -> Any:
        if not soft:
            self._toolq_unsettled = True
        return super().on_timeout(soft, timeout)

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = exc_info.exception
        if isinstance(exc, ExceptionWithTraceback):
            exc = exc.exc
        if not isinstance(exc, OperationNotSucceeded):
            self._toolq_unsettled = True
        return super().on_failure(exc_info, send_failed_event, return_ok)

    def acknowledge(self) -> None:
        ended = ended_in_ledger(self._toolq_started, self._toolq_unsettled, self.task.app.conf)
        if not self.acknowledged and ended:
            acked_by_ledger(self.message.delivery_tag)
        super().acknowledge()
