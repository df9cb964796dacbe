"""The HTTP API served by uvicorn, under waiting clients: long-polls and event streams.

A real server (uvicorn on its own event loop, in a thread of this process, so
the test can look at that loop's tasks), real ``toolq worker`` and ``toolq
scheduler`` processes, real Valkey. The last tests drive the event stream's
generator with a stand-in client, for what no tool of the test app does
(report progress) or what cannot be timed from outside (a notice missed).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

import httpx
import pytest
import uvicorn
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.helpers import serving, wait_until
from tests.integration.apps import interfaces_app
from tests.integration.apps.interfaces_app import APP, open_gate
from toolq import ToolQueue
from toolq.core.envelope import parse_envelope
from toolq.core.record import HistoryEntry, OperationRecord
from toolq.core.states import State
from toolq.edges.api import ApiSettings, create_app
from toolq.edges.api.events import _events

AGENT = "agent-token-0123456789"
TOKENS = f"{AGENT}=invoke,read"
AUTH = {"Authorization": f"Bearer {AGENT}"}
#: Short, so a test sees a keep-alive without waiting long.
KEEPALIVE = 0.5
LONG_POLLS = 300
T = TypeVar("T")


class Inflight:
    """Counts long-polls (``?wait=``) being served and served, in front of the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.now = 0
        self.done = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        polling = scope["type"] == "http" and b"wait=" in scope.get("query_string", b"")
        if not polling:
            await self.app(scope, receive, send)
            return
        self.now += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.now -= 1
            self.done += 1


class ApiServer:
    """uvicorn serving ``app`` on a loopback port, on an event loop in a thread of its own."""

    def __init__(self, app: ASGIApp) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        config.timeout_graceful_shutdown = 2
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),), daemon=True)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self.sock])

    def __enter__(self) -> ApiServer:
        self.thread.start()
        assert wait_until(lambda: self.server.started, 30), "uvicorn did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)
        self.sock.close()

    def on_loop(self, fn: Callable[[], T]) -> T:
        """``fn()`` called on the server's loop (what is alive there is seen from there)."""
        assert self.loop is not None

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(timeout=10)

    def streams(self) -> list[str]:
        """The event streams' tasks alive on the server's loop."""

        def names() -> list[str]:
            return [
                t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("toolq-ev")
            ]

        return self.on_loop(names)


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    with serving(interfaces_app.tq, APP, module_redis_url) as app_tq:
        yield app_tq


@pytest.fixture(scope="module")
def inflight(tq: ToolQueue) -> Inflight:
    settings = ApiSettings(tokens=TOKENS, max_wait=20, poll_interval=0.5, keepalive=KEEPALIVE)
    return Inflight(create_app(tq, settings))


@pytest.fixture(scope="module")
def server(inflight: Inflight) -> Iterator[ApiServer]:
    with ApiServer(inflight) as srv:
        yield srv


