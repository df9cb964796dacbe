"""An asyncio execution pool for Celery: ``toolq worker -P asyncio -c N``.

``-c N`` is the number of calls in flight. One event loop per worker process, on a
thread of its own, awaits toolq's task bodies (claim, call, record:
:mod:`toolq.services.tasks.run_aio`) and the ``async def`` tools and verifiers they
call, N at once; a ``def`` tool or verifier, and any other Celery task the app
has, runs on a bounded thread pool beside the loop (at most :data:`MAX_THREADS`),
as Celery's threads pool would run it.

A Celery pool like the others (a :class:`celery.concurrency.base.BasePool`), loaded
by its dotted path, so the messages stay Celery's and a plain Celery worker runs
them too: ``celery -A app worker -P toolq.services.workers.aio_pool:AsyncioPool``
(``toolq worker -P asyncio`` names it so). For each delivery Celery hands the pool
its tracer and callbacks (``on_apply``): the pool calls ``accept_callback`` when the
call takes a slot, awaits the body on the loop, then runs Celery's tracer, whose
task returns what the loop found (:data:`toolq.services.tasks.celery.AIO_DONE`), and
the tracer's result goes to ``callback``, as the threads pool does it
(``apply_target``). Acknowledgement (late, or by the ledger), requeues and failures
are Celery's and the Request's. The tracer runs on the loop's thread when it is short
(:func:`traced_inline`): a hop to a pool thread and back cost a ``def`` tool's slot
more than the tracer itself (bench/RESULTS.md, the asyncio pool's section). Where
nothing could see the tracer (no task signal receivers, no result, no links, its log
below INFO), a body that returned skips it: its success goes to the same ``callback``
as the tracer's would (:mod:`toolq.services.workers.lean`, ``worker.lean_success``).

Celery's consumer hands the deliveries over from its own thread: many at once wake the
loop once (:class:`Handover`); the body the loop decoded goes to the tracer as it is.
The pool's threads are started with it (:func:`started_threads`).

The garbage collector's first threshold is raised while the pool runs
(``worker.gc_threshold``, :func:`toolq.process.heap.young_threshold`): thousands of
calls taken at once otherwise ran a full collection, on the loop, at each step of
the heap's growth.

Prefetch: Celery's consumer prefetches ``worker_prefetch_multiplier`` x ``-c``
messages (plus toolq's reserve); :attr:`AsyncioPool.num_processes` is ``-c``.

Shutdown: a warm one (SIGTERM, the first Ctrl-C) stops taking messages and lets
the calls in flight finish, for at most :data:`WARM_SHUTDOWN_S`; then, as a cold one
(a second Ctrl-C, SIGQUIT), the calls still running are cancelled. A cancelled call
records nothing and is not acknowledged: as after a worker that died mid-call, its
message comes back and its lease runs out, and the claim or the lease sweep settles
it. Time limits and ``revoke(terminate=True)`` are not supported, as in the threads pool.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import signals
from celery.concurrency.base import BasePool, apply_target
from kombu.serialization import loads, prepare_accept_content

from toolq.adapters.broker.ack import in_ledger
from toolq.adapters.broker.app import GC_KEY, LEAN_KEY
from toolq.adapters.broker.messages import task_result
from toolq.process import heap
from toolq.services.tasks.celery import AIO_DONE, AioBodies
from toolq.services.tasks.run_aio import AioRuntime
from toolq.services.workers import lean

log = logging.getLogger("toolq.worker")

#: ``toolq worker -P asyncio`` runs this class.
DOTTED = "toolq.services.workers.aio_pool:AsyncioPool"
#: Threads beside the loop for ``def`` tools and verifiers and other tasks (fewer if ``-c`` is).
MAX_THREADS = 64
#: How long a warm shutdown waits for the calls in flight before it cancels them.
WARM_SHUTDOWN_S = 60.0


#: The tracer's signals: with a receiver on any, the tracer runs user code.
TASK_SIGNALS = (
    signals.task_prerun,
    signals.task_postrun,
    signals.task_success,
    signals.task_failure,
    signals.task_retry,
)


def _task_signal_receivers() -> bool:
    return any(sig.receivers for sig in TASK_SIGNALS)


def traced_inline(returned: bool, receivers: bool, hub: bool, running: int, threads: int) -> bool:
    """Whether Celery's tracer runs on the loop's thread rather than on a pool thread.

    For a body that returned, with no receiver on the task signals, the tracer is
    short and in memory: no result is stored (toolq's tasks ignore results) and,
    with the consumer on a hub (Celery's event loop), the ack or reject only goes onto
    that hub (``call_soon_ack``), which sends it. A thread hop there and back would
    cost more than it saves, and delay the ack, and with it the consumer's next
    message. A body that raised (a traceback to format and log), a signal receiver
    (user code, which may block) or no hub (the ack sent by the tracer's thread) runs
    on a thread; so do the tracers of a loop holding more calls than the pool has
    threads (``running``): there the loop is the worker's busiest thread, and the
    tracers on it slowed the claims of the rest (bench/RESULTS.md, the asyncio pool).
    """
    return returned and not receivers and hub and running <= threads


def _trace(
    done: Callable[[], str],
    target: Callable[..., Any],
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    callback: Callable[..., Any] | None,
) -> None:
    """Celery's tracer for a delivery whose body the loop ran: the task returns ``done()``."""
    token = AIO_DONE.set(done)
    try:
        apply_target(target, args, kwargs, callback)
    finally:
        AIO_DONE.reset(token)


#: How long the pool's start waits for its threads to start.
THREADS_START_S = 10.0


def started_threads(executor: concurrent.futures.ThreadPoolExecutor, n: int) -> None:
    """Start the executor's ``n`` threads now, not at its first ``n`` jobs: a thread
    started for a job is started on the loop's thread (``submit``), which waits until
    the OS runs it; 2,000 calls ending at once held the loop ~0.15 s so on a busy
    machine (py-spy, bench/RESULTS.md, the asyncio pool). ``n`` jobs that wait for
    each other keep any thread from being reused before all are started."""
    barrier = threading.Barrier(n)
    jobs = [executor.submit(barrier.wait, THREADS_START_S) for _ in range(n)]
    concurrent.futures.wait(jobs, THREADS_START_S)


class Handover:
    """Deliveries the consumer's thread hands to the loop's, woken once for many.

    ``asyncio.run_coroutine_threadsafe`` wakes the loop for each (a write to its
    self-pipe, the GIL handed over and back): with 64 messages a fetch and the loop
    busy claiming, half of the consumer's time per message went there (py-spy,
    bench/RESULTS.md, the asyncio pool). :meth:`put` says whether the loop must be
    woken: only when nothing handed over is waiting for a wake-up already;
    :meth:`take`, on the loop, takes all there is and ends that wake-up (what is put
    after it wakes the loop again)."""

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._lock = threading.Lock()
        self._woken = False

    def put(self, item: Any) -> bool:
        with self._lock:
            self._items.append(item)
            wake, self._woken = not self._woken, True
        return wake

    def take(self) -> list[Any]:
        with self._lock:
            items, self._items = self._items, []
            self._woken = False
        return items


async def _settled(job: Any, future: concurrent.futures.Future[Any]) -> None:
    """Await ``job``; its result, exception or cancellation goes to ``future``, as
    ``asyncio.run_coroutine_threadsafe`` would pass them on."""
    try:
        result = await job
    except asyncio.CancelledError:
        future.cancel()
        raise
    except Exception as exc:
        if future.set_running_or_notify_cancel():
            future.set_exception(exc)
    else:
        if future.set_running_or_notify_cancel():
            future.set_result(result)


class ApplyResult:
    """What ``on_apply`` returns (as the threads pool's): the job's future."""

    def __init__(self, future: concurrent.futures.Future[Any]) -> None:
        self.f = future
        self.get = future.result

    def wait(self, timeout: float | None = None) -> None:
        concurrent.futures.wait([self.f], timeout)


class AsyncioPool(BasePool):
    """Celery's pool for toolq's calls on an event loop (the module's docstring)."""

    #: The name ``toolq status`` shows (Celery's aliases do not list it).
    alias = "asyncio"
    body_can_be_buffer = False
    signal_safe = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.limit: int = int(self.limit or 1)
        self.threads = min(self.limit, MAX_THREADS)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._slots: asyncio.Semaphore | None = None
        #: The calls holding a slot (accepted), and those waiting for one.
        self._running: set[asyncio.Task[Any]] = set()
        self._waiting: set[asyncio.Task[Any]] = set()
        self._runtimes: dict[int, AioRuntime] = {}
        self._pid = os.getpid()
        #: Whether Celery's consumer runs a hub (its acks go onto it): see traced_inline.
        self._hub = False
        #: The lean success (toolq.services.workers.lean), and which tasks are plain.
        self.lean = bool(self.app is None or self.app.conf.get(LEAN_KEY, True))
        self._plain: dict[str, bool] = {}
        #: The collector's first threshold while the pool runs (``worker.gc_threshold``),
        #: and the thresholds before it.
        self.gc_threshold = int((self.app.conf.get(GC_KEY) if self.app is not None else 0) or 0)
        self._gc_before: tuple[int, int, int] | None = None
        #: Successes the lean path reported, and calls Celery's tracer ran (``stats``):
        #: counted once the loop has the record's reply, after the ledger marked the
        #: call done and acknowledged its delivery (a reader may see that first).
        self.lean_count = 0
        self.traced_count = 0
        #: Deliveries handed over by the consumer's thread, not yet started on the loop.
        self._handed = Handover()
        self._jobs: set[asyncio.Task[None]] = set()
        #: The content types the app accepts (Celery's setting, read once).
        self._accept: set[str] | None = None
        #: Whether the ledger acknowledges the deliveries (Celery's setting, read once).
        self._in_ledger: bool | None = None

    # ------------------------------------------------------------ lifecycle

    def on_start(self) -> None:
        self._gc_before = heap.young_threshold(self.gc_threshold)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.threads, thread_name_prefix="toolq-aio-sync"
        )
        started_threads(self._executor, self.threads)
        loop = self.loop = asyncio.new_event_loop()
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            self._slots = asyncio.Semaphore(self.limit)
            loop.call_soon(started.set)
            loop.run_forever()

        self._thread = threading.Thread(target=serve, name="toolq-aio-loop", daemon=True)
        self._thread.start()
        started.wait()
        # The runtimes (the App's, the loop's ledgers) before the first delivery, which
        # would otherwise hold the loop while they are made.
        asyncio.run_coroutine_threadsafe(self._warm(), loop)

    def register_with_event_loop(self, loop: Any) -> None:
        """Celery's consumer runs on a hub (``asynloop``), before its first delivery."""
        self._hub = loop is not None

    async def _warm(self) -> None:
        try:
            for task in list(self.app.tasks.values()) if self.app is not None else []:
                found = getattr(task, "toolq_aio", None)
                if isinstance(found, AioBodies):
                    self._runtime(found)
        except Exception:  # made at the first delivery instead
            log.debug("asyncio pool: runtime not made ahead", exc_info=True)

    def on_stop(self) -> None:
        """Warm: the calls in flight finish (at most :data:`WARM_SHUTDOWN_S`)."""
        self._shutdown(WARM_SHUTDOWN_S)

    def on_terminate(self) -> None:
        """Cold: the calls in flight are cancelled now."""
        self._shutdown(0.0)

    def _shutdown(self, patience_s: float) -> None:
        loop = self.loop
        if loop is None or loop.is_closed() or self._pid != os.getpid():
            return
        if loop.is_running():
            done = asyncio.run_coroutine_threadsafe(self._drain(patience_s), loop)
            try:
                done.result(patience_s + 10.0)
            except Exception:
                log.warning("the asyncio pool did not drain cleanly", exc_info=True)
            loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(10.0)
        if not loop.is_running():
            loop.close()
        if self._executor is not None:
            self._executor.shutdown(wait=patience_s > 0, cancel_futures=True)
        self.loop = None
        heap.restore_threshold(self._gc_before)
        self._gc_before = None

    async def _drain(self, patience_s: float) -> None:
        for task in list(self._waiting):  # not started: their messages come back
            task.cancel()
        if self._running and patience_s > 0:
            log.warning("asyncio pool: waiting for %d calls in flight", len(self._running))
            await asyncio.wait(list(self._running), timeout=patience_s)
        left = [t for t in self._running | self._waiting if not t.done()]
        for task in left:
            task.cancel()
        if left:
            log.warning("asyncio pool: %d calls cancelled (their leases settle them)", len(left))
            await asyncio.gather(*left, return_exceptions=True)
        for rt in self._runtimes.values():
            await rt.aclose()
            for ledger in (rt.ledger, rt.leases.ledger):
                with contextlib.suppress(Exception):
                    await ledger.redis.aclose()
        self._runtimes.clear()

    # ------------------------------------------------------------ jobs

    def on_apply(  # type: ignore[override]
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        callback: Callable[..., Any] | None = None,
        accept_callback: Callable[..., Any] | None = None,
        **_: Any,
    ) -> ApplyResult:
        loop = self.loop
        if loop is None:
            raise RuntimeError("the asyncio pool is not running")
        job = self._job(target, tuple(args or ()), kwargs or {}, callback, accept_callback)
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if self._handed.put((job, future)):
            loop.call_soon_threadsafe(self._start_handed)
        return ApplyResult(future)

    def _start_handed(self) -> None:
        """On the loop: a task for each delivery handed over since the last wake-up."""
        loop = asyncio.get_running_loop()
        for job, future in self._handed.take():
            task = loop.create_task(_settled(job, future))
            self._jobs.add(task)  # held until done (the loop keeps weak references only)
            task.add_done_callback(self._jobs.discard)

    async def _job(
        self,
        target: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        callback: Callable[..., Any] | None,
        accept_callback: Callable[..., Any] | None,
    ) -> None:
        task = asyncio.current_task()
        assert task is not None and self._slots is not None
        self._waiting.add(task)
        try:
            await self._slots.acquire()
        finally:
            self._waiting.discard(task)
        self._running.add(task)
        try:
            aio = self._bodies_of(args)
            if aio is None:  # another task: a thread runs it, as the threads pool would
                await self._blocking(
                    functools.partial(apply_target, target, args, kwargs, callback, accept_callback)
                )
                return
            if accept_callback is not None:
                accept_callback(os.getpid(), time.monotonic())
            started = time.monotonic()
            done, ok, embed, traced = await self._serve(aio, args)
            receivers = _task_signal_receivers()
            inline = traced_inline(ok, receivers, self._hub, len(self._running), self.threads)
            runtime = time.monotonic() - started
            if self._succeeded(ok, inline, args, embed, done, runtime, callback):
                self.lean_count += 1
                return  # no tracer (toolq.services.workers.lean)
            self.traced_count += 1
            trace = functools.partial(_trace, done, target, traced, kwargs, callback)
            if inline:
                trace()  # no hop to a thread and back (the module's docstring)
            else:
                await self._blocking(trace)
        finally:
            self._running.discard(task)
            self._slots.release()

    def _bodies_of(self, args: tuple[Any, ...]) -> AioBodies | None:
        """A toolq task's bodies when ``args`` are a tracer's (name, id, request, body,
        content type, encoding) for one; None for anything else."""
        if len(args) < 6 or not isinstance(args[0], str) or self.app is None:
            return None
        task = self.app.tasks.get(args[0])
        found = getattr(task, "toolq_aio", None)
        return found if isinstance(found, AioBodies) else None

    async def _serve(
        self, aio: AioBodies, args: tuple[Any, ...]
    ) -> tuple[Callable[[], str], bool, dict[str, Any] | None, tuple[Any, ...]]:
        """Await the body; what the task then returns (or raises) in the tracer, whether
        it returned, the message's embed (its callbacks, chain, chord), and the tracer's
        ``args``: with the message's body as decoded here and no content type, which
        Celery's tracer takes as it is (not decoding it again)."""
        name, task_id, request, body, content_type, content_encoding = args[:6]
        embed: dict[str, Any] | None = None
        traced = args
        try:
            if content_type:
                if self._accept is None:
                    self._accept = prepare_accept_content(self.app.conf.accept_content)
                body = loads(body, content_type, content_encoding, accept=self._accept)
                traced = (name, task_id, request, body, None, None, *args[6:])
            call_args, call_kwargs, embed = body
            rt = self._runtime(aio)
            value = await aio.body(rt, self._delivery(request), *call_args, **call_kwargs)
        except Exception as exc:  # raised again in the tracer, which reports it as Celery does
            failure = exc

            def raising() -> str:
                raise failure

            return raising, False, embed, args
        return (lambda: value), True, embed, traced

    def _succeeded(
        self,
        returned: bool,
        inline: bool,
        args: tuple[Any, ...],
        embed: dict[str, Any] | None,
        done: Callable[[], str],
        runtime: float,
        callback: Callable[..., Any] | None,
    ) -> bool:
        """The lean success (:mod:`toolq.services.workers.lean`): True when the
        request's callback got the body's success without Celery's tracer."""
        if not self.lean or not returned or self.app is None:
            return False
        name, request = args[0], args[2]
        plain = self._plain.get(name)
        if plain is None:
            plain = self._plain[name] = lean.plain_task(self.app.tasks[name])
        ok = lean.lean_success(
            returned=returned,
            inline=inline,
            plain=plain,
            ignore_result=lean.ignore_result_of(request),
            linked=lean.linked(request, embed),
            logs_success=lean.TRACE_LOG.isEnabledFor(logging.INFO),
        )
        if not ok:
            return False
        try:
            result = task_result(done())
        except Exception:  # not a success: the tracer reports it as Celery does
            return False
        lean.succeed(callback, result, runtime, self.app.tasks[name])
        return True

    def _runtime(self, aio: AioBodies) -> AioRuntime:
        key = id(aio.runtime)
        rt = self._runtimes.get(key)
        if rt is None:
            # Renewals on connections of their own: never behind thousands of claims.
            rt = AioRuntime(aio.runtime(), aio.ledger(), self._blocking, renew=aio.ledger())
            self._runtimes[key] = rt
        return rt

    def _delivery(self, request: Any) -> str | None:
        """The delivery tag the ledger acknowledges with (as
        :func:`toolq.adapters.broker.ack.delivery_of`, from the tracer's request)."""
        if self._in_ledger is None:  # the app's setting, read once (not at every call)
            self._in_ledger = self.app is not None and in_ledger(self.app.conf)
        if not self._in_ledger:
            return None
        tag = ((request or {}).get("delivery_info") or {}).get("delivery_tag")
        return str(tag) if tag else None

    async def _blocking(self, fn: Callable[[], Any]) -> Any:
        assert self.loop is not None and self._executor is not None
        return await self.loop.run_in_executor(self._executor, fn)

    # ------------------------------------------------------------ reports

    @property
    def num_processes(self) -> int:
        return self.limit

    def _get_info(self) -> dict[str, Any]:
        return {
            "implementation": DOTTED,
            "max-concurrency": self.limit,
            "threads": self.threads,
            "in-flight": len(self._running),
            "waiting": len(self._waiting),
            "lean": self.lean,
            "lean-successes": self.lean_count,
            "traced": self.traced_count,
            "gc-threshold": self.gc_threshold,
        }
