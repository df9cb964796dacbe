"""Retry now and verify now, with a real worker and scheduler, through the Python
API, the CLI and the HTTP API; and the lists the console reads them from.

``charge`` (tests/integration/apps/operator_app.py) waits half an hour before its
retry, or minutes before its next verification check, unless an operator acts.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from tests.helpers import run_aio, serving, wait_until
from tests.integration.apps import operator_app
from toolq import ToolQueue
from toolq.core import errors
from toolq.core.record import HistoryEntry
from toolq.core.states import State
from toolq.decisions import operations
from toolq.decisions.recovery import actions, operator
from toolq.decisions.recovery.policy import Action, Decision, Snapshot
from toolq.decisions.recovery.transition import Transition
from toolq.edges.api import ApiSettings, create_app
from toolq.edges.api.auth import token_id
from toolq.edges.cli import main

APP = "tests.integration.apps.operator_app:tq"
READER = "reader-token-0123456789"
OPERATOR = "operator-token-0123456789"
TOKENS = f"{READER}=read;{OPERATOR}=approve,read"


@pytest.fixture(scope="module")
def tq(module_redis_url: str) -> Iterator[ToolQueue]:
    with serving(operator_app.tq, APP, module_redis_url) as q:
        yield q


def state_of(tq: ToolQueue, ref: str) -> State | None:
    rec = tq.get(ref)
    return None if rec is None else rec.state


def waiting_retry(tq: ToolQueue, ref: str) -> None:
    """``ref`` (slow_retry) submitted and waiting half an hour for its retry."""
    tq.submit("charge", {"mode": "slow_retry"}, operation_ref=ref)
    assert wait_until(lambda: state_of(tq, ref) is State.WAITING_RETRY, 30)


def verifying_with_the_verifier_down(tq: ToolQueue, ref: str) -> None:
    """``ref`` committed, its reply lost, its first check failed: the next is minutes away."""
    tq.redis.set(operator_app.VERIFIER_DOWN, "1")
    tq.submit("charge", {"mode": "unknown"}, operation_ref=ref)
    assert wait_until(lambda: tq.ledger.fields(ref, "vfail").get("vfail") == "1", 30)
    tq.redis.delete(operator_app.VERIFIER_DOWN)


def entry(tq: ToolQueue, ref: str, code: str) -> HistoryEntry:
    rec = tq.get(ref)
    assert rec is not None
    return next(h for h in rec.history if h.code == code)


def seen(tq: ToolQueue, ref: str) -> list[int]:
    return [int(x) for x in tq.redis.lrange(f"provider:seen:{ref}", 0, -1)]


# --------------------------------------------------------------------------- the Python API


def test_retry_now_runs_the_next_attempt_now_with_the_same_ref(tq: ToolQueue) -> None:
    # Given a write waiting half an hour for its retry
    waiting_retry(tq, "retry/1")
    due = tq.redis.zscore(tq.ledger.keys.due, "retry/1")
    assert due is not None and due > tq.app.now_ms() + 1_500_000
    # When an operator retries it now
    assert tq.retry_now("retry/1", by="operator:alice") is State.QUEUED
    # Then its second attempt runs at once, under the same operation_ref, and succeeds
    env = tq.wait("retry/1", timeout=30)
    assert env.ok and env.operation_ref == "retry/1"
    rec = tq.get("retry/1")
    assert rec is not None and (rec.state, rec.attempt) == (State.SUCCEEDED, 2)
    assert seen(tq, "retry/1") == [1, 2]
    h = entry(tq, "retry/1", "RETRY_NOW")
    assert (h.from_, h.to, h.attempt, h.by) == (
        State.WAITING_RETRY,
        State.QUEUED,
        2,
        "operator:alice",
    )
    assert tq.ledger.stats()["charge|retried_now"] >= 1


def test_retry_now_and_the_schedulers_dispatch_of_one_revision_move_it_once(
    tq: ToolQueue,
) -> None:
    """An operator's retry and the scheduler's dispatch read the same revision: the
    ledger's compare-and-set lets exactly one of them queue the attempt."""
    for first in ("scheduler", "operator"):
        ref = f"retry/race-{first}"
        waiting_retry(tq, ref)
        by_operator, by_scheduler = _both_dispatches(tq, ref)
        winner, loser = (
            (by_scheduler, by_operator) if first == "scheduler" else (by_operator, by_scheduler)
        )
        assert (
            operations.applied(winner, tq.ledger.apply_one(winner, tq.app.now_ms())) is State.QUEUED
        )
        with pytest.raises(errors.InvalidState, match="changed meanwhile"):
            operations.applied(loser, tq.ledger.apply_one(loser, tq.app.now_ms()))
        assert tq.wait(ref, timeout=30).ok
        rec = tq.get(ref)
        assert rec is not None and rec.attempt == 2 and seen(tq, ref) == [1, 2]
        moves = [h for h in rec.history if h.from_ is State.WAITING_RETRY]
        assert [(h.to, h.by) for h in moves] == [(State.QUEUED, winner.by)]