@pytest.fixture
def client(server: ApiServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        yield c


def key() -> str:
    return f"run_{uuid.uuid4().hex[:8]}/step_1"


def invoke(client: httpx.Client, tool: str, args: Any, ref: str) -> None:
    r = client.post(f"/v1/tools/{tool}:invoke", json=args, headers={"Idempotency-Key": ref})
    assert r.status_code == 202, r.text


@dataclass
class Event:
    event: str
    id: int | None
    data: dict[str, Any]


def events(response: httpx.Response) -> Iterator[Event | str]:
    """The events of an SSE response as they arrive; a comment line as its text."""
    fields: dict[str, str] = {}
    for line in response.iter_lines():
        if line.startswith(":"):
            yield line
        elif line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        elif "event" in fields:
            raw_id = fields.get("id")
            yield Event(
                fields["event"], int(raw_id) if raw_id else None, json.loads(fields["data"])
            )
            fields = {}
        else:
            fields = {}  # the retry: field alone


def stream(client: httpx.Client, ref: str, last_event_id: int | str | None = None) -> Any:
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    return client.stream("GET", f"/v1/operations/{ref}/events", headers=headers)


def history_states(tq: ToolQueue, ref: str) -> list[str]:
    rec = tq.get(ref)
    assert rec is not None
    return [h.to.value for h in rec.history]


# --------------------------------------------------------------------------- long-polls


def test_health_answers_while_hundreds_of_long_polls_wait(
    tq: ToolQueue, server: ApiServer, inflight: Inflight
) -> None:
    # Given operations that hold the worker's every thread and will not settle on their own
    refs = [key() for _ in range(4)]
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=30) as c:
        for ref in refs:
            invoke(c, "create_note", {"body": "held", "gate": True}, ref)

    def running(ref: str) -> bool:
        rec = tq.get(ref)
        return rec is not None and rec.state is State.RUNNING

    # (the worker, started with the module, may not have claimed them yet)
    assert wait_until(lambda: all(running(r) for r in refs), 60), [tq.get(r) for r in refs]
    threads_before = threading.active_count()

    async def scenario() -> tuple[list[httpx.Response], httpx.Response, int, int]:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(
            base_url=server.url, headers=AUTH, timeout=60, limits=limits
        ) as c:
            # When hundreds of agents long-poll them
            polls = [
                asyncio.create_task(
                    c.get(f"/v1/operations/{refs[i % len(refs)]}", params={"wait": 20})
                )
                for i in range(LONG_POLLS)
            ]
            for _ in range(1200):
                if inflight.now >= LONG_POLLS:
                    break
                await asyncio.sleep(0.05)
            assert inflight.now == LONG_POLLS, inflight.now
            threads_waiting = threading.active_count()
            # Then health and a plain read still answer, while every long-poll is held
            health = await c.get("/v1/health")
            read = await c.get(f"/v1/operations/{refs[0]}")
            assert read.status_code == 200 and read.json()["state"] == "running"
            returned_meanwhile = inflight.done
            # And the long-polls return the outcome once it is there
            for ref in refs:
                open_gate(tq.redis, ref)
            return await asyncio.gather(*polls), health, returned_meanwhile, threads_waiting

    done_before = inflight.done
    answers, health, returned_meanwhile, threads_waiting = asyncio.run(scenario())
    assert health.status_code == 200 and health.json() == {"ok": True}
    assert returned_meanwhile == done_before, "health answered only after long-polls returned"
    # No thread per waiting request (a thread pool would have grown by dozens).
    assert threads_waiting <= threads_before + 4, (threads_before, threads_waiting)
    assert all(r.status_code == 200 for r in answers)
    assert {r.json()["state"] for r in answers} == {"succeeded"}


# --------------------------------------------------------------------------- event streams


def test_a_stream_follows_a_real_operation_to_its_envelope(
    tq: ToolQueue, client: httpx.Client
) -> None:
    # Given a call that is rate-limited once, then retried by the scheduler
    ref = key()
    invoke(client, "flaky", {"text": "x"}, ref)

    # When a client follows its event stream to the end
    with stream(client, ref) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        got = [e for e in events(r) if isinstance(e, Event)]

    # Then it saw every state entered, in order, with increasing ids, then the envelope
    states = [e for e in got if e.event == "state"]
    assert [e.data["state"] for e in states] == history_states(tq, ref)
    names = [e.data["state"] for e in states]
    assert names[0] == "queued" and "waiting_retry" in names and names[-1] == "succeeded"
    assert [e.id for e in states] == list(range(1, len(states) + 1))
    assert all(e.data["index"] == e.id for e in states)
    final = got[-1]
    assert final.event == "envelope" and final.id == states[-1].id
    assert final.data["state"] == "succeeded" and final.data["settled"] is True
    env = parse_envelope(final.data["envelope"])
    assert env.ok and final.data["envelope"]["result"] == {"text": "x", "attempt": 2}


