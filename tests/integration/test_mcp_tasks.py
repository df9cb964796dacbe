"""Native MCP tasks (the ``io.modelcontextprotocol/tasks`` extension) with the SDK's client.

The SDK's client has no tasks helper: the extension is declared with a
``ClientExtension`` that claims ``resultType: "task"``, and ``tasks/*`` go out
as raw JSON-RPC requests through its session (with ``Mcp-Name`` set from
``taskId``, as the extension requires over HTTP). Tools run in a
``toolq worker`` subprocess, delayed retries come from a ``toolq scheduler``.
The first tests are pure tables of how a record reads as a task.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar, cast

import anyio
import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client import ClaimContext, ClientExtension, ResultClaim, advertise
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, Request, RequestParams, RequestParamsMeta, Result
from pydantic import BaseModel, Field, TypeAdapter

from tests.helpers import (
    REPO_ROOT,
    free_port,
    serving,
    start_toolq,
    stop_process,
    wait_until,
)
from tests.integration.apps import interfaces_app
from tests.integration.apps.interfaces_app import APP, open_gate
from tests.integration.test_mcp import queued_without_message, record_in
from toolq import ToolQueue
from toolq.core import errors
from toolq.core.envelope import ToolError, parse_envelope
from toolq.core.errors import RateLimited as RateLimitedFailure
from toolq.core.errors import error_envelope
from toolq.core.own_envelopes import success_envelope
from toolq.core.record import HistoryEntry
from toolq.core.states import State
from toolq.edges.mcp_server import create_server
from toolq.edges.mcp_server.taskview import (
    EXTENSION,
    Answer,
    BadAnswer,
    answer,
    describe,
    detailed,
    form_schema,
    input_requests,
    poll_interval_ms,
    task_status,
)

T = TypeVar("T")
RAW = TypeAdapter(dict[str, Any])
INVALID_PARAMS, INVALID_REQUEST, MISSING_CAPABILITY, HEADER_MISMATCH, INTERNAL_ERROR = (
    -32602,
    -32600,
    -32021,
    -32020,
    -32603,
)


# --------------------------------------------------------------------------- the client side


class TaskHandle(Result):
    """A ``CreateTaskResult`` as the client parses it (``ttlMs`` is required, maybe null)."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class TaskParams(RequestParams):
    task_id: str


class UpdateParams(TaskParams):
    input_responses: dict[str, Any]


