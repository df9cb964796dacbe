"""The HTTP API against a real server and real worker and scheduler processes.

The app runs in-process (Starlette's TestClient); the tools run in a
``toolq worker`` subprocess, delayed retries come from a ``toolq scheduler``.
The last test fuzzes the generated OpenAPI document with schemathesis.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Iterator
from typing import Any

import hypothesis
import pytest
import schemathesis
from fastapi import FastAPI
from fastapi.testclient import TestClient
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers import serving
from tests.integration.apps import interfaces_app
from tests.integration.apps.interfaces_app import APP, SECRET
from toolq import ToolQueue
from toolq.core.envelope import parse_envelope
from toolq.edges.api import ApiSettings, Tokens, create_app
from toolq.edges.api.auth import check_bind

AGENT = "agent-token-0123456789"
#: Starlette's TestClient and schemathesis send ``Host: testserver``: a configured name.
TEST_HOST = "testserver"
OPERATOR = "operator-token-0123456789"
TOKENS = f"{AGENT}=invoke,read;{OPERATOR}=approve,input,cancel,read"


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    with serving(interfaces_app.tq, APP, module_redis_url) as app_tq:
        yield app_tq


@pytest.fixture(scope="module")
def app(tq: ToolQueue) -> FastAPI:
    settings = ApiSettings(tokens=TOKENS, max_wait=20, poll_interval=0.5, allowed_hosts=TEST_HOST)
    return create_app(tq, settings)


@pytest.fixture
def agent(app: FastAPI) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {AGENT}"})


@pytest.fixture
def operator(app: FastAPI) -> TestClient:
    return TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"})


def key() -> str:
    return f"run_{uuid.uuid4().hex[:8]}/step_1"


def invoke(client: TestClient, tool: str, args: Any, ref: str | None = None) -> Any:
    headers = {"Idempotency-Key": ref or key(), "X-Call-Id": f"call_{uuid.uuid4().hex[:8]}"}
    return client.post(f"/v1/tools/{tool}:invoke", json=args, headers=headers)


def settle(client: TestClient, ref: str, wait: float = 15) -> dict[str, Any]:
    r = client.get(f"/v1/operations/{ref}", params={"wait": wait})
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    assert body["settled"], body
    return body


def test_invoke_answers_202_with_location_and_the_operation_settles(agent: TestClient) -> None:
    ref = key()
    r = invoke(agent, "echo", {"text": "hi"}, ref)
    assert r.status_code == 202
    assert r.headers["location"] == f"/v1/operations/{ref}"
    assert r.json()["operation_ref"] == ref and r.json()["created"] is True
    body = settle(agent, ref)
    assert body["state"] == "succeeded"
    assert parse_envelope(body["envelope"]).ok
    assert body["envelope"]["result"] == {"text": "hi"}
    assert body["envelope"]["call_id"].startswith("call_")
    assert "poll_interval" not in body


def test_same_key_same_arguments_is_the_same_operation_other_arguments_422(
    agent: TestClient,
) -> None:
    ref = key()
    first = invoke(agent, "create_note", {"body": "a"}, ref)
    again = invoke(agent, "create_note", {"body": "a"}, ref)
    assert again.status_code == 202 and again.json()["created"] is False
    assert again.json()["created_at"] == first.json()["created_at"]
    other = invoke(agent, "create_note", {"body": "b"}, ref)
    assert other.status_code == 422
    body = other.json()
    assert body["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert body["envelope"]["code"] == "IDEMPOTENCY_KEY_REUSED"
    assert parse_envelope(body["envelope"]).operation_ref == ref
    assert settle(agent, ref)["envelope"]["result"] == {"note": ref}


@pytest.mark.parametrize("prefix", ["./", "../", "x/../", "/", "x//"])
def test_a_key_a_client_would_resolve_to_another_operation_is_refused(
    agent: TestClient, prefix: str
) -> None:
    """``Location: /v1/operations/./fz/ab/target`` would reach ``fz/ab/target``."""
    ref = key()
    assert invoke(agent, "echo", {"text": "a"}, ref).status_code == 202
    r = invoke(agent, "echo", {"text": "a"}, prefix + ref)
    assert r.status_code == 422, r.text
    assert r.json()["code"] == "INVALID_ARGUMENTS" and "location" not in r.headers
    assert r.json()["field_errors"] == [{"field": "operation_ref", "rule": "pattern"}]
    assert invoke(agent, "echo", {"text": "a"}, ref + "/").status_code == 422


def test_a_ref_with_url_characters_is_quoted_in_location(agent: TestClient) -> None:
    ref = f"run_{uuid.uuid4().hex[:6]}#a+b=c@d"
    r = invoke(agent, "echo", {"text": "q"}, ref)
    assert r.headers["location"].endswith("%23a+b=c@d")
    assert (
        settle(agent, r.headers["location"].removeprefix("/v1/operations/"))["operation_ref"] == ref
    )


def test_pending_operation_says_when_to_poll(agent: TestClient) -> None:
    ref = key()
    invoke(agent, "create_note", {"body": "slow", "sleep": 1.5}, ref)
    r = agent.get(f"/v1/operations/{ref}")
    assert r.status_code == 200
    body = r.json()
    assert body["settled"] is False and body["state"] in ("queued", "running")
    assert body["poll_interval"] == 0.5 and r.headers["retry-after"] == "1"
    assert settle(agent, ref)["state"] == "succeeded"


@pytest.mark.parametrize(
    ("mode", "state", "category"),
    [
        ("invalid", "escalated", "validation"),  # no attempt left to fix it
        ("forbidden", "failed", "authorization"),
        ("not_found", "failed", "conflict"),
        ("rate_limited", "escalated", "dependency"),
        ("crash", "escalated", "internal"),
    ],
)
def test_a_failing_tool_is_a_200_with_its_envelope(
    agent: TestClient, mode: str, state: str, category: str
) -> None:
    ref = key()
    assert invoke(agent, "fail", {"mode": mode}, ref).status_code == 202
    r = agent.get(f"/v1/operations/{ref}", params={"wait": 15})
    assert r.status_code == 200
    assert SECRET not in r.text and "Traceback" not in r.text
    body = r.json()
    assert body["state"] == state
    env = parse_envelope(body["envelope"])
    assert not env.ok and env.category == category


def test_delayed_retry_comes_from_the_scheduler(agent: TestClient) -> None:
    ref = key()
    invoke(agent, "flaky", {"text": "x"}, ref)
    body = settle(agent, ref)
    assert body["state"] == "succeeded" and body["envelope"]["result"]["attempt"] == 2


def test_approval_needs_the_approve_scope(agent: TestClient, operator: TestClient) -> None:
    ref = key()
    invoke(agent, "transfer", {"amount": 5}, ref)
    assert settle(agent, ref)["state"] == "awaiting_approval"
    refused = agent.post(f"/v1/operations/{ref}:approve")
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN_SCOPE"
    r = operator.post(f"/v1/operations/{ref}:approve")
    # the view is read after the approval: a worker may already have taken it
    assert r.status_code == 200 and r.json()["state"] in ("queued", "running", "succeeded")
    assert settle(agent, ref)["envelope"]["result"] == {"transferred": 5}
    again = operator.post(f"/v1/operations/{ref}:approve")
    assert again.status_code == 409 and again.json()["code"] == "INVALID_STATE"


def test_input_replaces_arguments_and_refuses_identical_ones(
    agent: TestClient, operator: TestClient
) -> None:
    ref = key()
    invoke(agent, "charge", {"amount": -1}, ref)
    assert settle(agent, ref)["state"] == "needs_input"
    same = operator.post(f"/v1/operations/{ref}:input", json={"amount": -1})
    assert same.status_code == 422 and same.json()["code"] == "ARGUMENTS_UNCHANGED"
    bad = operator.post(f"/v1/operations/{ref}:input", json={"amount": "many"})
    assert bad.status_code == 422 and bad.json()["field_errors"][0]["field"] == "amount"
    assert operator.post(f"/v1/operations/{ref}:input", json={"amount": 7}).status_code == 200
    assert settle(agent, ref)["envelope"]["result"] == {"charged": 7}


def test_cancel_a_waiting_operation_and_refuse_a_finished_one(
    agent: TestClient, operator: TestClient
) -> None:
    ref = key()
    invoke(agent, "transfer", {"amount": 1}, ref)
    assert settle(agent, ref)["state"] == "awaiting_approval"
    r = operator.post(f"/v1/operations/{ref}:cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert r.json()["envelope"]["code"] == "OPERATION_CANCELLED"
    done = key()
    invoke(agent, "echo", {"text": "x"}, done)
    settle(agent, done)
    assert operator.post(f"/v1/operations/{done}:cancel").status_code == 409


def test_request_errors_have_a_stable_code(agent: TestClient) -> None:
    cases = [
        (invoke(agent, "nope", {}), 404, "UNKNOWN_TOOL"),
        (invoke(agent, "echo", {"text": 5}), 422, "INVALID_ARGUMENTS"),
        (invoke(agent, "echo", [1, 2]), 422, "INVALID_REQUEST"),
        (invoke(agent, "echo", {"text": "x"}, "bad key!"), 422, "INVALID_ARGUMENTS"),
        (agent.post("/v1/tools/echo:invoke", json={"text": "x"}), 422, "INVALID_REQUEST"),
        (
            agent.post(
                "/v1/tools/echo:invoke",
                content=b"{nope",
                headers={"Idempotency-Key": key(), "Content-Type": "application/json"},
            ),
            400,
            "MALFORMED_BODY",
        ),
        # json.loads raises other than JSONDecodeError on these: they were BAD_REQUEST
        *(
            (
                agent.post(
                    "/v1/tools/echo:invoke",
                    content=body,
                    headers={"Idempotency-Key": key(), "Content-Type": "application/json"},
                ),
                400,
                "MALFORMED_BODY",
            )
            for body in (b'{"text": "\xff"}', b"[" * 5000 + b"]" * 5000, b"9" * 5000)
        ),
        (invoke(agent, "echo", {"text": "x" * 300_000}), 413, "BODY_TOO_LARGE"),
        (  # two keys: which operation was meant? (the first was taken)
            agent.post(
                "/v1/tools/echo:invoke",
                json={"text": "x"},
                headers=[("Idempotency-Key", key()), ("Idempotency-Key", key())],
            ),
            422,
            "INVALID_REQUEST",
        ),
        (agent.get("/v1/operations/run_0/missing"), 404, "OPERATION_NOT_FOUND"),
        (agent.get("/v1/nothing"), 404, "NOT_FOUND"),
        (agent.delete("/v1/tools"), 405, "METHOD_NOT_ALLOWED"),
    ]
    for response, status, code in cases:
        assert response.status_code == status, (code, response.text)
        body = response.json()
        assert body["code"] == code and isinstance(body["message"], str)
        assert set(body) <= {"code", "message", "field_errors", "envelope"}
    assert cases[1][0].json()["field_errors"] == [{"field": "text", "rule": "string_type"}]
    assert cases[-4][0].json()["field_errors"] == [
        {"field": "header.Idempotency-Key", "rule": "single_header"}
    ]


def test_tokens_are_required_and_checked(app: FastAPI) -> None:
    anonymous = TestClient(app)
    r = anonymous.get("/v1/tools")
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert r.json() == {"code": "UNAUTHENTICATED", "message": "a bearer token is required"}
    wrong = TestClient(app, headers={"Authorization": f"Bearer {AGENT}x"})
    assert wrong.get("/v1/tools").status_code == 401
    assert anonymous.get("/v1/health").json() == {"ok": True}
    head = anonymous.head("/v1/health")  # as uptime checkers ask: it was a 405
    assert head.status_code == 200 and head.content == b""


def test_tools_and_status(agent: TestClient) -> None:
    tools = {t["name"]: t for t in agent.get("/v1/tools").json()["tools"]}
    assert tools["echo"]["writes"] is False and tools["create_note"]["writes"] is True
    assert tools["echo"]["input_schema"]["properties"]["text"]["type"] == "string"
    assert tools["transfer"]["requires_approval"] is True
    status = agent.get("/v1/status")
    assert status.status_code == 200 and isinstance(status.json(), dict)


def test_unexpected_errors_are_a_bare_500(
    tq: ToolQueue, app: FastAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*_: Any, **__: Any) -> None:
        raise RuntimeError(f"password={SECRET}")

    monkeypatch.setattr(tq.aio, "submit", explode)
    client = TestClient(app, headers={"Authorization": f"Bearer {AGENT}"})
    r = invoke(client, "echo", {"text": "x"})
    assert r.status_code == 500
    assert r.json() == {"code": "INTERNAL", "message": "internal error"}


def test_an_unreachable_redis_is_a_503_said_once_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    down = ToolQueue(redis_url="redis://127.0.0.1:1/0")
    caplog.set_level(logging.DEBUG, logger="toolq.api")
    try:
        with TestClient(
            create_app(down), base_url="http://127.0.0.1:8000", client=("127.0.0.1", 5000)
        ) as client:
            answers = [client.get(path) for path in ("/v1/operations/x", "/v1/health") * 10]
            answers.append(client.get("/ui/", follow_redirects=False))  # the console's too
    finally:
        down.close()
    r = answers[0]
    assert r.status_code == 503 and r.json()["code"] == "QUEUE_UNAVAILABLE"
    assert "retry-after" in r.headers
    assert {a.status_code for a in answers} == {503}
    # 21 requests failed: one warning for the operator, naming the server
    warned = [
        rec.getMessage()
        for rec in caplog.records
        if rec.levelno >= logging.WARNING and rec.name == "toolq.api"
    ]
    assert len(warned) == 1, warned
    assert warned[0].startswith("queue server unavailable (ServerUnavailable); answering 503")
    assert "127.0.0.1:1" in warned[0]


def test_token_settings_and_the_loopback_rule(capsys: pytest.CaptureFixture[str]) -> None:
    tokens = Tokens.parse(f"{AGENT}=invoke,read; {OPERATOR}=*")
    assert tokens.scopes(AGENT) == {"invoke", "read"}
    assert tokens.scopes(OPERATOR) == {"read", "invoke", "approve", "input", "cancel", "resolve"}
    assert tokens.scopes("agent-token") is None
    for bad in ("short=read", f"{AGENT}=root", f"{AGENT}", f"{AGENT}="):
        with pytest.raises(ValueError) as info:
            Tokens.parse(bad)
        assert AGENT not in str(info.value)
    with pytest.raises(ValueError, match=r"refusing --host 0\.0\.0\.0"):
        check_bind("0.0.0.0", Tokens())
    check_bind("0.0.0.0", tokens)
    for host in ("127.0.0.1", "::1", "localhost"):
        check_bind(host, Tokens())
    assert "loopback only" in capsys.readouterr().err


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_docs_pages_load_nothing_from_another_host(app: FastAPI, page: str) -> None:
    # Given the docs page, as a browser on an air-gapped machine would load it
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    r = client.get(page)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    html = r.text

    # Then no URL in it names a host: everything it loads comes from this server
    assert re.findall(r"(?:https?:)?//[\w.-]", html) == [], html
    urls = re.findall(r"""(?:src|href|spec-url)=["']([^"']+)["']|url: *["']([^"']+)["']""", html)
    loaded = [a or b for a, b in urls]
    assert "/openapi.json" in loaded and len(loaded) >= 3, loaded
    for url in loaded:
        asset = client.get(url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 100, url


# --------------------------------------------------------------------------- DNS rebinding


@pytest.mark.parametrize(
    ("headers", "status", "code"),
    [
        ({"Host": "evil.example"}, 421, "HOST_NOT_ALLOWED"),
        ({"Host": "127.0.0.1.evil.example:8000"}, 421, "HOST_NOT_ALLOWED"),
        ({"Host": "evil.example", "Origin": "http://evil.example"}, 421, "HOST_NOT_ALLOWED"),
        ({"Origin": "http://evil.example"}, 403, "ORIGIN_NOT_ALLOWED"),
        ({"Origin": "http://localhost.evil.example:8000"}, 403, "ORIGIN_NOT_ALLOWED"),
        ({"Origin": "null"}, 403, "ORIGIN_NOT_ALLOWED"),
    ],
)
def test_a_foreign_host_or_origin_is_refused_and_nothing_runs(
    tq: ToolQueue, app: FastAPI, headers: dict[str, str], status: int, code: str
) -> None:
    # Given a browser whose page rebound its name to the API's address (or a page elsewhere)
    client = TestClient(app, base_url="http://127.0.0.1:8000")
    ref = key()
    auth = {"Authorization": f"Bearer {AGENT}", "Idempotency-Key": ref}

    # When it invokes a write, and reads
    r = client.post("/v1/tools/create_note:invoke", json={"body": "x"}, headers=auth | headers)
    read = client.get("/v1/tools", headers=auth | headers)

    # Then both are refused with a typed error, and the ledger never heard of the operation
    assert r.status_code == status and read.status_code == status
    body = r.json()
    assert body["code"] == code and set(body) == {"code", "message"}
    assert "evil" not in r.text
    assert tq.get(ref) is None


@pytest.mark.parametrize(
    "base_url",
    ["http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:9", "http://localhost"],
)
def test_loopback_hosts_and_same_origin_requests_are_answered(app: FastAPI, base_url: str) -> None:
    client = TestClient(app, base_url=base_url, headers={"Authorization": f"Bearer {AGENT}"})
    ref = key()
    r = client.post(
        "/v1/tools/echo:invoke",
        json={"text": "home"},
        headers={"Idempotency-Key": ref, "Origin": base_url},
    )
    assert r.status_code == 202, r.text
    assert settle(client, ref)["envelope"]["result"] == {"text": "home"}


def test_the_bind_address_and_configured_names_are_allowed(tq: ToolQueue) -> None:
    def status(app: FastAPI, host: str) -> int:
        return TestClient(app, base_url=f"http://{host}").get("/v1/health").status_code

    bound = create_app(tq, ApiSettings(), bind_host="10.1.2.3")
    assert status(bound, "10.1.2.3:8000") == 200
    assert status(bound, "10.1.2.4:8000") == 421
    wildcard = create_app(tq, ApiSettings(allowed_hosts="api, toolq.internal"), bind_host="0.0.0.0")
    assert status(wildcard, "api:8080") == 200 and status(wildcard, "TOOLQ.internal.") == 200
    assert status(wildcard, "0.0.0.0:8000") == 421 and status(wildcard, "10.1.2.3") == 421
    with pytest.raises(ValueError, match="is not a host name"):
        ApiSettings(allowed_hosts="api,evil example")


# --------------------------------------------------------------------------- the fuzz run

FUZZ_TOKEN = "fuzz-token-0123456789abcdef"


def no_stack_trace(ctx: Any, response: Any, case: Any) -> None:
    text = response.text
    assert "Traceback" not in text and 'File "' not in text and SECRET not in text


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_fuzz_openapi(tq: ToolQueue, mode: GenerationMode) -> None:
    # Given the generated OpenAPI document of an app with a token for every scope
    settings = ApiSettings(tokens=f"{FUZZ_TOKEN}=*", max_wait=0.2, allowed_hosts=TEST_HOST)
    app = create_app(tq, settings)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    checks = [
        not_a_server_error,
        status_code_conformance,
        content_type_conformance,
        response_schema_conformance,
        no_stack_trace,
    ]
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == 18  # :resolve and /v1/trust (issue 27), /v1/deps (issue 28)

    # When every operation gets generated requests, then none is a 500 or leaks
    for operation in operations:
        raw = operation.definition.raw
        has_inputs = bool(raw.get("parameters")) or "requestBody" in raw
        if mode is GenerationMode.NEGATIVE and not has_inputs:
            continue  # nothing to make invalid

        @hypothesis.given(case=operation.as_strategy(mode))
        @hypothesis.settings(
            max_examples=15 if has_inputs else 2,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(hypothesis.HealthCheck),
        )
        def call(case: Any) -> None:
            case.call_and_validate(headers={"Authorization": f"Bearer {FUZZ_TOKEN}"}, checks=checks)

        call()
