"""Waiting for a dependency that is away: since when, how long before the next try,
and the two lines an operator reads.

Every long-running process (worker, scheduler, relay, API, MCP server) outlives an
outage of the ledger's server or of the broker of any length: it tries again after
a delay that doubles from ``first_s`` up to ``cap_s`` (so it resumes within
``cap_s`` of the dependency answering), logs one line when the wait starts and
one when it ends, never one per try, and its heartbeat says what it waits for
(:meth:`Outage.beat`, shown by ``toolq status``).

:class:`Outage` is the pure bookkeeping (time passed in); :class:`Waiter` is the
thin shell a process loop uses: it logs and sleeps. :class:`Watch` is the shell for
a server that answers requests (the HTTP API, the console, the MCP server): a request
that finds the dependency away fails at once (503, a retryable envelope), the first
such failure starts a probe that tries the dependency on the same delays, and the
probe's answer ends the outage: the same two lines, however many requests failed,
both warnings (the MCP server logs at warning by default: its operator sees the end
of what it saw start). :class:`OutageLog` is the shell for a library whose callers
fail at once and call again on their own (the framework adapters): the two lines,
the end said by the next call that goes through; no probe, no sleeping.

==============================  ==========  ====================================
event                           next delay  line
==============================  ==========  ====================================
first failure                   first_s     "<what> unavailable (<why>); retrying
                                            every ≤ <cap_s> s" (warning)
another failure                 doubled,    none
                                ≤ cap_s
it answered, after a wait       reset       "<what> back after <n> s" (info)
it answered, no wait            reset       none
a failure within cap_s of the   first_s     none: a flap of the outage just
answer that ended a wait                    ended (a pooled connection from
                                            before it), unless it lasts
                                            FLAP_S: then the first failure's line
it answered, after a flap       reset       none (unless its line was said)
==============================  ==========  ====================================
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from toolq.core.redact import CREDENTIALS_ADVICE

#: The first wait after a failure, and the longest: a process resumes within
#: CAP_S of its dependency answering again (the issue asks for ≤ 5 s).
FIRST_S = 0.5
CAP_S = 2.0
#: A flap (a failure right after an outage ended) lasting this long is an outage of
#: its own, and said.
FLAP_S = 10.0


#: What to check, by the failure's class name, where it is the process's own setting
#: and not the server's absence (redis-py's AuthenticationError is a ConnectionError:
#: waited for like one, since a password may be changing on the server, but said).
HINTS = {
    "AuthenticationError": CREDENTIALS_ADVICE,
    "AuthenticationWrongNumberOfArgsError": CREDENTIALS_ADVICE,
}


@dataclass
class Outage:
    """One dependency's outage as a process sees it. Pure: ``now`` is passed in
    (seconds, wall clock: :meth:`beat` tells other processes when it started)."""

    #: What is waited for, as said in the log and in ``toolq status``: "the broker".
    what: str
    #: Its key in a heartbeat's ``waiting``: "broker", "ledger".
    key: str = ""
    first_s: float = FIRST_S
    cap_s: float = CAP_S
    #: How the wait's first line says it: "<what> unavailable (...)".
    down: str = "unavailable"
    #: What the process does meanwhile, the first line's end (default: "retrying
    #: every ≤ <cap_s> s").
    meanwhile: str = ""
    #: When the first failure of the current outage happened (None: no outage).
    since: float | None = None
    #: Why it failed first (an exception's class name), and what to check if the
    #: failure says more than its class (a rediss:// URL's handshake that timed out).
    why: str = ""
    advice: str = ""
    delay_s: float = 0.0
    #: When the last outage ended, and whether the current one is a flap of it.
    ended: float | None = None
    flap: bool = False

    @property
    def waiting(self) -> bool:
        return self.since is not None

    def failed(self, now: float, why: str, advice: str = "") -> tuple[float, str | None]:
        """A try failed: the seconds to wait before the next, and the line to log
        (only for the first failure of an outage; ``advice``: what to check, else
        :data:`HINTS`' for ``why``)."""
        if self.since is None:
            self.since, self.why, self.delay_s = now, why, self.first_s
            self.advice = advice
            self.flap = self.ended is not None and now - self.ended < self.cap_s
            return self.delay_s, None if self.flap else self._line()
        self.delay_s = min(self.delay_s * 2, self.cap_s)
        if self.flap and now - self.since >= FLAP_S:
            self.flap = False
            return self.delay_s, self._line()
        return self.delay_s, None

    def answered(self, now: float) -> str | None:
        """A try succeeded: the line to log if it ends an outage."""
        if self.since is None:
            return None
        took, flap = max(0.0, now - self.since), self.flap
        self.since, self.why, self.delay_s, self.ended, self.flap = None, "", 0.0, now, False
        self.advice = ""
        return None if flap else f"{self.what} back after {took:.0f} s"

    def _line(self) -> str:
        meanwhile = self.meanwhile or f"retrying every ≤ {self.cap_s:g} s"
        hint = self.advice or HINTS.get(self.why)
        why = f"{self.why}: {hint}" if hint else self.why
        return f"{self.what} {self.down} ({why}); {meanwhile}"

    def beat(self) -> dict[str, Any] | None:
        """What a heartbeat carries while waiting: ``{"for": key, "since": ms}``."""
        if self.since is None:
            return None
        return {"for": self.key or self.what, "since": int(self.since * 1000)}


class Waiter:
    """:class:`Outage` with a logger, a clock and a stop event: what a loop calls."""

    def __init__(
        self,
        outage: Outage,
        log: logging.Logger,
        *,
        clock: Callable[[], float] = time.time,
        stop: threading.Event | None = None,
        advice: Callable[[BaseException], str] | None = None,
    ) -> None:
        self.outage = outage
        self.log = log
        self.clock = clock
        self.stop = stop or threading.Event()
        #: What to check for a failure, from the exception itself ("": nothing more).
        self.advice = advice

    @property
    def waiting(self) -> bool:
        return self.outage.waiting

    def failed(self, exc: BaseException, *, traceback: bool = False) -> bool:
        """Log the start of an outage (once; with the traceback if asked: an
        unexpected error) and sleep until the next try, or until stopped. Returns
        whether this failure started the outage."""
        advice = self.advice(exc) if self.advice is not None else ""
        delay, line = self.outage.failed(self.clock(), type(exc).__name__, advice)
        if line is not None:
            if traceback:
                self.log.error("%s", line, exc_info=exc)
            else:
                self.log.warning("%s", line)
        else:
            self.log.debug("%s still unavailable (%s)", self.outage.what, type(exc).__name__)
        self.stop.wait(delay)
        return line is not None

    def answered(self) -> None:
        line = self.outage.answered(self.clock())
        if line is not None:
            self.log.info("%s", line)


class OutageLog:
    """:class:`Outage` for calls made from any thread that fail at once and are made
    again by their callers: the first failure of an outage logs its line, the next
    call that goes through logs its end (both warnings: a process run at -l warning,
    the MCP server's default, shows the end of what it showed start); every failure in
    between is a debug line."""

    def __init__(
        self, outage: Outage, log: logging.Logger, *, clock: Callable[[], float] = time.time
    ) -> None:
        self.outage = outage
        self.log = log
        self.clock = clock
        self._lock = threading.Lock()

    def failed(self, exc: BaseException, detail: str = "") -> None:
        with self._lock:
            _, line = self.outage.failed(self.clock(), type(exc).__name__)
        if line is None:
            self.log.debug("%s still unavailable (%s)", self.outage.what, type(exc).__name__)
        elif detail:
            self.log.warning("%s: %s", line, detail)
        else:
            self.log.warning("%s", line)

    def answered(self) -> None:
        if not self.outage.waiting:  # the usual case: no lock taken
            return
        with self._lock:
            line = self.outage.answered(self.clock())
        if line is not None:
            self.log.warning("%s", line)


class Watch:
    """:class:`OutageLog` with a probe, for a server answering requests on an event
    loop.

    Requests call :meth:`failed` when the dependency did not answer (and answer their
    caller at once); the first failure logs the outage's line and starts a probe on
    this loop that calls ``probe`` after the outage's delays until it returns, then
    logs the end. Every other failure meanwhile is a debug line. :meth:`close` stops
    the probe (the server shutting down).
    """

    def __init__(
        self,
        outage: Outage,
        probe: Callable[[], Awaitable[object]],
        log: logging.Logger,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.outage = outage
        self.probe = probe
        self.said = OutageLog(outage, log, clock=clock)
        self._task: asyncio.Task[None] | None = None

    @property
    def waiting(self) -> bool:
        return self.outage.waiting

    def failed(self, exc: BaseException, detail: str = "") -> None:
        """A request found the dependency away. ``detail``: what the first line adds
        (a message of toolq's own naming the server; never upstream text)."""
        if self._task is not None and not self._task.done():
            self.said.log.debug("%s still unavailable (%s)", self.outage.what, type(exc).__name__)
            return
        self.said.failed(exc, detail)
        self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(self.outage.delay_s)
            try:
                await self.probe()
            except Exception as exc:  # any failure: still away, by the probe's word
                self.said.failed(exc)
                continue
            self.said.answered()
            return

    async def close(self) -> None:
        """Stop the probe, if one runs."""
        task, self._task = self._task, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