def _both_dispatches(tq: ToolQueue, ref: str) -> tuple[Transition, Transition]:
    """The operator's retry now and the scheduler's dispatch, from one read of ``ref``."""
    view = operator.View.from_fields(ref, tq.ledger.fields(ref, *operator.FIELDS))
    row = tq.ledger.fields(ref, "state", "tool", "attempt", "max_attempts", "deadline", "rev")
    snap = Snapshot.from_row({"ref": ref, **row})
    now = tq.app.now_ms()
    messages = tq.app.outbound_for(view.tool)
    dispatch = actions.for_decision(
        Decision(Action.DISPATCH), snap, None, view.call_id, now, tq.app.policy, messages
    )
    assert dispatch is not None and snap.rev == int(view.rev)
    return tq.app.retry_now(view, "operator:dave"), dispatch


def test_retry_now_only_from_waiting_retry(tq: ToolQueue) -> None:
    tq.submit("charge", {"cents": 1}, operation_ref="retry/done")
    assert tq.wait("retry/done", timeout=30).ok
    with pytest.raises(errors.InvalidState, match="succeeded, not waiting_retry"):
        tq.retry_now("retry/done")
    with pytest.raises(errors.OperationNotFound):
        tq.retry_now("retry/none")
    rec = tq.get("retry/done")
    assert rec is not None and rec.attempt == 1  # nothing was counted or queued


def test_verify_now_checks_at_once_and_settles_the_write(tq: ToolQueue) -> None:
    # Given a write whose reply was lost and whose first check failed (next one in 5 min)
    verifying_with_the_verifier_down(tq, "verify/1")
    assert state_of(tq, "verify/1") is State.VERIFYING
    checks = int(tq.redis.get("provider:verifications") or 0)
    # When an operator asks for a check now (the verifier is back)
    assert tq.verify_now("verify/1", by="operator:bob") is State.VERIFYING
    # Then a check runs at once, finds the write, and the operation succeeds (one attempt)
    env = tq.wait("verify/1", timeout=30)
    assert env.ok
    assert int(tq.redis.get("provider:verifications") or 0) == checks + 1
    rec = tq.get("verify/1")
    assert rec is not None and rec.attempt == 1 and seen(tq, "verify/1") == [1]
    h = entry(tq, "verify/1", "VERIFY_NOW")
    assert (h.from_, h.to, h.by) == (State.VERIFYING, State.VERIFYING, "operator:bob")
    assert rec.history[-1].code == "VERIFIED_COMMITTED"


def test_verify_now_only_from_verifying(tq: ToolQueue) -> None:
    waiting_retry(tq, "verify/not")
    with pytest.raises(errors.InvalidState):
        tq.verify_now("verify/not")
    tq.cancel("verify/not")


# --------------------------------------------------------------------------- the CLI


def cli(tq: ToolQueue, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        main, [*args, "--app", APP, "--redis-url", tq.redis_url], catch_exceptions=False
    )
    return result.exit_code, result.output


def test_the_cli_retries_and_verifies_and_records_who(tq: ToolQueue) -> None:
    waiting_retry(tq, "cli/retry")
    assert cli(tq, "retry", "cli/retry") == (0, "queued\n")
    assert tq.wait("cli/retry", timeout=30).ok
    assert entry(tq, "cli/retry", "RETRY_NOW").by.startswith("cli:")

    verifying_with_the_verifier_down(tq, "cli/verify")
    assert cli(tq, "verify", "cli/verify") == (0, "verifying\n")
    assert tq.wait("cli/verify", timeout=30).ok

    code, out = cli(tq, "retry", "cli/verify")  # succeeded now: refused, one line
    assert code == 2 and "INVALID_STATE" in out and "Traceback" not in out

    waiting_retry(tq, "cli/cancel")
    assert cli(tq, "cancel", "cli/cancel") == (0, "cancelled\n")
    assert entry(tq, "cli/cancel", "CANCELLED").by.endswith(":cancel")
    code, out = cli(tq, "approve", "cli/cancel")
    assert code == 2 and "INVALID_STATE" in out


# --------------------------------------------------------------------------- the HTTP API


