"""``GET /v1/operations/{ref}/events``: an operation's life as Server-Sent Events.

The stream replays the history after ``Last-Event-ID``, then follows the
operation live, and ends once it has settled::

    retry: 1000                       the reconnect delay: the API's poll interval

    id: 1                             one ``state`` event per history entry; its id
    event: state                      is the entry's index (1 = the submit), so a
    data: {"index":1,"state":"queued","from":null,"at":"...","attempt":0,"code":null}

    id: 4                             a verification check's verdict is an entry too
    event: state                      (from and to verifying, or where it led), with
    data: {...,"check":{"check":2,"result":"unavailable","detail":"UNAVAILABLE",
           "next_at":"...","words":"verifier unavailable: checks again later"}}

    event: progress                   what the tool reports (no id: progress is not
    data: {"fraction":0.5,"message":"half way"}            kept, a reconnect skips it)

    id: 3                             last: the settled operation, as GET shows it,
    event: envelope                   with the envelope ``tq.wait`` returns; the
    data: {"operation_ref":...,"state":"succeeded","envelope":{...},...}    stream ends

    : keep-alive                      a comment every ``keepalive`` seconds

A reconnect sending ``Last-Event-ID: N`` gets the entries after N, so nothing
is lost or repeated; the ``envelope`` event shares the id of the settled state,
so a reconnect after it gets the envelope again (a client should close on it:
a browser's EventSource otherwise reconnects). An operation settled waiting on
a person (``awaiting_approval``, ``needs_input``) ends the stream too; a
reconnect after the person acted follows it on.

Notices only wake the stream: what it sends is read from the ledger's history,
so a notice missed (or dropped for a slow client) costs at most one keep-alive
period, never an event. One task per stream follows the notices; it and its
watch end with the stream, however the client leaves.

The queue's server going away mid-stream ends the stream cleanly (the body is
closed, not broken off); ``away`` is told (the API's outage watch: one line an
outage, not a traceback a stream), and the client's reconnect resumes from its
``Last-Event-ID`` once the server answers again (503 meanwhile).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import anyio
import redis
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from toolq.core import errors, why
from toolq.core.record import HistoryEntry, OperationRecord, ms_to_dt
from toolq.core.redact import scrub
from toolq.core.states import SETTLED, State
from toolq.edges.api.guard import ApiError
from toolq.edges.api.views import settled_envelope, view_body

log = logging.getLogger("toolq.api")

KEEPALIVE = b": keep-alive\n\n"
#: Notices held for a stream whose client reads slowly; older ones are dropped
#: (each only says "read the history again"; progress is best effort).
BACKLOG = 64
#: How long a closing stream waits for its watch to let go.
CLOSE_TIMEOUT = 5.0
_INDEX = re.compile(r"[0-9]{1,9}")
_ENDED = object()


class Notices(Protocol):
    """What the stream needs from the async client (``tq.aio``)."""

    async def get(self, ref: str) -> OperationRecord | None: ...

    async def history(self, ref: str, after: int = 0) -> list[HistoryEntry]: ...

    def watch(self, ref: str) -> AsyncIterator[Any]: ...


class EventStream(StreamingResponse):
    """A streaming response that closes its generator however the response ends.

    Starlette cancels a stream whose client left; a generator suspended at a
    ``yield`` would then be closed only when collected. Closing it here ends its
    watch at once.
    """

    media_type = "text/event-stream"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            aclose = getattr(self.body_iterator, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()


def parse_last_event_id(raw: str | None) -> int:
    """The history index a client has seen (0: none); ``ApiError`` 400 for garbage."""
    if raw is None or not raw.strip():
        return 0
    if not _INDEX.fullmatch(raw.strip()):
        raise ApiError(400, "INVALID_LAST_EVENT_ID", "Last-Event-ID must be an event id (0-9)")
    return int(raw.strip())


async def open_stream(
    aio: Notices,
    ref: str,
    last_event_id: str | None,
    *,
    keepalive: float,
    poll: float,
    max_ref: int,
    away: Callable[[Exception], None],
) -> EventStream:
    """The stream of ``ref`` after ``last_event_id``, or the request's typed error."""
    after = parse_last_event_id(last_event_id)
    rec = await aio.get(ref) if len(ref) <= max_ref else None
    if rec is None:
        raise errors.OperationNotFound("no such operation")
    if after > len(rec.history):
        raise ApiError(
            400,
            "INVALID_LAST_EVENT_ID",
            f"Last-Event-ID {after} is past the operation's last event ({len(rec.history)})",
        )
    last = rec.history[after - 1].to if after else None
    body = _events(aio, ref, after, last, keepalive=keepalive, poll=poll, away=away)
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return EventStream(body, headers=headers)