def test_a_reconnect_with_last_event_id_resumes_without_loss_or_repeat(
    tq: ToolQueue, client: httpx.Client
) -> None:
    # Given a stream of an operation held while running, read until "running"
    ref = key()
    invoke(client, "create_note", {"body": "resume", "gate": True}, ref)
    first: list[Event] = []
    with stream(client, ref) as r:
        for e in events(r):
            if isinstance(e, Event):
                first.append(e)
                if e.data.get("state") == "running":
                    break  # the client goes away mid-stream

    # When it reconnects with the last id it saw, and the operation then settles
    last_id = first[-1].id
    second: list[Event | str] = []
    with stream(client, ref, last_id) as r:
        assert r.status_code == 200
        for e in events(r):
            second.append(e)
            if e == ": keep-alive" and second.count(e) == 1:
                open_gate(tq.redis, ref)  # the stream is live and waiting: let it finish

    # Then both connections together carry each state once, in order, then the envelope
    resumed = [e for e in second if isinstance(e, Event)]
    states = [e for e in first + resumed if e.event == "state"]
    assert [e.id for e in states] == list(range(1, len(states) + 1))
    assert [e.data["state"] for e in states] == history_states(tq, ref)
    assert resumed[-1].event == "envelope" and resumed[-1].data["state"] == "succeeded"

    # And a reconnect after the end repeats no state: only the envelope again
    with stream(client, ref, resumed[-1].id) as r:
        again = [e for e in events(r) if isinstance(e, Event)]
    assert [e.event for e in again] == ["envelope"]


@pytest.mark.parametrize("bad", ["abc", "-1", "1.5", "2 3", "99", "9" * 30])
def test_a_garbage_or_future_last_event_id_is_a_typed_400(
    tq: ToolQueue, client: httpx.Client, bad: str
) -> None:
    ref = key()
    invoke(client, "echo", {"text": "x"}, ref)
    tq.wait(ref, timeout=15)
    before = history_states(tq, ref)
    r = client.get(f"/v1/operations/{ref}/events", headers={"Last-Event-ID": bad})
    assert r.status_code == 400, r.text
    assert r.json()["code"] == "INVALID_LAST_EVENT_ID" and set(r.json()) == {"code", "message"}
    assert history_states(tq, ref) == before


def test_the_stream_of_an_unknown_ref_is_a_typed_404(tq: ToolQueue, client: httpx.Client) -> None:
    ref = key()
    r = client.get(f"/v1/operations/{ref}/events")
    assert r.status_code == 404 and r.json()["code"] == "OPERATION_NOT_FOUND"
    assert tq.get(ref) is None


def test_a_client_leaving_mid_stream_leaves_no_task_behind(
    tq: ToolQueue, server: ApiServer, client: httpx.Client
) -> None:
    # Given a stream of an operation that stays running, followed to a keep-alive
    ref = key()
    invoke(client, "create_note", {"body": "left", "gate": True}, ref)
    with stream(client, ref) as r:
        # Held in a variable: a generator dropped mid-way closes the response with it.
        seen = events(r)
        while next(seen) != ": keep-alive":
            pass
        assert len(server.streams()) == 1 and server.on_loop(tq.aio.watching) == 1
    # When the client closes the connection (the with block), then its task and its
    # watch end: nothing is left on the server's loop
    try:
        assert wait_until(lambda: not server.streams(), 15), server.streams()
        assert wait_until(lambda: server.on_loop(tq.aio.watching) == 0, 15)
    finally:
        open_gate(tq.redis, ref)
    assert tq.wait(ref, timeout=15).ok


# --------------------------------------------------------------------------- the generator


@dataclass(frozen=True)
class FakeProgress:
    fraction: float | None
    message: str | None


@dataclass(frozen=True)
class FakeNotice:
    kind: str
    state: str = ""
    progress: FakeProgress | None = None


class FakeClient:
    """The three reads the stream makes, over a history the test writes."""

    def __init__(self, ref: str) -> None:
        self.ref = ref
        self.entries: list[HistoryEntry] = []
        self.notices: asyncio.Queue[FakeNotice] = asyncio.Queue()
        self.watching = 0

    def enter(self, to: State) -> None:
        prev = self.entries[-1].to if self.entries else None
        self.entries.append(HistoryEntry(at=len(self.entries), to=to, **{"from": prev}))

    async def get(self, ref: str) -> OperationRecord | None:
        now = datetime.now(UTC)
        state = self.entries[-1].to
        return OperationRecord(
            operation_ref=ref, tool="t", args={}, call_id=None, state=state, attempt=1,
            max_attempts=3, created_at=now, updated_at=now, entered_at=now, deadline=None,
            lease_holder=None, lease_until=None, envelope=None, history=list(self.entries),
        )  # fmt: skip

    async def history(self, ref: str, after: int = 0) -> list[HistoryEntry]:
        return self.entries[after:]

    async def watch(self, ref: str) -> AsyncIterator[FakeNotice]:
        self.watching += 1
        try:
            while True:
                yield await self.notices.get()
        finally:
            self.watching -= 1


