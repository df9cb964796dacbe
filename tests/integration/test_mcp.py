"""The MCP server with the SDK's real client, in memory and over stdio.

Tools run in a ``toolq worker`` subprocess and delayed retries come from a
``toolq scheduler``, both on this module's database.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server
from mcp.types import CallToolResult, RequestParamsMeta, TextContent
from pydantic import BaseModel

from tests.helpers import (
    REPO_ROOT,
    serving,
    start_toolq,
    stop_process,
    toolq_env,
    wait_until,
)
from tests.integration.apps import aio_app, interfaces_app
from tests.integration.apps.interfaces_app import APP, SECRET, open_gate
from toolq import ToolQueue
from toolq.core import errors
from toolq.core.envelope import ToolError, ToolSuccess, json_schema, parse_envelope
from toolq.core.record import OperationRecord
from toolq.core.states import SETTLED, State
from toolq.core.tools import canonical_json, fingerprint
from toolq.edges.mcp_server import PARSE_ERROR_MESSAGE, create_server
from toolq.edges.mcp_server.envelopes import pending_envelope

AIO_APP = "tests.integration.apps.aio_app:tq"
T = TypeVar("T")
Progress = list[tuple[float, str | None]]
#: The in-process client calls its progress_callback without putting a progressToken on
#: the wire; a request asks for progress with one (as stdio and HTTP clients send it).
PROGRESS = RequestParamsMeta(progress_token="p")


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    with serving(interfaces_app.tq, APP, module_redis_url) as app_tq:
        yield app_tq


@pytest.fixture(scope="module")
def server(tq: ToolQueue) -> Server[Any]:
    return create_server(tq, wait_seconds=15, poll_interval=0.5)


def run(
    server: Server[Any] | StdioServerParameters,
    body: Callable[[Client], Awaitable[T]],
    **options: Any,
) -> T:
    async def main() -> T:
        async with Client(server, **options) as client:
            return await body(client)

    return anyio.run(main)


def envelope(result: CallToolResult) -> ToolSuccess | ToolError:
    env = parse_envelope(result.structured_content)
    assert result.is_error is (not env.ok)
    block = result.content[0]
    assert isinstance(block, TextContent)
    line, _, compact = block.text.partition("\n")
    assert json.loads(compact) == result.structured_content
    assert line == (env.agent_message if isinstance(env, ToolError) else "The operation committed.")
    return env


def error_of(result: CallToolResult) -> ToolError:
    env = envelope(result)
    assert isinstance(env, ToolError), env
    return env


def call(server: Server[Any], tool: str, args: dict[str, Any], **kw: Any) -> CallToolResult:
    return run(server, lambda c: c.call_tool(tool, args, **kw))


def test_every_tool_is_listed_with_schemas_and_hints(server: Server[Any], tq: ToolQueue) -> None:
    listed = {t.name: t for t in run(server, lambda c: c.list_tools()).tools}
    assert set(listed) == {t.name for t in tq.registry} | {"get_operation", "cancel_operation"}
    for t in tq.registry:
        assert listed[t.name].input_schema == t.input_schema()
        assert listed[t.name].output_schema == json_schema()
    echo, note = listed["echo"].annotations, listed["create_note"].annotations
    assert echo is not None and echo.read_only_hint is True
    assert note is not None and note.read_only_hint is False
    assert note.destructive_hint is True and note.idempotent_hint is True


def test_a_success_is_the_whole_envelope(server: Server[Any]) -> None:
    progress: Progress = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    meta = {"call_id": "call_7", **PROGRESS}
    result = call(server, "echo", {"text": "hi"}, progress_callback=on_progress, meta=meta)
    env = envelope(result)
    assert isinstance(env, ToolSuccess) and env.result == {"text": "hi"}
    assert env.operation_ref.startswith("mcp_") and env.call_id == "call_7"
    assert progress and progress[-1][1] == "succeeded"
    assert [v for v, _ in progress] == sorted({v for v, _ in progress})


@pytest.mark.parametrize(
    ("mode", "category", "next_action"),
    [
        ("invalid", "validation", "escalate"),  # max_attempts=1: no attempt left to fix it
        ("forbidden", "authorization", "choose_allowed_operation"),
        ("not_found", "conflict", "reread_state"),
        ("rate_limited", "dependency", "escalate"),
        ("crash", "internal", "escalate"),
    ],
)
def test_each_failure_category_is_an_error_result(
    server: Server[Any], mode: str, category: str, next_action: str
) -> None:
    result = call(server, "fail", {"mode": mode})
    env = envelope(result)
    assert isinstance(env, ToolError)
    assert (env.category, env.next_action) == (category, next_action)
    assert SECRET not in result.model_dump_json()


def _ref_meta(ref: str) -> RequestParamsMeta:
    """A request ``_meta`` carrying an operation_ref (the SDK's type names only its own keys)."""
    return cast(RequestParamsMeta, {"operation_ref": ref})


def queued_without_message(tq: ToolQueue, tool: str, args: dict[str, Any], ref: str) -> None:
    """An operation the ledger holds as ``queued`` whose message no worker has yet: it
    stays queued until the test publishes it (the scheduler's republish is a minute off)."""
    t = tq.registry.get(tool)
    canonical = canonical_json(t.validate(args))
    now = tq.app.now_ms()
    res = tq.ledger.submit(
        ref=ref,
        tool=tool,
        args_json=canonical,
        fp=fingerprint(canonical),
        call_id="",
        now_ms=now,
        max_attempts=t.options.max_attempts,
        deadline_ms=now + int(t.options.deadline * 1000),
        state=State.QUEUED,
        due_ms=now + 60_000,
        queue="",
        message="",
    )
    assert res.outcome == "created"


def test_a_pending_operation_is_followed_to_its_end(tq: ToolQueue) -> None:
    # Given a server that waits only briefly, and a write queued but not yet taken
    impatient = create_server(tq, wait_seconds=0.3, poll_interval=0.5)
    ref = "run_mcp/step_pending"
    args = {"body": "n", "gate": True}
    queued_without_message(tq, "create_note", args, ref)
    steps: Progress = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        steps.append((progress, message))

    def start_and_hold() -> None:
        """Publish the attempt; return once a worker runs it (held open by its gate)."""
        queue, message = tq.app.messages.run(ref, 1)
        tq.redis.lpush(queue, message)
        assert wait_until(lambda: tq.get(ref).state is State.RUNNING, 20)  # type: ignore[union-attr]

    async def scenario(c: Client) -> tuple[CallToolResult, CallToolResult, CallToolResult]:
        # When the call answers while the operation is queued, and again while it runs
        queued = await c.call_tool("create_note", args, meta=_ref_meta(ref))
        await anyio.to_thread.run_sync(start_and_hold)
        running = await c.call_tool("create_note", args, meta=_ref_meta(ref))
        open_gate(tq.redis, ref)
        done = await c.call_tool(
            "get_operation",
            {"operation_ref": ref, "wait_seconds": 15},
            progress_callback=on_progress,
            meta=PROGRESS,
        )
        return queued, running, done

    queued, running, done = run(impatient, scenario)

    # Then both answers are pending under the same ref: not started yet, the agent waits;
    # started, the write may have happened, so it is followed, never sent again
    before, during = envelope(queued), envelope(running)
    for pending in (before, during):
        assert isinstance(pending, ToolError) and pending.code == "OPERATION_PENDING"
        assert pending.operation_ref == ref and pending.operation == "create_note"
    assert isinstance(before, ToolError) and isinstance(during, ToolError)
    assert before.commit_state == "not_committed" and before.next_action == "wait_and_retry"
    assert before.retry.not_before is not None and before.safe_details["state"] == "queued"
    assert during.commit_state == "unknown" and during.next_action == "verify_operation"
    assert during.safe_details == {"state": "running", "verification_tool": "get_operation"}
    final = envelope(done)
    assert isinstance(final, ToolSuccess) and final.result == {"note": ref}
    assert steps[-1][1] is not None and steps[-1][1].startswith("succeeded")
    record = tq.get(ref)
    assert record is not None and record.attempt == 1  # one attempt, however often it was asked


def test_waiting_calls_hold_no_thread(tq: ToolQueue, server: Server[Any]) -> None:
    # Given twenty operations that stay queued (no worker gets a message for them)
    refs = [f"run_mcp/step_idle_{i}" for i in range(20)]
    for ref in refs:
        queued_without_message(tq, "create_note", {"body": "idle"}, ref)

    async def scenario(c: Client) -> tuple[int, int, list[CallToolResult]]:
        results: list[CallToolResult] = []

        async def follow(ref: str) -> None:
            args = {"operation_ref": ref, "wait_seconds": 15}
            results.append(await c.call_tool("get_operation", args))

        await c.call_tool("echo", {"text": "warm"})  # this loop's connections exist
        before = threading.active_count()
        async with anyio.create_task_group() as tg:
            for ref in refs:
                tg.start_soon(follow, ref)
            # When all twenty calls are waiting on the server
            with anyio.fail_after(10):
                while tq.aio.watching() < len(refs):
                    await anyio.sleep(0.01)
            during = threading.active_count()
            for ref in refs:
                await tq.aio.cancel(ref)
        return before, during, results

    before, during, results = run(server, scenario)

    # Then they held no thread between them, and each answered once its operation ended
    assert during == before
    assert sorted(error_of(r).code for r in results) == ["OPERATION_CANCELLED"] * len(refs)


def test_a_delayed_retry_is_waited_through(server: Server[Any]) -> None:
    progress: Progress = []

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        progress.append((value, message))

    env = envelope(
        call(server, "flaky", {"text": "x"}, progress_callback=on_progress, meta=PROGRESS)
    )
    assert isinstance(env, ToolSuccess) and env.result == {"text": "x", "attempt": 2}
    assert any(m and m.endswith("to retry after a rate limit") for _, m in progress)


def test_a_tools_progress_reaches_the_client_in_order(redis_url: str, tmp_path: Path) -> None:
    # Given a tool that reports three steps once its gate is open
    gate, seen = tmp_path / "gate", cast(Progress, [])

    async def on_progress(value: float, total: float | None, message: str | None) -> None:
        seen.append((value, message))
        if message == "running":  # the server follows the operation now: let the tool go
            gate.touch()

    # When it is called with a progressToken
    with serving(aio_app.tq, AIO_APP, redis_url) as aio_tq:
        args = {"gate": str(gate), "steps": [0.25, 0.5, 1.0]}
        result = call(
            create_server(aio_tq), "gated", args, progress_callback=on_progress, meta=PROGRESS
        )

    # Then each step arrived as a notification, between the states it belongs to
    assert envelope(result).ok
    messages = [m for _, m in seen]
    assert messages[messages.index("running") :] == [
        "running",
        "25% step 1",
        "50% step 2",
        "100% step 3",
        "succeeded",
    ]
    assert [v for v, _ in seen] == [float(n) for n in range(1, len(seen) + 1)]


def test_the_same_ref_with_other_arguments_is_refused(server: Server[Any]) -> None:
    meta = {"operation_ref": "run_mcp/step_reuse"}
    assert envelope(call(server, "echo", {"text": "a"}, meta=meta)).ok
    env = envelope(call(server, "echo", {"text": "b"}, meta=meta))
    assert isinstance(env, ToolError) and env.code == "IDEMPOTENCY_KEY_REUSED"


def test_refusals_are_envelopes(server: Server[Any]) -> None:
    cases = [
        (call(server, "nope", {}), "UNKNOWN_TOOL", "choose_allowed_operation"),
        (call(server, "echo", {"text": 5}), "INVALID_ARGUMENTS", "correct_input"),
        (
            call(server, "echo", {"text": "x"}, meta={"operation_ref": "bad ref\n"}),
            "INVALID_ARGUMENTS",
            "correct_input",
        ),
        (
            call(server, "get_operation", {"operation_ref": "run_0/none"}),
            "OPERATION_NOT_FOUND",
            "reread_state",
        ),
        (call(server, "get_operation", {}), "INVALID_ARGUMENTS", "correct_input"),
        (
            call(server, "echo", {"text": "x"}, meta={"operation_ref": "./run_mcp/step_1"}),
            "INVALID_ARGUMENTS",
            "correct_input",
        ),
        (
            call(server, "get_operation", {"operation_ref": "run_mcp/../x"}),
            "INVALID_ARGUMENTS",
            "correct_input",
        ),
    ]
    for result, code, action in cases:
        env = envelope(result)
        assert isinstance(env, ToolError) and (env.code, env.next_action) == (code, action)
    bad_ref = parse_envelope(cases[2][0].structured_content)
    assert isinstance(bad_ref, ToolError) and bad_ref.field_errors
    assert bad_ref.field_errors[0].field == "_meta.operation_ref"


class Free(BaseModel):
    text: str = ""  # no constraint: pydantic checks a constrained str's Unicode itself
    amount: float = 0.0


def test_arguments_json_cannot_hold_are_a_refusal_and_write_nothing(
    module_redis_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # A lone surrogate ("\ud800": json.loads and the in-memory client pass it, UTF-8
    # does not) was INTERNAL_ERROR, "needs an operator", with a traceback in the log;
    # "inf" for a float was written to the ledger as Infinity, which JSON has not
    own = ToolQueue(redis_url=module_redis_url, name="mcp-unjsonable")

    @own.tool(writes=True)
    def free(args: Free) -> None:
        """Never run: every call here is refused before it is submitted."""

    caplog.set_level(logging.ERROR, logger="toolq.mcp")
    try:
        for ref, args in [
            ("run_mcp/lone", {"text": "\ud800"}),
            ("run_mcp/lone_low", {"text": "a\udc80b"}),
            ("run_mcp/inf", {"amount": "inf"}),
        ]:
            env = error_of(call(create_server(own), "free", args, meta={"operation_ref": ref}))
            assert (env.code, env.next_action) == ("INVALID_ARGUMENTS", "correct_input"), ref
            assert env.commit_state == "not_committed"
            assert own.get(ref) is None
    finally:
        own.close()
    assert not [r for r in caplog.records if r.name == "toolq.mcp"]


def test_cancel_operation(server: Server[Any]) -> None:
    ref = "run_mcp/step_cancel"
    waiting = envelope(call(server, "transfer", {"amount": 3}, meta={"operation_ref": ref}))
    assert isinstance(waiting, ToolError) and waiting.next_action == "request_approval"
    cancelled = envelope(call(server, "cancel_operation", {"operation_ref": ref}))
    assert isinstance(cancelled, ToolError) and cancelled.code == "OPERATION_CANCELLED"
    done = envelope(call(server, "echo", {"text": "x"}))
    refused = envelope(call(server, "cancel_operation", {"operation_ref": done.operation_ref}))
    assert isinstance(refused, ToolError) and refused.code == "INVALID_STATE"
    assert refused.safe_details == {"state": "succeeded"}


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_an_exception_in_the_adapter_never_reaches_the_client(
    tq: ToolQueue, server: Server[Any], monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    async def explode(*_: Any, **__: Any) -> None:
        raise RuntimeError(f"connecting with password={SECRET} failed")

    monkeypatch.setattr(tq.aio, "submit", explode)
    result = run(server, lambda c: c.call_tool("create_note", {"body": "x"}), mode=mode)
    assert SECRET not in result.model_dump_json()
    env = envelope(result)
    assert isinstance(env, ToolError) and env.code == "OUTCOME_UNKNOWN"
    assert env.commit_state == "unknown" and env.next_action == "verify_operation"


def test_the_queue_server_away_is_queue_unavailable_and_said_once(
    tq: ToolQueue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Given a server whose queue server does not answer (tq.aio's own error for it)
    async def away(*_: Any, **__: Any) -> None:
        raise errors.ServerUnavailable("cannot reach the server at redis://127.0.0.1:1/0")

    for name in ("submit", "wait", "get"):
        monkeypatch.setattr(tq.aio, name, away)
    caplog.set_level(logging.INFO, logger="toolq.mcp")

    # When an agent calls a write, a read and get_operation, three times each
    async def body(c: Client) -> list[CallToolResult]:
        calls = [("create_note", {"body": "x"}), ("echo", {"text": "x"})]
        calls.append(("get_operation", {"operation_ref": "run_away/1"}))
        return [await c.call_tool(t, a) for _ in range(3) for t, a in calls]

    results = run(create_server(tq, wait_seconds=1), body)

    # Then each is QUEUE_UNAVAILABLE: the write may have been queued (follow it first),
    # the others were not (wait and call again); not a refusal for an operator
    for i, result in enumerate(results):
        env = error_of(result)
        assert (env.code, env.category) == ("QUEUE_UNAVAILABLE", "dependency"), env
        if i % 3 == 0:
            assert env.commit_state == "unknown" and env.next_action == "verify_operation"
        else:
            assert env.commit_state == "not_committed" and env.next_action == "wait_and_retry"
            assert env.retry.directive == "after_delay" and env.retry.not_before is not None
    # and the operator's log says it once, not once a call
    warned = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "toolq.mcp"
    ]
    assert len(warned) == 1, warned
    assert warned[0].startswith("queue server unavailable (ServerUnavailable)"), warned


def test_over_stdio(module_redis_url: str, tq: ToolQueue) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=[
            "-m",
            "toolq.edges.cli",
            "mcp",
            "--app",
            APP,
            "--redis-url",
            module_redis_url,
            "--wait-seconds",
            "15",
        ],
        env=toolq_env(),
        cwd=str(REPO_ROOT),
    )

    async def scenario(c: Client) -> tuple[set[str], CallToolResult, CallToolResult]:
        names = {t.name for t in (await c.list_tools()).tools}
        return (
            names,
            await c.call_tool("echo", {"text": "io"}),
            await c.call_tool("fail", {"mode": "crash"}),
        )

    names, ok, crash = run(params, scenario)
    assert {"echo", "get_operation", "cancel_operation"} <= names
    success = envelope(ok)
    assert isinstance(success, ToolSuccess) and success.result == {"text": "io"}
    failure = envelope(crash)
    assert isinstance(failure, ToolError) and failure.category == "internal"
    assert SECRET not in crash.model_dump_json()


def test_over_stdio_a_line_that_is_not_json_rpc_is_answered_with_a_parse_error(
    module_redis_url: str,
) -> None:
    # Given `toolq mcp` on stdio, spoken to line by line (the SDK's client sends only
    # well-formed messages)
    proc = subprocess.Popen(
        [sys.executable, "-m", "toolq.edges.cli", "mcp", "--app", APP],
        env=toolq_env({"TOOLQ_REDIS_URL": module_redis_url}),
        cwd=str(REPO_ROOT),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    try:
        # When a client sends lines that are not JSON-RPC messages, then one that is
        initialize = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "0"},
            },
        }
        lines = ["{not json " + SECRET, '{"jsonrpc": "2.0", "nope": [' + "[" * 300]
        for line in [*lines, json.dumps(initialize)]:
            proc.stdin.write(line + "\n")
        proc.stdin.flush()
        answers = [json.loads(proc.stdout.readline()) for _ in range(3)]
    finally:
        proc.stdin.close()
        code = proc.wait(timeout=30)
        proc.stdout.close()

    # Then each bad line is answered with a parse error (it was answered with nothing,
    # and its client waited for ever), in toolq's words, and the session goes on
    for bad in answers[:2]:
        assert bad == {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32700, "message": PARSE_ERROR_MESSAGE},
        }, bad
    assert answers[2]["id"] == 1 and answers[2]["result"]["serverInfo"]["name"] == "toolq"
    assert code == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_over_streamable_http_with_scoped_tokens(module_redis_url: str, tq: ToolQueue) -> None:
    # Given `toolq mcp --transport http` with one full token and one that may only invoke
    full, invoke_only = "mcp-full-0123456789", "mcp-invoke-0123456789"
    port = _free_port()
    proc = start_toolq(
        [
            "mcp",
            "--transport",
            "http",
            "--app",
            APP,
            "--redis-url",
            module_redis_url,
            "--port",
            str(port),
            "--wait-seconds",
            "15",
        ],
        env={"TOOLQ_API_TOKENS": f"{full}=*;{invoke_only}=invoke"},
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        assert wait_until(lambda: _answers(url), timeout=30)

        async def scenario(token: str, ref: str) -> tuple[CallToolResult, CallToolResult]:
            headers = {"Authorization": f"Bearer {token}"}
            async with (
                httpx2.AsyncClient(headers=headers) as http,
                Client(streamable_http_client(url, http_client=http)) as c,
            ):
                held = await c.call_tool("transfer", {"amount": 2}, meta=_ref_meta(ref))
                return held, await c.call_tool("cancel_operation", {"operation_ref": ref})

        # When each token asks to cancel an operation awaiting approval
        held, refused = anyio.run(scenario, invoke_only, "run_http/step_1")
        _, cancelled = anyio.run(scenario, full, "run_http/step_2")

        # And a page that rebound its name, or another origin, tries with a valid token
        auth = {"Authorization": f"Bearer {full}"}
        rebound = httpx.post(url, json={}, headers=auth | {"Host": "evil.example"}, timeout=5)
        cross = httpx.post(
            url, json={}, headers=auth | {"Origin": "http://evil.example"}, timeout=5
        )
    finally:
        stop_process(proc, timeout=5)

    # Then those are refused as the HTTP API refuses them, before MCP sees them
    assert (rebound.status_code, rebound.json()["code"]) == (421, "HOST_NOT_ALLOWED")
    assert (cross.status_code, cross.json()["code"]) == (403, "ORIGIN_NOT_ALLOWED")

    # Then only the token with the cancel scope may, and no token is no answer at all
    assert error_of(held).next_action == "request_approval"
    assert error_of(refused).code == "FORBIDDEN_SCOPE"
    assert error_of(cancelled).code == "OPERATION_CANCELLED"


def _answers(url: str) -> bool:
    try:
        return httpx.post(url, json={}, timeout=1).status_code == 401
    except httpx.HTTPError:
        return False


def record_in(state: State, *, attempt: int = 1, max_attempts: int = 1) -> OperationRecord:
    """An operation's record as the ledger would hold it in ``state`` (no envelope)."""
    now = datetime.now(UTC)
    return OperationRecord(
        operation_ref="run_1/step_1",
        tool="t",
        args={},
        call_id=None,
        state=state,
        attempt=attempt,
        max_attempts=max_attempts,
        created_at=now,
        updated_at=now,
        entered_at=now,
        deadline=None,
        lease_holder=None,
        lease_until=None,
        envelope=None,
        history=[],
    )


@pytest.mark.parametrize("state", [s for s in State if s not in SETTLED])
@pytest.mark.parametrize("writes", [True, False])
def test_pending_envelopes_are_consistent(state: State, writes: bool) -> None:
    now = datetime.now(UTC)
    env = pending_envelope(record_in(state), writes=writes, poll=0.5, now=now)
    assert env.code == "OPERATION_PENDING" and env.safe_details["state"] == state
    if writes and state in (State.RUNNING, State.VERIFYING):
        assert (env.commit_state, env.retry.directive) == ("unknown", "never")
    else:
        assert (env.commit_state, env.next_action) == ("not_committed", "wait_and_retry")
        assert env.retry.not_before == now + timedelta(seconds=0.5)
        assert env.retry.max_attempts_remaining == 1
