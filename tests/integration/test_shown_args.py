"""An operation's arguments never show a secret, in any output a person or agent sees.

Each secret shape goes into one operation's arguments, in the ledger; then every
output that shows that operation is read: ``toolq show`` (text and ``--json``,
in a process of its own), the HTTP API's view, its list and its event stream,
MCP's approval request, the console's page and a log line. ``toolq show --json``
printed them all before it used :func:`toolq.core.redact.shown_args`.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.helpers import toolq_env
from tests.integration.apps import cli_app
from tests.integration.apps.cli_app import APP
from toolq import ToolQueue
from toolq.core.record import OperationRecord
from toolq.edges.api import create_app
from toolq.edges.api.console.present import operation_page
from toolq.edges.mcp_server.taskview import input_requests
from toolq.process.logs import redact_record

#: What must not appear, and the argument text that carries it.
SHAPES = {
    "abcdefghijklmnop0123": "Authorization: Bearer abcdefghijklmnop0123",
    "AbCdEfGh12345678": "key sk-proj-AbCdEfGh12345678",
    "AKIAIOSFODNN7EXAMPLE": "aws AKIAIOSFODNN7EXAMPLE",
    "s3cr3tpw": "postgres://admin:s3cr3tpw@db.internal/app",
    "MIIEowIBAAKCAQEA": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA\n"
    "-----END RSA PRIVATE KEY-----",
}
#: Values with no secret shape, secret by their field's name alone.
PASSWORD, API_KEY = "hunter2-plain", "plainkey-987654"
HIDDEN = (*SHAPES, PASSWORD, API_KEY)


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    cli_app.tq.configure(redis_url=module_redis_url)
    yield cli_app.tq
    cli_app.tq.close()


@pytest.fixture(scope="module")
def record(tq: ToolQueue) -> OperationRecord:
    args = {"user": "ann", "password": PASSWORD, "api_key": API_KEY}
    ref = f"shown/{uuid.uuid4().hex[:8]}"
    tq.submit("login", {**args, "note": "\n".join(SHAPES.values())}, operation_ref=ref)
    rec = tq.get(ref)
    assert rec is not None and rec.args["password"] == PASSWORD  # the ledger keeps them
    return rec


def _none_shown(text: str, where: str) -> None:
    leaked = [h for h in HIDDEN if h in text]
    assert not leaked, (where, leaked, text[:2000])


@pytest.mark.parametrize(
    ("flags", "app"),
    [(["--json"], True), ([], True), ([], False)],
    ids=["json", "text", "text-without-the-app"],
)
def test_toolq_show(
    record: OperationRecord, module_redis_url: str, flags: list[str], app: bool
) -> None:
    where = [*(["--app", APP] if app else []), "--redis-url", module_redis_url]
    result = subprocess.run(
        [sys.executable, "-m", "toolq.edges.cli", "show", record.operation_ref, *flags, *where],
        env=toolq_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    if not flags:  # the text form: the record was read (with the app or without it)
        assert result.stdout.startswith(f"{record.operation_ref}  login  awaiting_approval")
    _none_shown(result.stdout + result.stderr, "toolq show " + " ".join(flags))
    if flags:
        shown = json.loads(result.stdout)["args"]
        assert shown["password"] == shown["api_key"] == "[redacted]" and shown["user"] == "ann"


def test_the_http_api_its_list_and_its_event_stream(tq: ToolQueue, record: OperationRecord) -> None:
    client = TestClient(create_app(tq), base_url="http://127.0.0.1")
    ref = record.operation_ref
    for path in (
        f"/v1/operations/{ref}",
        f"/v1/operations/{ref}/events",  # awaiting approval is settled: the stream ends
        "/v1/operations?state=awaiting_approval&limit=500",
    ):
        r = client.get(path)
        assert r.status_code == 200, r.text
        _none_shown(r.text, path)


def test_mcp_the_console_and_the_logs(tq: ToolQueue, record: OperationRecord) -> None:
    schema = tq.registry.get("login").input_schema()
    asked = json.dumps(input_requests(record, schema))
    _none_shown(asked, "MCP approval request")
    assert "[redacted]" in asked
    page = operation_page(record, schema).args_json
    _none_shown(page, "console")
    assert '"user": "ann"' in page and "[redacted]" in page
    line = logging.LogRecord("toolq", logging.INFO, __file__, 1, "args %s", (record.args,), None)
    _none_shown(redact_record(line).getMessage(), "log line")
