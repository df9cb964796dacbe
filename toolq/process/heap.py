"""The process heap and the garbage collector: what an event loop's latency needs.

CPython's full (generation-2) collection walks every tracked object. A client of
toolq carries Celery, kombu, pydantic and its own app: ~75k objects made at
import that live as long as the process. Walking them took 26-63 ms on a 2-CPU
VM, and a collection runs on whatever thread allocated last: in an asyncio
program, the event loop, blocked for that long (bench/RESULTS.md, "Async
client"). :func:`freeze_once` collects what is garbage now, then moves every
object alive into the permanent generation (``gc.freeze``): later full walks
skip them. Objects freed by reference counting are still freed; only a cycle
among the frozen objects that becomes garbage later stays (a one-time,
bounded cost, the trade Instagram and the CPython docs describe for
long-lived servers).

:func:`young_threshold` is for a heap that grows fast instead (the asyncio pool
taking thousands of calls at once): a freeze does not stop the full collections
that follow the growth; a higher first threshold does.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_done = False


def freeze_once() -> bool:
    """Freeze the heap as it is now, once per process; True if this call did it."""
    global _done
    with _lock:
        if _done:
            return False
        _done = True
        gc.collect()
        gc.freeze()
        return True


def frozen() -> bool:
    """Whether :func:`freeze_once` ran in this process."""
    return _done


def young_threshold(n: int) -> tuple[int, int, int] | None:
    """Set the collector's first threshold to ``n`` (0: leave it); the thresholds it
    had, for :func:`restore_threshold`, or None when nothing changed.

    A pool that takes thousands of calls at once grows the heap by hundreds of
    thousands of objects in seconds; at CPython's 700 each step of that growth ran
    a full collection, walking the whole heap on the event loop
    (``worker.gc_threshold``)."""
    if n <= 0:
        return None
    before = gc.get_threshold()
    gc.set_threshold(n, *before[1:])
    return before


def restore_threshold(before: tuple[int, int, int] | None) -> None:
    """Undo :func:`young_threshold` (None: it changed nothing)."""
    if before is not None:
        gc.set_threshold(*before)
