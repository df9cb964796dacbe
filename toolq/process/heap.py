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