@pytest.fixture(scope="module")
def api(tq: ToolQueue) -> Iterator[tuple[TestClient, TestClient]]:
    app = create_app(tq, ApiSettings(tokens=TOKENS, allowed_hosts=("testserver",)))
    with (
        TestClient(app, headers={"Authorization": f"Bearer {READER}"}) as reader,
        TestClient(app, headers={"Authorization": f"Bearer {OPERATOR}"}) as operator,
    ):
        yield reader, operator


def test_the_api_lists_retries_and_verifies(tq: ToolQueue, api: tuple[TestClient, ...]) -> None:
    reader, operator = api
    waiting_retry(tq, "api/retry")
    # The list shows it, with its code and when the scheduler would retry it
    page = reader.get("/v1/operations", params={"state": "waiting_retry", "tool": "charge"})
    assert page.status_code == 200, page.text
    row = next(r for r in page.json()["items"] if r["operation_ref"] == "api/retry")
    assert row["code"] == "RATE_LIMITED" and row["due_ms"] > tq.app.now_ms() + 1_500_000
    assert row["not_before_ms"] is not None and page.json()["total"] >= 1
    # Without the approve scope: refused, nothing moved
    refused = reader.post("/v1/operations/api/retry:retry")
    assert refused.status_code == 403 and refused.json()["code"] == "FORBIDDEN_SCOPE"
    assert state_of(tq, "api/retry") is State.WAITING_RETRY
    # With it: queued at once, then succeeded
    moved = operator.post("/v1/operations/api/retry:retry")
    assert moved.status_code == 200 and moved.json()["state"] in ("queued", "running", "succeeded")
    assert tq.wait("api/retry", timeout=30).ok
    # The history names the token that acted, by its fingerprint (never the token)
    assert entry(tq, "api/retry", "RETRY_NOW").by == f"api:token-{token_id(OPERATOR.encode())[:8]}"
    # A second retry of it is a conflict
    again = operator.post("/v1/operations/api/retry:retry")
    assert again.status_code == 409 and again.json()["code"] == "INVALID_STATE"

    verifying_with_the_verifier_down(tq, "api/verify")
    checked = operator.post("/v1/operations/api/verify:verify")
    assert checked.status_code == 200, checked.text
    assert tq.wait("api/verify", timeout=30).ok


def test_the_api_refuses_a_bad_list_request(api: tuple[TestClient, ...]) -> None:
    reader, _ = api
    r = reader.get("/v1/operations", params={"state": "sleeping", "code": "lower", "cursor": "x"})
    assert r.status_code == 422
    body = r.json()
    assert body["code"] == "INVALID_ARGUMENTS"
    assert {f["field"] for f in body["field_errors"]} == {"state", "code", "cursor"}


def test_the_api_searches_every_state_with_q(tq: ToolQueue, api: tuple[TestClient, ...]) -> None:
    reader, _ = api
    waiting_retry(tq, "api/search/run_81/step_4")
    tq.submit("charge", {}, operation_ref="api/search/run_81/step_5")
    assert tq.wait("api/search/run_81/step_5", timeout=30).ok

    r = reader.get("/v1/operations", params={"q": "search/run_81", "order": "newest"})

    assert r.status_code == 200, r.text
    body = r.json()
    assert [(i["operation_ref"], i["state"]) for i in body["items"]] == [
        ("api/search/run_81/step_5", "succeeded"),
        ("api/search/run_81/step_4", "waiting_retry"),
    ]
    assert body["next_cursor"] is None and body["total"] is None
    assert all(i["created_ms"] and i["attempt"] >= 1 for i in body["items"])
    # one state only, when asked; a tool's name finds its operations
    one = reader.get("/v1/operations", params={"q": "run_81", "state": "succeeded"}).json()
    assert [i["operation_ref"] for i in one["items"]] == ["api/search/run_81/step_5"]
    by_tool = reader.get("/v1/operations", params={"q": "charg", "limit": 500}).json()
    assert {i["tool"] for i in by_tool["items"]} == {"charge"}
    # bad input: a typed error naming the field
    for bad in ("run\x00", "a\tb", "x" * 201):
        refused = reader.get("/v1/operations", params={"q": bad})
        assert refused.status_code == 422, refused.text
        assert refused.json()["code"] == "INVALID_ARGUMENTS"
        assert [f["field"] for f in refused.json()["field_errors"]] == ["q"]


def test_tq_aio_lists_and_acts(tq: ToolQueue) -> None:
    waiting_retry(tq, "aio/retry")

    async def body() -> State:
        page = await tq.aio.list_operations("waiting_retry", ref_contains="aio/")
        assert [r.operation_ref for r in page.items] == ["aio/retry"]
        assert page.total is None  # a ref filter: not counted
        return await tq.aio.retry_now("aio/retry", by="operator:carol")

    assert run_aio(tq, body) is State.QUEUED
    assert tq.wait("aio/retry", timeout=30).ok
