"""toolq's two Celery tasks, ``toolq.run`` and ``toolq.verify``, registered on a Celery
app: thin bodies that hand each delivery to the :class:`~toolq.services.tasks.run.Runtime`.

A task whose operation did not succeed raises (after the ledger recorded it) so that
Flower shows a failure; declared in ``throws``: one log line, acked.

A delivery whose claim the ledger's server did not take goes back to its queue
(:class:`~toolq.adapters.broker.messages.Requeue`: Celery rejects it with requeue, late acks or
not), where an ack would have left its operation to the scheduler's republish after
``recovery.unclaimed_after``. Also when the ledger's server is the broker
(``toolq_acks_in_ledger``), where the broker is away too: the reject then fails as the
ack would have (kombu logs it) and the message stays unacknowledged on the server, as
before; a server back by then takes the requeue, not an ack that drops the message.
One rule for both modes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery, Task

from toolq.adapters.broker.ack import delivery_of
from toolq.adapters.broker.app import REQUEST
from toolq.adapters.broker.messages import (
    RUN_TASK,
    VERIFY_TASK,
    OperationNotSucceeded,
    Requeue,
    task_result,
)
from toolq.process.logs import about
from toolq.services.tasks.run import LedgerAway, Runtime


def register_tasks(celery: Celery, runtime: Callable[[], Runtime]) -> None:
    """Register ``toolq.run`` and ``toolq.verify`` on ``celery``, served by ``runtime()``
    (the App's, made at the first delivery)."""
    # shared=False: another App's Celery app (several in one process: tests, an API
    # beside a worker) must not get these bodies, bound to this App's runtime.
    options: dict[str, Any] = {
        "ignore_result": True,
        "throws": (OperationNotSucceeded,),
        "bind": True,
        "Request": REQUEST,
        "shared": False,
    }

    @celery.task(name=RUN_TASK, **options)
    def run(self: Task[Any, Any], ref: str, attempt: int) -> str:
        try:
            with about(ref):
                return task_result(runtime().run_attempt(ref, int(attempt), delivery_of(self)))
        except LedgerAway as exc:
            raise Requeue(str(exc)) from exc

    @celery.task(name=VERIFY_TASK, **options)
    def verify(self: Task[Any, Any], ref: str, attempt: int, vcheck: int) -> str:
        try:
            with about(ref):
                return task_result(
                    runtime().run_check(ref, int(attempt), int(vcheck), delivery_of(self))
                )
        except LedgerAway as exc:
            raise Requeue(str(exc)) from exc