def sse(event: str, data: dict[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def state_event(index: int, entry: HistoryEntry) -> bytes:
    # Who made the transition (a worker's host, an operator) stays out: agents read this.
    data: dict[str, Any] = {
        "index": index,
        "state": entry.to.value,
        "from": entry.from_.value if entry.from_ is not None else None,
        "at": entry.at_time.isoformat(),
        "attempt": entry.attempt,
        "code": entry.code,
    }
    check = why.check_row(index, entry)
    if check is not None and entry.note:
        # a verification check's verdict (who made it stays out, as above)
        data["check"] = {
            "check": check.check,
            "result": check.result,
            "detail": check.detail or None,
            "next_at": ms_to_dt(check.next_ms).isoformat() if check.next_ms else None,
            "words": check.words,
        }
    return sse("state", data, index)


def progress_event(notice: Any) -> bytes | None:
    p = getattr(notice, "progress", None)
    if p is None:
        return None
    fraction = getattr(p, "fraction", None)
    message = getattr(p, "message", None)
    return sse(
        "progress",
        {
            "fraction": fraction if isinstance(fraction, int | float) else None,
            "message": scrub(message)[:280] if isinstance(message, str) else None,
        },
    )


async def _events(
    aio: Notices,
    ref: str,
    sent: int,
    last: State | None,
    *,
    keepalive: float,
    poll: float,
    away: Callable[[Exception], None] | None = None,
) -> AsyncIterator[bytes]:
    inbox: asyncio.Queue[Any] = asyncio.Queue(BACKLOG)
    pump: asyncio.Task[None] | None = None
    try:
        yield f"retry: {max(1, round(poll * 1000))}\n\n".encode()
        progress: list[Any] = []
        while True:
            if pump is None or pump.done():
                # The first watch, or a new one after the last ended on a settled state.
                _raise_failure(pump)
                pump = _follow(aio, ref, inbox)
                # Let the watch register before the read below, so that no notice
                # falls between the two.
                await asyncio.sleep(0)
            try:
                entries = await aio.history(ref, after=sent)
            except errors.OperationNotFound:  # expired (retention) meanwhile
                return
            for entry in entries:
                sent += 1
                last = entry.to
                yield state_event(sent, entry)
            for notice in progress:
                chunk = progress_event(notice)
                if chunk is not None:
                    yield chunk
            progress = []
            if last in SETTLED:
                rec = await aio.get(ref)
                if rec is None:  # expired (retention) meanwhile: nothing more to say
                    return
                if rec.state in SETTLED and len(rec.history) == sent:
                    body = view_body(rec, poll, envelope=settled_envelope(rec))
                    yield sse("envelope", body, sent)
                    return
                continue  # it moved on since: read the new entries
            notices: list[Any] = []
            with anyio.move_on_after(keepalive):
                notices.append(await inbox.get())
            if not notices:
                yield KEEPALIVE  # and read the history again, in case a notice was missed
                continue
            while not inbox.empty():
                notices.append(inbox.get_nowait())
            progress = [n for n in notices if getattr(n, "kind", None) == "progress"]
    except (errors.ServerUnavailable, redis.RedisError) as exc:
        # The server went away: end the body cleanly (a chunked body broken off is
        # an error in the client, and a traceback here); the reconnect resumes.
        if away is not None:
            away(exc)
        else:
            log.warning("event stream: queue server unavailable: %s", type(exc).__name__)
    finally:
        if pump is not None:
            pump.cancel()
            with anyio.move_on_after(CLOSE_TIMEOUT, shield=True):
                await asyncio.wait({pump})


def _follow(aio: Notices, ref: str, inbox: asyncio.Queue[Any]) -> asyncio.Task[None]:
    return asyncio.create_task(_pump(aio, ref, inbox), name=f"toolq-events:{ref[:80]}")


async def _pump(aio: Notices, ref: str, inbox: asyncio.Queue[Any]) -> None:
    it = aio.watch(ref)
    try:
        async for notice in it:
            _offer(inbox, notice)
        _offer(inbox, _ENDED)
    finally:
        aclose = getattr(it, "aclose", None)
        if aclose is not None:
            await aclose()


def _offer(inbox: asyncio.Queue[Any], notice: Any) -> None:
    if inbox.full():
        inbox.get_nowait()
    inbox.put_nowait(notice)


def _raise_failure(pump: asyncio.Task[None] | None) -> None:
    # The watch failed (Redis went away): end the stream; the client resumes from
    # its Last-Event-ID once the server answers again.
    if pump is None or pump.cancelled():
        return
    exc = pump.exception()
    if isinstance(exc, errors.OperationNotFound):
        return  # expired meanwhile: the history read that follows ends the stream
    if exc is not None:
        raise exc