async def _next_event(gen: AsyncIterator[bytes]) -> str:
    return (await asyncio.wait_for(gen.__anext__(), 10)).decode()


def test_progress_follows_the_state_it_belongs_to_and_the_watch_ends_with_the_stream() -> None:
    async def scenario() -> tuple[list[str], int]:
        fake = FakeClient("r")
        fake.enter(State.QUEUED)
        gen = _events(fake, "r", 0, None, keepalive=60, poll=1.0)
        seen = [await _next_event(gen), await _next_event(gen)]  # retry:, queued
        # A progress notice that arrives before the history shows "running"
        fake.enter(State.RUNNING)
        await fake.notices.put(FakeNotice("progress", progress=FakeProgress(0.5, "half way")))
        seen += [await _next_event(gen), await _next_event(gen)]
        watching = fake.watching
        await gen.aclose()  # the client left
        return seen, watching - fake.watching

    seen, closed = asyncio.run(scenario())
    assert seen[0].startswith("retry: 1000")
    assert "event: state" in seen[1] and '"state":"queued"' in seen[1] and "id: 1" in seen[1]
    assert "id: 2" in seen[2] and '"state":"running"' in seen[2]
    assert seen[3].startswith("event: progress") and '"fraction":0.5' in seen[3]
    assert closed == 1  # the watch the stream opened was closed with it


def test_a_missed_notice_costs_one_keepalive_not_an_event() -> None:
    async def scenario() -> list[str]:
        fake = FakeClient("r")
        fake.enter(State.QUEUED)
        gen = _events(fake, "r", 0, None, keepalive=0.05, poll=1.0)
        seen = [await _next_event(gen), await _next_event(gen)]
        fake.enter(State.RUNNING)  # no notice published
        fake.enter(State.SUCCEEDED)
        async for chunk in gen:
            seen.append(chunk.decode())
        return seen

    seen = asyncio.run(scenario())
    assert seen[2] == ": keep-alive\n\n"
    assert '"state":"running"' in seen[3] and '"state":"succeeded"' in seen[4]
    assert seen[5].startswith("id: 3\nevent: envelope")


def test_invoke_with_wait_answers_the_settled_operation_in_the_same_request(
    client: httpx.Client, tq: ToolQueue
) -> None:
    # Given a tool the worker runs at once: invoke ?wait= answers 200 with its envelope
    ref = key()
    r = client.post(
        "/v1/tools/echo:invoke",
        params={"wait": 15},
        json={"text": "hi"},
        headers={"Idempotency-Key": ref},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["state"] == "succeeded" and body["settled"] and body["created"] is True
    assert parse_envelope(body["envelope"]).ok and body["envelope"]["result"] == {"text": "hi"}
    assert "location" not in r.headers

    # Given a write held open past the wait: 202 with Location, as without ?wait
    held = key()
    r = client.post(
        "/v1/tools/create_note:invoke",
        params={"wait": 0.5},
        json={"body": "held", "gate": True},
        headers={"Idempotency-Key": held},
    )
    assert r.status_code == 202, r.text
    assert r.headers["location"] == f"/v1/operations/{held}"
    assert not r.json()["settled"] and "retry-after" in r.headers
    # When it is let go, the same invoke again (same key) waits like a new one: 200
    open_gate(tq.redis, held)
    r = client.post(
        "/v1/tools/create_note:invoke",
        params={"wait": 15},
        json={"body": "held", "gate": True},
        headers={"Idempotency-Key": held},
    )
    assert r.status_code == 200, r.text
    assert r.json()["state"] == "succeeded" and r.json()["created"] is False

    # And the wait is bounded as GET's (max_wait=20 here): past it, refused with 422
    r = client.post(
        "/v1/tools/echo:invoke",
        params={"wait": 21},
        json={"text": "hi"},
        headers={"Idempotency-Key": key()},
    )
    assert r.status_code == 422, r.text
    assert "wait" in r.text
