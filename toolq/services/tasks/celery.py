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
One rule for both modes. A delivery whose record the server did not take (after the
tool ran: :class:`~toolq.services.tasks.run.RecordAway`) goes back the same way: the
call that ends a delivery is the ledger's; its copy's claim finds the attempt held
and ends it there (dropped while the lease lasts, settled as a lost lease after).

On the asyncio pool (:mod:`toolq.services.workers.aio_pool`) a delivery's body is
awaited on the pool's loop first (:attr:`AioBodies`, :mod:`toolq.services.tasks.run_aio`);
Celery's tracer then runs the task as everywhere, and the task returns what the
loop found (:data:`AIO_DONE`): signals, results, acks and requeues stay Celery's.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
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
from toolq.adapters.ledger.aio import AsyncLedger
from toolq.process.logs import about
from toolq.services.tasks.run import LedgerAway, RecordAway, Runtime
from toolq.services.tasks.run_aio import AioRuntime

#: What the asyncio pool's loop found for the delivery the tracer is running now:
#: the body returns it (or raises what it raises) instead of serving the delivery.
AIO_DONE: ContextVar[Callable[[], str] | None] = ContextVar("toolq_aio_done", default=None)


@dataclass(frozen=True)
class AioBodies:
    """What the asyncio pool needs of a toolq task (``task.toolq_aio``): the App's
    runtime, an asyncio ledger made on the calling loop, and the awaited body."""

    runtime: Callable[[], Runtime]
    ledger: Callable[[], AsyncLedger]
    body: Callable[..., Awaitable[str]]


async def _aio_run(rt: AioRuntime, delivery: str | None, ref: str, attempt: int) -> str:
    with about(ref):  # each call is its own task: the log context is its own
        return await rt.run_attempt(ref, int(attempt), delivery)


async def _aio_verify(
    rt: AioRuntime, delivery: str | None, ref: str, attempt: int, vcheck: int
) -> str:
    with about(ref):
        return await rt.run_check(ref, int(attempt), int(vcheck), delivery)


def register_tasks(
    celery: Celery,
    runtime: Callable[[], Runtime],
    aio_ledger: Callable[[], AsyncLedger] | None = None,
) -> None:
    """Register ``toolq.run`` and ``toolq.verify`` on ``celery``, served by ``runtime()``
    (the App's, made at the first delivery); ``aio_ledger``: how the asyncio pool makes
    its loop's ledger (none: the pool runs them on its threads, as the threads pool)."""
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
        done = AIO_DONE.get()
        try:
            if done is not None:
                return task_result(done())
            with about(ref):
                return task_result(runtime().run_attempt(ref, int(attempt), delivery_of(self)))
        except (LedgerAway, RecordAway) as exc:
            raise Requeue(str(exc)) from exc

    @celery.task(name=VERIFY_TASK, **options)
    def verify(self: Task[Any, Any], ref: str, attempt: int, vcheck: int) -> str:
        done = AIO_DONE.get()
        try:
            if done is not None:
                return task_result(done())
            with about(ref):
                return task_result(
                    runtime().run_check(ref, int(attempt), int(vcheck), delivery_of(self))
                )
        except (LedgerAway, RecordAway) as exc:
            raise Requeue(str(exc)) from exc

    if aio_ledger is not None:
        run.toolq_aio = AioBodies(runtime, aio_ledger, _aio_run)
        verify.toolq_aio = AioBodies(runtime, aio_ledger, _aio_verify)
