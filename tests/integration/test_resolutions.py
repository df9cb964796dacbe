"""Settling escalated operations with a real worker and scheduler, through the Python
API, the CLI and the HTTP API; and approval a tool asks for only sometimes.

``transfer`` and ``payout`` are in tests/integration/apps/resolve_app.py; its provider
counts every write per ref.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from tests.helpers import serving, wait_until
from tests.integration.apps import resolve_app
from toolq import ToolQueue
from toolq.core import errors
from toolq.core.envelope import ToolError, ToolSuccess
from toolq.core.record import HistoryEntry
from toolq.core.states import State
from toolq.edges.api import ApiSettings, create_app
from toolq.edges.api.auth import token_id
from toolq.edges.cli import main

APP = "tests.integration.apps.resolve_app:tq"
APPROVER = "approver-token-0123456789"
RESOLVER = "resolver-token-0123456789"
TOKENS = f"{APPROVER}=approve,input,cancel,read;{RESOLVER}=resolve,read"


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    with serving(resolve_app.tq, APP, module_redis_url) as q:
        yield q


def escalated(tq: ToolQueue, ref: str, mode: str) -> ToolError:
    """``ref`` submitted in ``mode`` and escalated; its envelope."""
    tq.submit("transfer", {"mode": mode}, operation_ref=ref)
    env = tq.wait(ref, timeout=30)
    assert isinstance(env, ToolError) and env.next_action == "escalate", env
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.ESCALATED
    return env


def writes(tq: ToolQueue, ref: str) -> list[int]:
    return [int(x) for x in tq.redis.lrange(f"provider:writes:{ref}", 0, -1)]


def last(tq: ToolQueue, ref: str) -> HistoryEntry:
    rec = tq.get(ref)
    assert rec is not None
    return rec.history[-1]


def ttl(tq: ToolQueue, ref: str) -> int:
    return int(tq.redis.ttl(tq.ledger.keys_of(ref).op(ref)))


def stat(tq: ToolQueue, name: str) -> int:
    return int(tq.redis.hget(tq.ledger.keys.stats, f"transfer|{name}") or 0)


# --------------------------------------------------------------------------- the Python API


def test_resolved_as_committed_succeeds_confirmed_by_the_operator(tq: ToolQueue) -> None:
    # Given a write that happened, whose reply was lost and which nothing could verify
    escalated(tq, "py/committed", "lost_reply")
    assert writes(tq, "py/committed") == [1] and ttl(tq, "py/committed") > 0
    before = stat(tq, "resolved_committed")

    # When an operator who found it at the provider resolves it as committed
    rev = tq.get("py/committed").rev  # type: ignore[union-attr]
    state = tq.resolve(
        "py/committed",
        "committed",
        reason="found transfer tr_81 in the provider's dashboard",
        result={"transfer": "tr_81"},
        reference="tr_81",
        rev=rev,
        by="operator:alice",
    )

    # Then it succeeded, and the agent's envelope says an operator confirmed it
    assert state is State.SUCCEEDED
    env = tq.wait("py/committed", timeout=5)
    assert isinstance(env, ToolSuccess) and env.result == {"transfer": "tr_81"}
    assert env.verification.evidence_ref == "operator:operator:alice"
    h = last(tq, "py/committed")
    assert (h.from_, h.to, h.by, h.code) == (
        State.ESCALATED,
        State.SUCCEEDED,
        "operator:alice",
        "RESOLVED_COMMITTED",
    )
    assert h.note == {
        "reason": "found transfer tr_81 in the provider's dashboard",
        "reference": "tr_81",
    }
    assert writes(tq, "py/committed") == [1]  # nothing was sent again
    assert stat(tq, "resolved_committed") == before + 1
    assert 0 < ttl(tq, "py/committed") <= tq.settings.recovery.retention


def test_resolved_as_not_committed_fails_and_sends_nothing(tq: ToolQueue) -> None:
    escalated(tq, "py/not", "exhaust")
    before = stat(tq, "resolved_not_committed")

    state = tq.resolve("py/not", "not_committed", reason="no such transfer at the provider")

    assert state is State.FAILED
    env = tq.wait("py/not", timeout=5)
    assert isinstance(env, ToolError) and env.code == "RESOLVED_NOT_COMMITTED"
    assert env.commit_state == "not_committed" and env.retry.directive == "never"
    assert last(tq, "py/not").note == {"reason": "no such transfer at the provider"}
    assert stat(tq, "resolved_not_committed") == before + 1
    assert writes(tq, "py/not") == []


def test_a_retry_writes_once_under_the_same_ref_and_the_waiter_sees_it(tq: ToolQueue) -> None:
    # Given a write whose first request failed before anything was written, and which
    # nothing could verify: escalated, its record set to expire
    escalated(tq, "py/retry", "lost_request")
    assert writes(tq, "py/retry") == [] and ttl(tq, "py/retry") > 0
    before = stat(tq, "resolved_retry")

    # When an agent waits on the ref, and an operator who found nothing retries it
    async def wait_then_retry() -> ToolSuccess | ToolError:
        waiter = asyncio.create_task(tq.aio.wait("py/retry", timeout=30))
        # the waiter has the escalated envelope at once: escalated is settled
        first = await waiter
        assert isinstance(first, ToolError) and first.next_action == "escalate"
        state = await tq.aio.resolve(
            "py/retry", "retry", reason="nothing at the provider", by="operator:bob"
        )
        assert state is State.QUEUED
        return await tq.aio.wait("py/retry", timeout=30)

    env = asyncio.run(wait_then_retry())

    # Then the new attempt ran once, under the same ref, and wrote once
    assert isinstance(env, ToolSuccess) and env.result == {"sent": 100, "attempt": 2}
    assert env.operation_ref == "py/retry"
    assert writes(tq, "py/retry") == [2]
    rec = tq.get("py/retry")
    assert rec is not None and rec.state is State.SUCCEEDED and rec.operator_retries == 1
    retried = next(h for h in rec.history if h.code == "RESOLVED_RETRY")
    assert (retried.from_, retried.to, retried.by) == (
        State.ESCALATED,
        State.QUEUED,
        "operator:bob",
    )
    assert stat(tq, "resolved_retry") == before + 1
    # succeeded again: the retention TTL is back
    assert ttl(tq, "py/retry") > 0


def test_a_retried_record_loses_its_ttl_while_it_runs(tq: ToolQueue) -> None:
    # exhaust: the retried attempt is rate limited again, then escalates again
    escalated(tq, "py/ttl", "exhaust")
    assert ttl(tq, "py/ttl") > 0
    tq.resolve("py/ttl", "retry", reason="nothing at the provider")
    assert ttl(tq, "py/ttl") == -1  # no TTL: a live operation never expires
    # the operator's attempt was one more (3 of 3); rate limited, it escalates again
    env = tq.wait("py/ttl", timeout=30)
    assert isinstance(env, ToolError) and env.code == "ATTEMPTS_EXHAUSTED"
    rec = tq.get("py/ttl")
    assert rec is not None and rec.state is State.ESCALATED and rec.attempt == 3
    assert ttl(tq, "py/ttl") > 0


def test_past_the_operator_budget_a_retry_is_refused(tq: ToolQueue) -> None:
    escalated(tq, "py/budget", "exhaust")
    for _ in range(resolve_app.OPERATOR_RETRIES):
        tq.resolve("py/budget", "retry", reason="nothing at the provider")
        assert wait_until(lambda: tq.get("py/budget").state is State.ESCALATED, 30)  # type: ignore[union-attr]
    rec = tq.get("py/budget")
    assert rec is not None
    with pytest.raises(errors.OperatorRetriesSpent, match="resolve it as committed"):
        tq.resolve("py/budget", "retry", reason="once more")
    after = tq.get("py/budget")
    assert after is not None and (after.rev, after.state) == (rec.rev, State.ESCALATED)
    assert after.operator_retries == resolve_app.OPERATOR_RETRIES


@pytest.mark.parametrize(
    ("outcome", "words", "error", "code"),
    [
        ("retry", {"reason": ""}, errors.InvalidArguments, "INVALID_ARGUMENTS"),
        ("committed", {"reason": "found it"}, errors.InvalidArguments, "INVALID_ARGUMENTS"),
        ("maybe", {"reason": "x"}, errors.InvalidArguments, "INVALID_ARGUMENTS"),
        ("not_committed", {"reason": "x", "rev": "1"}, errors.StaleRevision, "STALE_REVISION"),
        (
            "committed",
            {"reason": "x", "result": {"x": object()}},
            errors.InvalidArguments,
            "INVALID_ARGUMENTS",
        ),
    ],
)
def test_bad_input_is_refused_and_writes_nothing(
    tq: ToolQueue, outcome: str, words: dict[str, object], error: type, code: str
) -> None:
    ref = f"py/bad-{code.lower()}-{outcome}-{len(words)}"
    if tq.get(ref) is None:
        escalated(tq, ref, "exhaust")
    rec = tq.get(ref)
    assert rec is not None
    with pytest.raises(error) as caught:
        tq.resolve(ref, outcome, **words)  # type: ignore[arg-type]
    assert caught.value.code == code
    after = tq.get(ref)
    assert after is not None and after.rev == rec.rev and after.state is State.ESCALATED
    assert len(after.history) == len(rec.history)


def test_only_an_escalated_operation_is_resolved(tq: ToolQueue) -> None:
    tq.submit("transfer", {"mode": "ok"}, operation_ref="py/ok")
    assert tq.wait("py/ok", timeout=30).ok
    with pytest.raises(errors.InvalidState, match="not escalated"):
        tq.resolve("py/ok", "not_committed", reason="x")
    with pytest.raises(errors.OperationNotFound):
        tq.resolve("py/none", "retry", reason="x")


# --------------------------------------------------------------------------- the CLI


def cli(tq: ToolQueue, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, [*args, "--app", APP, "--redis-url", tq.redis_url], catch_exceptions=False
    )
    return result.exit_code, result.output


def test_the_cli_resolves_and_records_who(tq: ToolQueue) -> None:
    escalated(tq, "cli/committed", "lost_reply")
    code, out = cli(tq, "resolve", "cli/committed", "--committed", "--reason", "seen")
    assert code == 2 and "result or a reference" in out  # nothing to return: refused
    code, out = cli(
        tq, "resolve", "cli/committed", "--committed", "--reason", "seen at the provider",
        "--result", '{"transfer": "tr_9"}', "--reference", "tr_9",
    )  # fmt: skip
    assert (code, out) == (0, "succeeded\n")
    h = last(tq, "cli/committed")
    assert h.by.startswith("cli:") and h.by.endswith(":resolve")
    assert h.note == {"reason": "seen at the provider", "reference": "tr_9"}

    escalated(tq, "cli/retry", "lost_request")
    assert cli(tq, "resolve", "cli/retry", "--retry", "--reason", "nothing there") == (
        0,
        "queued\n",
    )
    assert tq.wait("cli/retry", timeout=30).ok and writes(tq, "cli/retry") == [2]

    escalated(tq, "cli/not", "exhaust")
    code, out = cli(tq, "resolve", "cli/not", "--reason", "x")
    assert code == 2 and "--committed, --not-committed or --retry" in out
    code, out = cli(tq, "resolve", "cli/not", "--not-committed")
    assert code == 2 and "--reason" in out
    code, out = cli(tq, "resolve", "cli/not", "--committed", "--reason", "x", "--result", "{")
    assert code == 2 and "--result is not valid JSON" in out
    assert cli(tq, "resolve", "cli/not", "--not-committed", "--reason", "none") == (
        0,
        "failed\n",
    )
    code, out = cli(tq, "resolve", "cli/not", "--retry", "--reason", "again")
    assert code == 2 and "INVALID_STATE" in out and "Traceback" not in out


@pytest.mark.parametrize(
    "flags",
    [["--committed", "--retry"], ["--retry", "--committed"], ["--not-committed", "--retry"]],
)
def test_the_cli_refuses_two_findings_and_writes_nothing(tq: ToolQueue, flags: list[str]) -> None:
    # Given an escalated write the operator saw committed, then also typed --retry
    ref = f"cli/two-{'-'.join(f.strip('-') for f in flags)}"
    escalated(tq, ref, "lost_reply")
    rec = tq.get(ref)
    assert rec is not None
    code, out = cli(tq, "resolve", ref, *flags, "--reason", "seen", "--reference", "tr_1")
    # Then it is a usage error (the last flag won, before: a committed write ran again)
    assert code == 2 and "say one thing you found" in out
    after = tq.get(ref)
    assert after is not None and after.rev == rec.rev and after.state is State.ESCALATED


# --------------------------------------------------------------------------- the HTTP API


@pytest.fixture(scope="module")
def api(tq: ToolQueue) -> Iterator[tuple[TestClient, TestClient]]:
    app = create_app(tq, ApiSettings(tokens=TOKENS, allowed_hosts=("testserver",)))
    with (
        TestClient(app, headers={"Authorization": f"Bearer {APPROVER}"}) as approver,
        TestClient(app, headers={"Authorization": f"Bearer {RESOLVER}"}) as resolver,
    ):
        yield approver, resolver


def test_the_api_resolves_with_the_resolve_scope(
    tq: ToolQueue, api: tuple[TestClient, TestClient]
) -> None:
    approver, resolver = api
    escalated(tq, "api/retry", "lost_request")
    view = resolver.get("/v1/operations/api/retry").json()
    body = {"outcome": "retry", "reason": "nothing at the provider", "rev": view["rev"]}

    # The approve scope is not enough: settling is a word about the provider
    refused = approver.post("/v1/operations/api/retry:resolve", json=body)
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN_SCOPE"
    # Bad bodies: typed, nothing moved
    for bad, status, code in [
        ({**body, "reason": ""}, 422, "INVALID_REQUEST"),
        ({"outcome": "retry"}, 422, "INVALID_REQUEST"),
        ({**body, "outcome": "maybe"}, 422, "INVALID_REQUEST"),
        ({**body, "reason": "   "}, 422, "REASON_REQUIRED"),
        ({**body, "rev": view["rev"] - 1}, 409, "STALE_REVISION"),
        ({**body, "result": {"a": 1}}, 422, "RESULT_NOT_EXPECTED"),
    ]:
        r = resolver.post("/v1/operations/api/retry:resolve", json=bad)
        assert (r.status_code, r.json()["code"]) == (status, code), (bad, r.text)
    assert resolver.get("/v1/operations/api/retry").json()["rev"] == view["rev"]

    moved = resolver.post("/v1/operations/api/retry:resolve", json=body)
    assert moved.status_code == 200, moved.text
    assert moved.json()["state"] in ("queued", "running", "succeeded")
    assert tq.wait("api/retry", timeout=30).ok and writes(tq, "api/retry") == [2]
    who = f"api:token-{token_id(RESOLVER.encode())[:8]}"
    rec = tq.get("api/retry")
    assert rec is not None
    assert next(h for h in rec.history if h.code == "RESOLVED_RETRY").by == who

    escalated(tq, "api/committed", "lost_reply")
    done = resolver.post(
        "/v1/operations/api/committed:resolve",
        json={"outcome": "committed", "reason": "seen", "reference": "tr_7"},
    )
    assert done.status_code == 200 and done.json()["state"] == "succeeded"
    env = done.json()["envelope"]
    assert env["result"] == {"reference": "tr_7"}
    assert env["verification"]["evidence_ref"] == f"operator:{who}"

    again = resolver.post(
        "/v1/operations/api/committed:resolve", json={"outcome": "retry", "reason": "x"}
    )
    assert again.status_code == 409 and again.json()["code"] == "INVALID_STATE"
    missing = resolver.post("/v1/operations/api/none:resolve", json=body)
    assert missing.status_code == 404


# --------------------------------------------------------------------------- approval sometimes


def test_a_tool_that_asks_for_approval_only_sometimes_runs_once_after_one_approval(
    tq: ToolQueue,
) -> None:
    # A small payout needs no approval
    small = tq.call("payout", {"amount_cents": 500}, operation_ref="pay/small", timeout=30)
    assert isinstance(small, ToolSuccess) and small.result == {"paid": 500, "approved": False}

    # A large one waits for a person
    tq.submit("payout", {"amount_cents": 25_000}, operation_ref="pay/large")
    env = tq.wait("pay/large", timeout=30)
    assert isinstance(env, ToolError) and env.next_action == "request_approval"
    assert writes(tq, "pay/large") == []

    # One approval: the approved run sees ctx.approved and writes, once
    assert tq.approve("pay/large", by="operator:carol") is State.QUEUED
    env = tq.wait("pay/large", timeout=30)
    assert isinstance(env, ToolSuccess), env
    assert env.result == {"paid": 25_000, "approved": True}
    assert writes(tq, "pay/large") == [2]
    rec = tq.get("pay/large")
    assert rec is not None and rec.state is State.SUCCEEDED and rec.attempt == 2
    assert [h.code for h in rec.history if h.code == "APPROVED"] == ["APPROVED"]
    fields = tq.ledger.fields("pay/large", "fp", "approved_fp")
    assert fields["approved_fp"] == fields["fp"]
    assert json.loads(tq.ledger.fields("pay/large", "args")["args"]) == {"amount_cents": 25_000}
