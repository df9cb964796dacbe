"""The asyncio pool's lean success: a toolq call that returned, reported to Celery
without running Celery's tracer a second time around a body the loop already awaited.

On the asyncio pool (:mod:`toolq.services.workers.aio_pool`) a toolq task's body runs on
the loop; Celery's tracer then runs the task again only so that it returns what the loop
found. For a call that returned, on a worker where nothing watches the tracer, that
second pass does nothing anyone sees: it decodes the body again, pushes and pops the
task's request, skips a result store (toolq's tasks ignore results), and hands
``(0, repr(result), runtime)`` to the request's ``on_success`` (which marks the task
ready, acknowledges and, with events on, sends ``task-succeeded``). The lean path hands
the same tuple to the same callback itself: ``on_success``, the ack (the ledger's or
the broker's) and the events stay Celery's request's. Measured in bench/RESULTS.md
("Lean success on the asyncio pool").

Celery's tracer still runs when anything could see it (:func:`lean_success`, checked in
this order; any "yes" in the first column sends the call through the tracer):

=====================================  ==============================================
the tracer runs when                   because the tracer
=====================================  ==============================================
the body raised (or its outcome is     logs, formats the traceback, requeues or
not a success: ``task_result`` raises) rejects (Celery's ``throws``, toolq's Requeue)
the tracer would not run inline        runs on a thread there (:func:`traced_inline`:
(a task signal receiver, no hub, more  user code may block; the loop is the busiest
calls than threads)                    thread)
the task is not plain                  calls custom ``__call__``/``before_start``/
(:func:`plain_task`)                   ``on_success``/``after_return``, stores
                                       STARTED (``track_started``), a result, dedups
                                       redeliveries, runs a backend's or loader's
                                       cleanup
the message asks for a result          stores it (``ignore_result`` False)
the message links others               sends callbacks, a chain, a chord part
(callbacks, errbacks, chain, chord,
group)
``celery.app.trace`` logs at INFO      writes "Task ... succeeded in ..."
=====================================  ==============================================
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from celery import Task
from celery.backends.base import BaseBackend
from celery.loaders.base import BaseLoader
from celery.utils.saferepr import saferepr

#: Celery's tracer's logger: at INFO it logs each success (the lean path does not).
TRACE_LOG = logging.getLogger("celery.app.trace")

#: A task's hooks the tracer calls when the task's class defines them.
HOOKS = ("__call__", "before_start", "on_success", "after_return")

#: The parts of a message that make the tracer send or store more on success.
LINKS = ("callbacks", "errbacks", "chain", "chord", "group")


def lean_success(
    returned: bool,
    inline: bool,
    plain: bool,
    ignore_result: bool | None,
    linked: bool,
    logs_success: bool,
) -> bool:
    """Whether the call's success goes to Celery's request without the tracer (the
    module's table, row by row)."""
    if not returned or not inline or not plain:
        return False
    if ignore_result is False:
        return False
    return not linked and not logs_success


def plain_task(task: Task[Any, Any]) -> bool:
    """A task whose tracer, on success, does nothing beyond the request's callback: no
    custom hooks, no STARTED state, results ignored, no dedup of redeliveries, the
    backend's and the loader's cleanups Celery's no-ops. Fixed at worker start."""
    app = task.app
    # Celery's class attributes, not task_has_custom(): a worker replaces Task.__call__
    # with its stack protection, which task_has_custom() takes for a custom one.
    if any(getattr(type(task), hook) is not getattr(Task, hook) for hook in HOOKS):
        return False
    if task.track_started or not task.ignore_result:
        return False
    if app.conf.worker_deduplicate_successful_tasks:
        return False
    backend = type(task.backend).process_cleanup is BaseBackend.process_cleanup
    loader = type(app.loader)
    cleanups = (loader.on_process_cleanup, loader.on_task_init)
    return backend and cleanups == (BaseLoader.on_process_cleanup, BaseLoader.on_task_init)


def linked(request: Mapping[str, Any] | None, embed: Mapping[str, Any] | None) -> bool:
    """Whether the message carries work the tracer starts or records on success."""
    return any((embed or {}).get(k) for k in LINKS) or bool((request or {}).get("group"))


def ignore_result_of(request: Mapping[str, Any] | None) -> bool | None:
    """The message's own ``ignore_result`` (None: the task's)."""
    value = (request or {}).get("ignore_result")
    return None if value is None else bool(value)


def succeed(
    callback: Callable[..., Any] | None, result: Any, runtime: float, task: Task[Any, Any]
) -> None:
    """What the tracer's caller (``apply_target``) hands the request's ``on_success``
    for a task that returned ``result``: ``(0, repr, runtime)``, as ``fast_trace_task``."""
    if callback is not None:
        callback((0, saferepr(result, task.resultrepr_maxsize), runtime))