class GetTask(Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class UpdateTask(Request[UpdateParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateParams
    name_param = "taskId"


class CancelTask(Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


class Bare(RequestParams):
    """Params with nothing but ``_meta``: a ``tasks/get`` without its ``taskId``."""


class GetNothing(Request[Bare, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: Bare = Field(default_factory=Bare)


class TasksClient(ClientExtension):
    """Declares the extension and follows a task to its result, as a host would."""

    identifier = EXTENSION

    def __init__(self) -> None:
        self.followed: list[str] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=TaskHandle, resolve=self.resolve)]

    async def resolve(self, handle: TaskHandle, ctx: ClaimContext) -> CallToolResult:
        self.followed.append(handle.task_id)
        got = await _send(ctx.session, GetTask(params=TaskParams(task_id=handle.task_id)))
        with anyio.fail_after(30):
            while got["status"] == "working":
                await anyio.sleep(got["pollIntervalMs"] / 1000)  # the poll the task asks for
                got = await _send(ctx.session, GetTask(params=TaskParams(task_id=handle.task_id)))
        assert got["status"] == "completed", got
        return CallToolResult.model_validate(got["result"])


async def _send(session: Any, request: Request[Any, Any]) -> dict[str, Any]:
    return await session.send_request(request, RAW)  # type: ignore[no-any-return]


async def task_get(c: Client, ref: str) -> dict[str, Any]:
    return await _send(c.session, GetTask(params=TaskParams(task_id=ref)))


async def task_update(c: Client, ref: str, responses: dict[str, Any]) -> dict[str, Any]:
    params = UpdateParams(task_id=ref, input_responses=responses)
    return await _send(c.session, UpdateTask(params=params))


async def task_cancel(c: Client, ref: str) -> dict[str, Any]:
    return await _send(c.session, CancelTask(params=TaskParams(task_id=ref)))


async def until(c: Client, ref: str, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll ``tasks/get`` at the interval the task gives until ``done`` (20 s at most)."""
    with anyio.fail_after(20):
        while not done(got := await task_get(c, ref)):
            await anyio.sleep(got["pollIntervalMs"] / 1000)
    return got


def status_is(status: str) -> Callable[[dict[str, Any]], bool]:
    return lambda got: bool(got["status"] == status)


def ref_meta(ref: str) -> RequestParamsMeta:
    """A request ``_meta`` carrying an operation_ref (the SDK's type names only its own keys)."""
    return cast(RequestParamsMeta, {"operation_ref": ref})


async def call(
    c: Client, tool: str, args: dict[str, Any], ref: str | None = None
) -> CallToolResult | TaskHandle:
    """``tools/call`` that hands back the task itself instead of following it."""
    meta = ref_meta(ref) if ref else None
    result = await c.session.call_tool(tool, args, meta=meta, allow_claimed=True)
    assert isinstance(result, CallToolResult | TaskHandle), result
    return result


def run(server: Server[Any], body: Callable[[Client], Awaitable[T]], *, tasks: bool = True) -> T:
    async def main() -> T:
        async with Client(server, extensions=[TasksClient()] if tasks else None) as client:
            return await body(client)

    return anyio.run(main)


def refusal(exc: pytest.ExceptionInfo[MCPError]) -> tuple[int, str]:
    assert "Traceback" not in exc.value.message
    return exc.value.code, exc.value.message


def effect_rev(tq: ToolQueue, ref: str) -> tuple[str, int]:
    """What a refusal must leave alone: the record's revision and its history's length."""
    rec = tq.get(ref)
    assert rec is not None
    return tq.ledger.fields(ref, "rev")["rev"], len(rec.history)


# --------------------------------------------------------------------------- how a record reads


NOW = datetime(2026, 7, 28, 12, 0, 0, tzinfo=UTC)


def rate_limited(seconds: float) -> ToolError:
    return error_envelope(
        RateLimitedFailure(retry_after=seconds),
        writes=True,
        operation_ref="run_1/step_1",
        operation="t",
        call_id=None,
        attempts_remaining=2,
        now=NOW,
    )


@pytest.mark.parametrize(
    ("state", "status"),
    [
        (State.QUEUED, "working"),
        (State.RUNNING, "working"),
        (State.WAITING_RETRY, "working"),
        (State.VERIFYING, "working"),
        (State.NEEDS_INPUT, "input_required"),
        (State.AWAITING_APPROVAL, "input_required"),
        (State.SUCCEEDED, "completed"),
        (State.FAILED, "completed"),
        (State.ESCALATED, "completed"),
        (State.CANCELLED, "cancelled"),
    ],
)
def test_each_state_has_a_task_status(state: State, status: str) -> None:
    assert task_status(state) == status


@pytest.mark.parametrize(
    ("state", "envelope", "message"),
    [
        (State.QUEUED, None, "queued: attempt 2 of 5 starts when a worker takes it"),
        (State.RUNNING, None, "running attempt 2 of 5"),
        (
            State.WAITING_RETRY,
            rate_limited(184),
            "waiting until 12:03:04 UTC to retry after a rate limit",
        ),
        (
            State.VERIFYING,
            None,
            "checking whether the write happened before anything is sent again",
        ),
        (State.AWAITING_APPROVAL, None, "waiting for approval before it runs"),
        (State.CANCELLED, None, "cancelled"),
    ],
)
def test_the_status_message_says_what_toolq_is_doing(
    state: State, envelope: ToolError | None, message: str
) -> None:
    assert describe(state, envelope, 2, 5) == message


@pytest.mark.parametrize(
    ("state", "status", "code"),
    [
        # an operator's retry of an escalated write: its task ended at the escalation
        (State.QUEUED, "completed", "VERIFICATION_UNAVAILABLE"),
        (State.RUNNING, "completed", "VERIFICATION_UNAVAILABLE"),
        (State.AWAITING_APPROVAL, "completed", "VERIFICATION_UNAVAILABLE"),
        # the retry settled: the task's result is what happened
        (State.SUCCEEDED, "completed", "OK"),
    ],
)
def test_a_task_stays_completed_when_an_operator_retries_its_escalated_write(
    state: State, status: str, code: str
) -> None:
    escalated = HistoryEntry(at=0, to=State.ESCALATED, code="VERIFICATION_UNAVAILABLE")
    rec = record_in(state).model_copy(update={"operator_retries": 1, "history": [escalated]})
    if state is State.SUCCEEDED:
        ok = success_envelope(rec.operation_ref, "t", None, {"id": 1}, NOW)
        rec = rec.model_copy(update={"envelope": ok})
    got = detailed(rec, poll=0.5, now=NOW, input_schema=None)
    assert got["status"] == status
    env = parse_envelope(got["result"]["structuredContent"])
    assert getattr(env, "code", "OK") == code
    # never retried: the state's own status
    never = record_in(state).model_copy(update={"envelope": rec.envelope})
    assert detailed(never, poll=0.5, now=NOW, input_schema=None)["status"] == task_status(state)


def test_a_waiting_retry_is_polled_at_its_not_before() -> None:
    waiting = record_in(State.WAITING_RETRY).model_copy(update={"envelope": rate_limited(184)})
    assert poll_interval_ms(waiting, 0.5, NOW) == 184_000
    assert poll_interval_ms(record_in(State.RUNNING), 0.5, NOW) == 500
    late = NOW + timedelta(hours=1)  # past not_before: the ordinary interval
    assert poll_interval_ms(waiting, 0.5, late) == 500


class Nested(BaseModel):
    x: int


class Order(BaseModel):
    name: str = Field(max_length=20)
    size: Literal["s", "m"] = "s"
    count: int = Field(ge=1)
    gift: bool = False
    note: str | None = None
    address: Nested
    tags: list[str] = []


def test_the_arguments_form_holds_flat_primitives_opened_on_the_sent_values() -> None:
    sent = {"name": "ab", "size": "m", "count": 0, "gift": True, "address": {"x": 1}}
    form = form_schema(Order.model_json_schema(), sent)
    props = form["properties"]
    assert set(props) == {"name", "size", "count", "gift", "note"}  # no object, no array
    assert props["name"] == {"title": "Name", "maxLength": 20, "type": "string", "default": "ab"}
    assert props["size"] == {"title": "Size", "type": "string", "enum": ["s", "m"], "default": "m"}
    assert props["count"] == {"title": "Count", "minimum": 1, "type": "integer", "default": 0}
    assert props["gift"]["default"] is True and "default" not in props["note"]
    assert form["required"] == ["name", "count"]


def test_an_approval_asks_yes_or_no_under_its_attempts_key() -> None:
    waiting = record_in(State.AWAITING_APPROVAL, attempt=0).model_copy(update={"args": {"a": 1}})
    (key, request), *_ = input_requests(waiting, None).items()
    assert key == "approval-0" and request["method"] == "elicitation/create"
    assert request["params"]["requestedSchema"]["required"] == ["approve"]
    assert request["params"]["message"].endswith('{"a":1}')


def _accept(content: dict[str, Any]) -> dict[str, Any]:
    return {"action": "accept", "content": content}


@pytest.mark.parametrize(
    ("state", "responses", "expected"),
    [
        (State.AWAITING_APPROVAL, {"approval-1": _accept({"approve": True})}, Answer("approve")),
        (State.AWAITING_APPROVAL, {"approval-1": _accept({"approve": False})}, Answer("cancel")),
        (State.AWAITING_APPROVAL, {"approval-1": {"action": "decline"}}, Answer("cancel")),
        (State.AWAITING_APPROVAL, {"approval-1": {"action": "cancel"}}, Answer("none")),
        (State.AWAITING_APPROVAL, {"approval-0": _accept({"approve": True})}, Answer("none")),
        (State.NEEDS_INPUT, {"approval-1": _accept({"approve": True})}, Answer("none")),
        (State.NEEDS_INPUT, {"arguments-1": _accept({"b": 2})}, Answer("input", {"a": 1, "b": 2})),
        (State.NEEDS_INPUT, {"arguments-1": {"action": "decline"}}, Answer("cancel")),
        (State.RUNNING, {"arguments-1": _accept({"b": 2})}, Answer("none")),
    ],
)
def test_an_answer_is_read_against_the_question_outstanding_now(
    state: State, responses: dict[str, Any], expected: Answer
) -> None:
    rec = record_in(state).model_copy(update={"args": {"a": 1}})
    assert answer(rec, responses) == expected


@pytest.mark.parametrize(
    "response", ["yes", {"action": "maybe"}, {"action": "accept", "content": [1]}, _accept({})]
)
def test_a_malformed_answer_is_refused(response: Any) -> None:
    with pytest.raises(BadAnswer):
        answer(record_in(State.AWAITING_APPROVAL), {"approval-1": response})


# --------------------------------------------------------------------------- with workers


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    with serving(interfaces_app.tq, APP, module_redis_url) as app_tq:
        # A worker that is up: "finished within the short wait" must not time its start-up
        assert app_tq.wait(app_tq.submit("echo", {"text": "up"}).operation_ref, 30).ok
        yield app_tq


@pytest.fixture(scope="module")
def server(tq: ToolQueue) -> Server[Any]:
    return create_server(tq, wait_seconds=15, poll_interval=0.2, task_after=0.3)


def test_a_call_that_finishes_within_the_short_wait_is_a_plain_result(tq: ToolQueue) -> None:
    patient = create_server(tq, task_after=15)
    result = run(patient, lambda c: call(c, "echo", {"text": "hi"}))
    assert isinstance(result, CallToolResult) and result.is_error is False
    assert result.structured_content is not None and result.structured_content["ok"] is True


def test_a_call_still_running_is_a_task_followed_to_its_end(
    tq: ToolQueue, server: Server[Any]
) -> None:
    ref, args = "run_tasks/step_slow", {"body": "n", "gate": True}

    async def scenario(c: Client) -> tuple[Any, dict[str, Any], dict[str, Any], Any]:
        handle = await call(c, "create_note", args, ref)
        running = await until(c, ref, lambda got: got["statusMessage"].startswith("running"))
        await anyio.to_thread.run_sync(open_gate, tq.redis, ref)
        done = await until(c, ref, status_is("completed"))
        again = await call(c, "create_note", args, ref)  # a client's retry: the same operation
        return handle, running, done, again

    handle, running, done, again = run(server, scenario)

    # Then the call answered with a task named by its operation_ref, durable and open-ended
    assert isinstance(handle, TaskHandle) and handle.task_id == ref
    assert (
        handle.status == "working" and handle.ttl_ms is None and "ttl_ms" in handle.model_fields_set
    )
    assert handle.poll_interval_ms == 200 and handle.created_at.endswith("Z")
    # And tasks/get said what toolq was doing, then carried the result inline
    assert running["resultType"] == "complete" and running["status"] == "working"
    assert running["statusMessage"] == "running attempt 1 of 5"
    assert done["result"]["isError"] is False
    assert parse_envelope(done["result"]["structuredContent"]).ok
    assert done["result"]["structuredContent"]["result"] == {"note": ref}
    # And repeating the call returned the finished operation: one attempt, one write
    assert (
        isinstance(again, CallToolResult)
        and again.structured_content == done["result"]["structuredContent"]
    )
    record = tq.get(ref)
    assert record is not None and record.attempt == 1


def test_the_sdk_client_follows_a_task_to_its_result(server: Server[Any]) -> None:
    client_ext = TasksClient()

    async def main() -> CallToolResult:
        async with Client(server, extensions=[client_ext]) as c:
            return await c.call_tool("create_note", {"body": "s", "sleep": 1.0})

    result = anyio.run(main)
    assert result.is_error is False and result.structured_content is not None
    assert client_ext.followed == [result.structured_content["operation_ref"]]


def test_corrected_arguments_answer_input_required(tq: ToolQueue, server: Server[Any]) -> None:
    ref = "run_tasks/step_input"

    async def scenario(c: Client) -> tuple[Any, ...]:
        handle = await call(c, "charge", {"amount": 0}, ref)
        asked = await until(c, ref, status_is("input_required"))
        before = await anyio.to_thread.run_sync(effect_rev, tq, ref)
        with pytest.raises(MCPError) as same:
            await task_update(c, ref, {"arguments-1": _accept({"amount": 0})})
        after = await anyio.to_thread.run_sync(effect_rev, tq, ref)
        ack = await task_update(c, ref, {"arguments-1": _accept({"amount": 4})})
        done = await until(c, ref, status_is("completed"))
        late = await task_update(c, ref, {"arguments-1": _accept({"amount": 9})})
        return handle, asked, same, (before, after), ack, done, late

    handle, asked, same, (before, after), ack, done, late = run(server, scenario)

    # Then the call became a task waiting on its caller, asking for the field that failed
    assert isinstance(handle, TaskHandle) and handle.task_id == ref
    assert asked["statusMessage"] == "needs corrected arguments: amount (positive)"
    (key, request), *rest = asked["inputRequests"].items()
    assert key == "arguments-1" and not rest
    form = request["params"]["requestedSchema"]
    assert form["properties"]["amount"] == {"title": "Amount", "type": "integer", "default": 0}
    # And the same arguments again were refused, leaving the operation as it was
    assert refusal(same)[0] == INVALID_PARAMS and same.value.data["code"] == "ARGUMENTS_UNCHANGED"
    assert after == before and before[1] == 3  # queued, running, needs_input
    # And corrected ones ran; an answer to a question no longer asked was ignored
    assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}
    assert done["result"]["structuredContent"]["result"] == {"charged": 4}
    assert late["resultType"] == "complete"
    record = tq.get(ref)
    assert record is not None and record.args == {"amount": 4} and record.attempt == 2
    assert [h.by for h in record.history if h.code == "INPUT_PROVIDED"] == ["mcp:tasks"]


def readme_update() -> dict[str, Any]:
    """The ``tasks/update`` request the README's "Over MCP" shows (its JSON block)."""
    text = (REPO_ROOT / "README.md").read_text()
    section = text[text.index("## Over MCP") :]
    blocks = re.findall(r"```json\n(.*?)```", section, re.S)
    found = [json.loads(b) for b in blocks if '"tasks/update"' in b]
    assert len(found) == 1, blocks
    request: dict[str, Any] = found[0]
    return request


def test_an_approval_is_asked_and_given_through_the_task(
    tq: ToolQueue, server: Server[Any]
) -> None:
    ref = "run_tasks/step_approve"

    async def scenario(c: Client) -> tuple[Any, dict[str, Any], dict[str, Any]]:
        handle = await call(c, "transfer", {"amount": 2}, ref)
        asked = await task_get(c, ref)
        # The answer the README shows, as it shows it (its inputResponses)
        await task_update(c, ref, readme_update()["params"]["inputResponses"])
        return handle, asked, await until(c, ref, status_is("completed"))

    handle, asked, done = run(server, scenario)
    assert isinstance(handle, TaskHandle) and handle.status == "input_required"
    assert asked["statusMessage"] == "waiting for approval before it runs"
    assert list(asked["inputRequests"]) == ["approval-0"]
    assert done["result"]["structuredContent"]["result"] == {"transferred": 2}
    record = tq.get(ref)
    assert record is not None
    assert [(h.code, h.by) for h in record.history if h.code == "APPROVED"] == [
        ("APPROVED", "mcp:tasks")
    ]


def test_declining_cancels_the_operation(tq: ToolQueue, server: Server[Any]) -> None:
    ref = "run_tasks/step_decline"

    async def scenario(c: Client) -> dict[str, Any]:
        await call(c, "transfer", {"amount": 3}, ref)
        await task_update(c, ref, {"approval-0": {"action": "decline"}})
        return await task_get(c, ref)

    got = run(server, scenario)
    assert got["status"] == "cancelled" and "result" not in got
    assert tq.get(ref).state is State.CANCELLED  # type: ignore[union-attr]


def test_tasks_cancel_stops_what_has_not_started(tq: ToolQueue, server: Server[Any]) -> None:
    ref = "run_tasks/step_queued"
    queued_without_message(tq, "create_note", {"body": "q"}, ref)

    async def scenario(c: Client) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        return await task_cancel(c, ref), await task_get(c, ref), await task_cancel(c, ref)

    ack, got, again = run(server, scenario)
    assert ack["_meta"]["toolq/cancel"] == {"cancelled": True}
    assert got["status"] == "cancelled"
    assert again["_meta"]["toolq/cancel"] == {"cancelled": True}  # acknowledged, nothing new
    record = tq.get(ref)
    assert record is not None and [h.to for h in record.history] == [
        State.QUEUED,
        State.CANCELLED,
    ]


def test_a_started_write_is_not_cancelled_and_the_ack_says_so(
    tq: ToolQueue, server: Server[Any]
) -> None:
    ref = "run_tasks/step_started"

    async def scenario(c: Client) -> tuple[dict[str, Any], dict[str, Any]]:
        await call(c, "create_note", {"body": "w", "gate": True}, ref)
        await until(c, ref, lambda got: got["statusMessage"].startswith("running"))
        ack = await task_cancel(c, ref)
        await anyio.to_thread.run_sync(open_gate, tq.redis, ref)
        return ack, await until(c, ref, status_is("completed"))

    ack, done = run(server, scenario)
    said = ack["_meta"]["toolq/cancel"]
    assert said["cancelled"] is False and said["state"] == "running"
    assert "does not stop it" in said["message"]
    assert done["result"]["structuredContent"]["ok"] is True
    record = tq.get(ref)
    assert record is not None and State.CANCELLED not in [h.to for h in record.history]


def test_bad_task_requests_are_the_protocols_errors_and_write_nothing(
    tq: ToolQueue, server: Server[Any]
) -> None:
    unknown, done_ref, open_ref = "run_tasks/none", "run_tasks/step_done", "run_tasks/step_open"

    async def scenario(c: Client) -> dict[str, tuple[int, str]]:
        await call(c, "echo", {"text": "d"}, done_ref)
        await call(c, "transfer", {"amount": 1}, open_ref)
        before = await anyio.to_thread.run_sync(effect_rev, tq, done_ref)
        attempts: dict[str, Callable[[], Awaitable[Any]]] = {
            "get unknown": lambda: task_get(c, unknown),
            "update unknown": lambda: task_update(c, unknown, {}),
            "cancel unknown": lambda: task_cancel(c, unknown),
            "get malformed": lambda: task_get(c, "bad id\n"),
            "get without taskId": lambda: _send(c.session, GetNothing()),
            "cancel completed": lambda: task_cancel(c, done_ref),
            "update malformed": lambda: task_update(c, open_ref, {"approval-0": "yes"}),
        }
        seen: dict[str, tuple[int, str]] = {}
        for name, attempt in attempts.items():
            with pytest.raises(MCPError) as exc:
                await attempt()
            seen[name] = refusal(exc)
        assert await anyio.to_thread.run_sync(effect_rev, tq, done_ref) == before
        return seen

    seen = run(server, scenario)
    assert {name: code for name, (code, _) in seen.items()} == dict.fromkeys(seen, INVALID_PARAMS)
    assert seen["get unknown"][1] == "Failed to retrieve task: Task not found"
    assert (
        seen["cancel completed"][1] == "Failed to cancel task: it has already completed (succeeded)"
    )
    assert tq.get(unknown) is None and not list(tq.redis.scan_iter(match="*run_tasks/none*"))
    assert tq.get(open_ref).state is State.AWAITING_APPROVAL  # type: ignore[union-attr]


def test_the_queue_server_away_is_a_retryable_error_of_every_task_request(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a server whose queue server does not answer (tq.aio's own error for it)
    async def away(*_: Any, **__: Any) -> None:
        raise errors.ServerUnavailable("cannot reach the server at redis://127.0.0.1:1/0")

    for name in ("get", "approve", "cancel"):
        monkeypatch.setattr(tq.aio, name, away)
    caplog.set_level(logging.INFO, logger="toolq.mcp")
    ref = "run_tasks/away"

    # When a client asks for a task, answers it and cancels it, twice each
    async def scenario(c: Client) -> list[tuple[int, str, Any]]:
        seen = []
        for _ in range(2):
            for attempt in (
                lambda: task_get(c, ref),
                lambda: task_update(c, ref, {"approval-0": {"action": "accept"}}),
                lambda: task_cancel(c, ref),
            ):
                with pytest.raises(MCPError) as exc:
                    await attempt()
                seen.append((*refusal(exc), exc.value.error.data))
        return seen

    seen = run(create_server(tq, wait_seconds=1, task_after=0.2), scenario)

    # Then each is an internal error that says the server is away and names the code
    # (not a traceback in the log for each, and not "Internal error"), said once
    for code, message, data in seen:
        assert code == INTERNAL_ERROR and "unavailable" in message, (code, message)
        assert data == {"code": "QUEUE_UNAVAILABLE"}
    said = [
        (r.levelname, r.getMessage())
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "toolq.mcp"
    ]
    assert len(said) == 1 and said[0][1].startswith("queue server unavailable ("), said


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_a_client_without_the_extension_keeps_pending_envelopes(tq: ToolQueue, mode: str) -> None:
    ref = f"run_tasks/step_plain_{mode}"
    impatient = create_server(tq, wait_seconds=0.3, task_after=0.3)

    async def scenario(c: Client) -> tuple[CallToolResult, list[tuple[int, Any]]]:
        meta = ref_meta(ref)
        pending = await c.call_tool("create_note", {"body": "p", "gate": True}, meta=meta)
        refused = []
        for request in (
            GetTask(params=TaskParams(task_id=ref)),
            UpdateTask(params=UpdateParams(task_id=ref, input_responses={})),
            CancelTask(params=TaskParams(task_id=ref)),
        ):
            with pytest.raises(MCPError) as exc:
                await _send(c.session, request)
            refused.append((exc.value.code, exc.value.data))
        return pending, refused

    async def main() -> tuple[CallToolResult, list[tuple[int, Any]]]:
        # A handshake (legacy) connection declares once, not per request: not a declaration
        # the extension accepts, and a task could not travel on that wire anyway
        extensions = [advertise(EXTENSION)] if mode == "legacy" else None
        async with Client(impatient, mode=mode, extensions=extensions) as c:
            return await scenario(c)

    try:
        pending, refused = anyio.run(main)
    finally:
        open_gate(tq.redis, ref)
    env = parse_envelope(pending.structured_content)
    assert isinstance(env, ToolError) and env.code == "OPERATION_PENDING"
    assert env.operation_ref == ref
    required: dict[str, Any] = {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
    assert refused == [(MISSING_CAPABILITY, required)] * 3
    assert tq.wait(ref, timeout=20).ok
    record = tq.get(ref)
    assert record is not None and State.CANCELLED not in [h.to for h in record.history]


def test_a_caller_that_stops_waiting_stops_only_its_wait(
    tq: ToolQueue, server: Server[Any], caplog: pytest.LogCaptureFixture
) -> None:
    ref = "run_tasks/step_abandoned"

    async def scenario(c: Client) -> tuple[MCPError, CallToolResult]:
        with pytest.raises(MCPError) as gave_up:
            await c.call_tool(
                "create_note",
                {"body": "a", "gate": True},
                read_timeout_seconds=0.5,
                meta=ref_meta(ref),
            )
        # The server still answers this client, and the operation goes on
        still = await c.call_tool("echo", {"text": "still here"})
        return gave_up.value, still

    with caplog.at_level(logging.ERROR, logger="toolq"):
        gave_up, still = run(server, scenario, tasks=False)
        open_gate(tq.redis, ref)
        env = tq.wait(ref, timeout=20)

    assert "Traceback" not in gave_up.message and still.is_error is False
    assert env.ok and env.operation_ref == ref
    record = tq.get(ref)
    assert record is not None and record.attempt == 1
    assert [h.to for h in record.history] == [State.QUEUED, State.RUNNING, State.SUCCEEDED]
    assert not [r for r in caplog.records if r.name.startswith("toolq")]


# --------------------------------------------------------------------------- over HTTP


def _answers(url: str) -> bool:
    try:
        return httpx.post(url, json={}, timeout=1).status_code == 401
    except httpx.HTTPError:
        return False


def test_over_streamable_http_with_scoped_tokens(module_redis_url: str, tq: ToolQueue) -> None:
    # Given `toolq mcp --transport http` with a full token and one that may not approve
    full, limited = "mcp-full-0123456789", "mcp-limited-0123456789"
    port = free_port()
    proc = start_toolq(
        [
            *("mcp", "--transport", "http", "--app", APP, "--redis-url", module_redis_url),
            *("--port", str(port), "--wait-seconds", "15"),
        ],
        env={"TOOLQ_API_TOKENS": f"{full}=*;{limited}=invoke,input,cancel"},
    )
    url, ref = f"http://127.0.0.1:{port}/mcp", "run_tasks/step_http"

    async def session(token: str, body: Callable[[Client], Awaitable[T]], tasks: bool = True) -> T:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers) as http,
            Client(
                streamable_http_client(url, http_client=http),
                extensions=[TasksClient()] if tasks else None,
            ) as c,
        ):
            return await body(c)

    async def limited_tries(c: Client) -> tuple[Any, MCPError]:
        handle = await call(c, "transfer", {"amount": 5}, ref)
        with pytest.raises(MCPError) as exc:
            await task_update(c, ref, {"approval-0": _accept({"approve": True})})
        return handle, exc.value

    async def full_approves(c: Client) -> dict[str, Any]:
        await task_update(c, ref, {"approval-0": _accept({"approve": True})})
        return await until(c, ref, status_is("completed"))

    async def undeclared(c: Client) -> MCPError:
        with pytest.raises(MCPError) as exc:
            await task_get(c, ref)
        return exc.value

    try:
        assert wait_until(lambda: _answers(url), timeout=30)
        # When the limited token tries to approve, then the full one does
        handle, forbidden = anyio.run(session, limited, limited_tries)
        still = tq.get(ref)
        done = anyio.run(session, full, full_approves)
        # And a client without the extension asks, and one routes by another name
        missing = anyio.run(session, full, undeclared, False)
        misrouted = httpx.post(url, json=_raw_get(ref), headers=_raw_headers(full, "run_x/y"))
    finally:
        stop_process(proc, timeout=5)

    # Then only the token with the approve scope could approve
    assert isinstance(handle, TaskHandle) and handle.status == "input_required"
    assert forbidden.code == INVALID_REQUEST and forbidden.data == {
        "code": "FORBIDDEN_SCOPE",
        "scope": "approve",
    }
    assert still is not None and still.state is State.AWAITING_APPROVAL
    assert done["result"]["structuredContent"]["result"] == {"transferred": 5}
    # And the undeclared request and the misrouted one were refused as the extension says
    assert missing.code == MISSING_CAPABILITY
    assert _rpc_error(misrouted)["code"] == HEADER_MISMATCH


def _raw_get(ref: str) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"extensions": {EXTENSION: {}}},
    }
    return {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tasks/get",
        "params": {"taskId": ref, "_meta": meta},
    }


def _raw_headers(token: str, name: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": "tasks/get",
        "Mcp-Name": name,
    }


def _rpc_error(response: httpx.Response) -> dict[str, Any]:
    text = response.text
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
    error = json.loads(text)["error"]
    assert isinstance(error, dict)
    return error
