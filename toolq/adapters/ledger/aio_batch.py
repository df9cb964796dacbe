"""Script calls of one event loop, coalesced: one round trip for those asked while one is out.

The asyncio pool holds thousands of calls on one loop, and each sends its own CLAIM
and its own APPLY: a round trip each, a socket write and read on the loop each (and
on a durable server an fsync wait, WAITAOF, for each claim). :class:`Batcher`
gathers what the loop's callers ask while a round trip is out and sends it together
when it is back: the first call goes at once (alone, as it would unbatched), the next
ones as one batch of at most :data:`MAX_BATCH` (the server is never held long by one),
one batch out at a time.

:class:`PipelinedScripts` is the sender for the ledger's scripts: a batch is one
pipeline of the unchanged script calls (each its own FCALL, with its own KEYS,
ARGV and delivery tag to acknowledge: one caller's transition never shares a script
call, so never an error or a refusal, with another's), followed, for durable calls
(a claim of a run), by ONE durability wait that covers every write of the pipeline
(WAITAOF counts the connection's writes before it). On one server only: on a
Cluster a call goes to its cell's node and is sent again on MOVED (the route,
:mod:`toolq.adapters.ledger.route`), and the ledger sends as before.

What each caller gets is its own: the answer of its own script call (:func:`read_round`);
an error that answers its call reaches it alone; what fails the round trip (a lost
connection) or the wait (:class:`toolq.core.errors.NotDurable`) reaches every caller
whose write it concerns, who retries as a lone call would (the task bodies' patience).
A caller cancelled while it waits loses its answer and nothing else: the batch is
sent by the batcher's own task, and a caller cancelled before its batch left is not
sent at all.

The pure pieces (:func:`take`, :func:`deliver`, :func:`read_round`) are tested as
tables; the loop's task only awaits the sender between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Generic, TypeVar

from toolq.adapters.ledger.durability import Plan
from toolq.adapters.ledger.durable import AsyncDurability
from toolq.adapters.ledger.runner import AsyncScripts, lost_scripts

T = TypeVar("T")
R = TypeVar("R")

#: The most calls one round trip carries (a pipeline of so many script calls keeps
#: the server busy for a few ms at most; more wait for the next round trip).
MAX_BATCH = 256

#: One script call: the script's name, its KEYS and its ARGV.
ScriptCall = tuple[str, Sequence[Any], Sequence[Any]]

Waiting = tuple[T, "asyncio.Future[Any]"]


def take(pending: deque[Waiting[T]], limit: int) -> list[Waiting[T]]:
    """The next batch: up to ``limit`` of the oldest callers still waiting, taken off
    ``pending``; a caller cancelled while it waited is dropped (nothing is sent for it)."""
    batch: list[Waiting[T]] = []
    while pending and len(batch) < limit:
        entry = pending.popleft()
        if not entry[1].done():
            batch.append(entry)
    return batch


def deliver(batch: Sequence[Waiting[T]], answers: Sequence[Any]) -> None:
    """Each caller its own answer, in order: an exception is raised to that caller alone.
    A caller gone meanwhile (cancelled) is skipped; the others get theirs."""
    if len(answers) != len(batch):
        answers = [RuntimeError(f"{len(answers)} answers for {len(batch)} calls")] * len(batch)
    for (_, fut), answer in zip(batch, answers, strict=True):
        if fut.done():
            continue
        if isinstance(answer, BaseException):
            fut.set_exception(answer)
        else:
            fut.set_result(answer)


def fail(batch: Sequence[Waiting[T]], exc: BaseException) -> None:
    """Every caller of the batch still waiting gets ``exc`` (cancelled, for a
    cancellation: the batcher's task was stopped, the loop is shutting down)."""
    for _, fut in batch:
        if fut.done():
            continue
        if isinstance(exc, asyncio.CancelledError):
            fut.cancel()
        else:
            fut.set_exception(exc)


def read_round(
    replies: Sequence[Any],
    n: int,
    resend_lost: bool,
    settle: Callable[[Sequence[Any]], None],
) -> tuple[list[Any], list[int]]:
    """The answers of one round trip of ``n`` script calls then the durability waits.

    ``replies``: the pipeline's, an exception in place of a command that failed;
    ``settle``: reads the waits' answers, raises what makes the writes unconfirmed
    (:meth:`toolq.adapters.ledger.durability.Plans.settle`). Returns each call's answer
    (its reply, or the exception it raises to its caller) and the positions to send
    again: calls the server did not run because it lost the scripts, when
    ``resend_lost`` (the first round; then the scripts are loaded). A call that ran is
    confirmed by this round's waits only: when they fail, every such call gets their
    error; a call that failed keeps its own."""
    calls, waits = list(replies[:n]), replies[n:]
    again = [i for i, reply in enumerate(calls) if resend_lost and lost_scripts(reply)]
    resent = set(again)
    ran = [i for i, reply in enumerate(calls) if i not in resent and not _failed(reply)]
    if ran:
        try:
            settle(waits)
        except Exception as exc:
            for i in ran:
                calls[i] = exc
    return calls, again


def _failed(reply: Any) -> bool:
    return isinstance(reply, BaseException)


class Batcher(Generic[T, R]):
    """One loop's calls of one kind, sent in batches by ``send`` (a batch's items in,
    one answer per item out, an exception instance for an item that failed; raising
    fails the whole batch). One batch out at a time; a batch of at most ``limit``.
    ``one``: how a call goes when nothing is out (alone: it answers or raises), if not
    as a batch of one.

    Belongs to the loop it is first called on (its task and futures are that loop's)."""

    def __init__(
        self,
        send: Callable[[list[T]], Awaitable[Sequence[Any]]],
        limit: int = MAX_BATCH,
        name: str = "toolq-ledger-batch",
        one: Callable[[T], Awaitable[R]] | None = None,
    ) -> None:
        if limit < 1:
            raise ValueError("a batch carries one call at least")
        self._send = send
        self._one = one
        self.limit = limit
        self.name = name
        self._pending: deque[Waiting[T]] = deque()
        self._task: asyncio.Task[None] | None = None
        #: A round trip is out (a lone call's or a batch's): a call now waits for the next.
        self._out = False
        #: Round trips sent and calls they carried (for tests and logs).
        self.batches = 0
        self.calls = 0

    async def __call__(self, item: T) -> R:
        if not self._out:
            return await self._alone(item)
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        try:
            return await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                fut.exception()  # answered as its caller was cancelled: read, not logged
            raise

    async def _alone(self, item: T) -> R:
        """Nothing out: the call goes at once, from its caller's task (no hop through the
        batcher's); those asked meanwhile wait for the batcher's task, started after it."""
        self._out = True
        self.batches += 1
        self.calls += 1
        try:
            if self._one is not None:
                return await self._one(item)
            answers = await self._send([item])
        finally:
            self._out = False
            if self._pending:
                self._start()
        if len(answers) != 1:
            raise RuntimeError(f"{len(answers)} answers for 1 call")
        answer = answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[no-any-return]

    def _start(self) -> None:
        self._out = True
        self._task = asyncio.get_running_loop().create_task(self._drain(), name=self.name)

    async def aclose(self) -> None:
        """Stop the batcher's task: the callers still waiting are cancelled."""
        task, self._task = self._task, None
        if task is not None:
            self._out = False
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        fail(list(self._pending), asyncio.CancelledError())
        self._pending.clear()

    async def _drain(self) -> None:
        batch: list[Waiting[T]] = []
        try:
            while self._pending:
                batch = take(self._pending, self.limit)
                if not batch:
                    continue
                self.batches += 1
                self.calls += len(batch)
                try:
                    answers = await self._send([item for item, _ in batch])
                except Exception as exc:  # the round trip failed: each of its callers
                    fail(batch, exc)
                else:
                    deliver(batch, answers)
                batch = []
        except BaseException as exc:  # cancelled (the loop is shutting down)
            fail(batch, exc)
            fail(list(self._pending), exc)
            self._pending.clear()
            raise
        finally:
            if self._task is asyncio.current_task():
                self._task = None
                self._out = False


class PipelinedScripts:
    """The ledger's script calls on one loop in batches: a pipeline of the calls,
    then the durability wait once for a batch of durable ones (see the module)."""

    def __init__(
        self, scripts: AsyncScripts, durable: AsyncDurability, limit: int = MAX_BATCH
    ) -> None:
        self.scripts = scripts
        self.durable = durable
        #: Durable calls (claims of a run): one WAITAOF per batch where the plan waits.
        self.waited: Batcher[ScriptCall, Any] = Batcher(
            functools.partial(self._send, True), limit, "toolq-ledger-durable", self._durable
        )
        #: Every other call (records, claims of a check).
        self.plain: Batcher[ScriptCall, Any] = Batcher(
            functools.partial(self._send, False), limit, "toolq-ledger-plain", self._plain
        )

    async def __call__(
        self, name: str, keys: Sequence[Any], args: Sequence[Any], *, durable: bool = False
    ) -> Any:
        return await (self.waited if durable else self.plain)((name, keys, args))

    async def aclose(self) -> None:
        await self.waited.aclose()
        await self.plain.aclose()

    # A call alone goes as the ledger sends it unbatched (no pipeline to build).

    async def _durable(self, call: ScriptCall) -> Any:
        return await self.durable.call(self.scripts, *call)

    async def _plain(self, call: ScriptCall) -> Any:
        return await self.scripts(*call)

    async def _send(self, durable: bool, calls: list[ScriptCall]) -> list[Any]:
        plan = Plan(wait=False)
        if durable:
            await self.durable.probe()
            plan = self.durable.plans.current()
        settle = functools.partial(self.durable.plans.settle, plan)
        answers: list[Any] = [None] * len(calls)
        todo = list(range(len(calls)))
        for resend_lost in (True, False):
            commands = [tuple(await self.scripts.command(*calls[i])) for i in todo]
            replies = await self.durable.nodes.send([*commands, *plan.waits()], None)
            got, again = read_round(replies, len(todo), resend_lost, settle)
            for i, answer in zip(todo, got, strict=True):
                answers[i] = answer
            todo = [todo[j] for j in again]
            if not todo:
                break
            await self.scripts.load()  # the server lost them (a restart, a flush)
        return answers
