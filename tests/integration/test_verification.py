"""The verification queue settles every unknown outcome (issue 5).

Calls and verification are served by separate worker pools here, as a
deployment that sizes verification apart from writes would run them.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta

import pytest
import redis
from fastapi.testclient import TestClient

from tests.helpers import (
    start_scheduler,
    start_worker,
    stop_processes,
    toolq_env,
    wait_until,
)
from tests.integration.conftest import APP, effects, seen
from toolq import State, ToolQueue
from toolq.core import why
from toolq.edges.api import ApiSettings, create_app

TOKEN = "reader-token-0123456789"


@pytest.fixture(scope="module", autouse=True)
def processes(rt: ToolQueue, module_redis_url: str) -> Iterator[None]:
    procs = [
        start_worker(APP, module_redis_url, queues="toolq.calls", concurrency=2),
        start_worker(APP, module_redis_url, queues="toolq.verify", concurrency=2),
        start_scheduler(APP, module_redis_url),
    ]
    yield
    stop_processes(procs)


def test_commit_then_lost_reply_is_verified_as_succeeded(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    ref = rt.submit("pay", {"mode": "lost_reply"}, operation_ref="v/lost_reply").operation_ref
    env = rt.wait(ref, timeout=20)

    assert env.ok and env.verification.evidence_ref == "verification:find_payment"
    assert effects(provider, ref) == 1 and seen(provider, ref) == [1]
    rec = rt.get(ref)
    assert rec is not None
    codes = [(h.to, h.code) for h in rec.history]
    assert (State.VERIFYING, "OUTCOME_UNKNOWN") in codes
    assert codes[-1] == (State.SUCCEEDED, "VERIFIED_COMMITTED")
    assert rt.ledger.stats()["pay|verify_found"] >= 1


def test_timeout_before_commit_is_redispatched_once_with_the_same_ref(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    ref = rt.submit("pay", {"mode": "timeout_before_commit"}).operation_ref
    env = rt.wait(ref, timeout=20)

    assert env.ok and env.result == {"paid": ref, "attempt": 2}
    assert effects(provider, ref) == 1
    assert seen(provider, ref) == [1, 2]
    rec = rt.get(ref)
    assert rec is not None
    requeued = next(h for h in rec.history if h.code == "VERIFIED_NOT_COMMITTED")
    assert requeued.to == State.QUEUED and requeued.attempt == 2
    # Not before the consistency window passed: measured from when the outcome became
    # unknown as the worker decided it (uncertain_at), not from the verifying entry's
    # stamp, which is when that was recorded, a few ms later.
    assert rec.uncertain_at is not None and rec.window_end is not None
    assert rec.window_end - rec.uncertain_at == timedelta(seconds=0.5)
    assert requeued.at >= round(rec.window_end.timestamp() * 1000)


def test_verifier_down_rechecks_then_escalates_and_stays_there(
    rt: ToolQueue, provider: redis.Redis
) -> None:
    provider.set("provider:verifier_down", "1")
    try:
        ref = rt.submit("pay", {"mode": "verifier_down"}).operation_ref
        # While it is verifying, the agent sees the unknown outcome, never a retry
        assert wait_until(lambda: rt.get(ref).state is State.VERIFYING, 10)  # type: ignore[union-attr]
        pending = rt.wait(ref, timeout=0.05)
        assert not pending.ok and pending.code == "OUTCOME_UNKNOWN"
        assert pending.commit_state == "unknown" and pending.next_action == "verify_operation"
        assert pending.safe_details["verification_tool"] == "find_payment"

        env = rt.wait(ref, timeout=20)
        assert not env.ok and env.code == "VERIFICATION_UNAVAILABLE"
        assert env.commit_state == "unknown"
        checks = int(provider.get("provider:verifications") or 0)
        assert checks >= 3
        # Each failed check is in the history; the escalation says why in words
        rec = rt.get(ref)
        assert rec is not None
        failed = [h for h in rec.history if h.note.get("result") == "unavailable"]
        assert [h.note["detail"] for h in failed] == ["UPSTREAM_ERROR"] * 3
        assert failed[-1].to is State.ESCALATED
        e = why.escalation(rec)
        assert e is not None and (e.code, e.checks_made, e.checks_failed) == (
            "VERIFICATION_UNAVAILABLE",
            3,
            3,
        )
        assert e.words == why.REASONS["VERIFICATION_UNAVAILABLE"]
    finally:
        provider.delete("provider:verifier_down")
    # When the verifier comes back, nothing runs without an operator: the scheduler
    # holds nothing due for it, and work queued after it on both queues goes past it
    rev = rt.ledger.fields(ref, "rev")["rev"]
    assert rt.redis.zscore(rt.ledger.keys.due, ref) is None
    later = rt.submit("pay", {"mode": "lost_reply"}).operation_ref  # a call, then a check
    assert rt.wait(later, timeout=20).ok
    assert rt.ledger.fields(ref, "state", "rev") == {"state": "escalated", "rev": rev}
    assert seen(provider, ref) == [1] and effects(provider, ref) == 1


def test_every_check_is_recorded_and_shown_by_the_api_its_events_and_toolq_show(
    rt: ToolQueue, provider: redis.Redis, module_redis_url: str
) -> None:
    # Given a write whose reply is lost, and a verifier that is unavailable twice
    ref = "v/flaky_verifier"
    provider.set(f"provider:verifier_unavailable:{ref}", "2")
    rt.submit("pay", {"mode": "lost_reply"}, operation_ref=ref)
    # When the checks run (real workers, the scheduler's backoff between them)
    env = rt.wait(ref, timeout=30)
    # Then it is found, and each check is an entry: two unavailable, then found
    assert env.ok and effects(provider, ref) == 1
    rec = rt.get(ref)
    assert rec is not None
    checks = [(h.from_, h.to, h.note) for h in rec.history if h.note]
    down = {"result": "unavailable", "detail": "LOOKUP_DOWN reason=maintenance"}
    said = [(frm, to, {k: n[k] for k in ("result", "detail") if k in n}) for frm, to, n in checks]
    assert said == [
        (State.VERIFYING, State.VERIFYING, down),
        (State.VERIFYING, State.VERIFYING, down),
        (State.VERIFYING, State.SUCCEEDED, {"result": "found"}),
    ]
    first, second, found = (n for _, _, n in checks)
    assert int(first["next"]) < int(second["next"])  # the backoff grows
    assert int(first["check"]) < int(second["check"]) < int(found["check"])
    # And the API's view, its event stream and `toolq show --json` report them
    api = create_app(rt, ApiSettings(tokens=f"{TOKEN}=read", allowed_hosts="testserver"))
    with TestClient(api, headers={"Authorization": f"Bearer {TOKEN}"}) as client:
        view = client.get(f"/v1/operations/{ref}").json()
        with client.stream("GET", f"/v1/operations/{ref}/events") as stream:
            lines = list(stream.iter_lines())
    events = [json.loads(x[6:]) for x in lines if x.startswith('data: {"index"')]
    v = view["verification"]
    assert (v["checks_made"], v["failed"], v["next_check_ms"]) == (3, 2, None)
    assert [c["result"] for c in v["checks"]] == ["unavailable", "unavailable", "found"]
    told = [e["check"] for e in events if "check" in e]
    assert [(c["result"], c["detail"]) for c in told] == [
        ("unavailable", "LOOKUP_DOWN reason=maintenance"),
        ("unavailable", "LOOKUP_DOWN reason=maintenance"),
        ("found", None),
    ]
    shown = subprocess.run(
        [sys.executable, "-m", "toolq.edges.cli", "show", ref, "--json", "--app", APP,
         "--redis-url", module_redis_url],
        capture_output=True, text=True, timeout=120, env=toolq_env(),
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    sv = json.loads(shown.stdout)["verification"]
    assert (sv["checks_made"], sv["failed"]) == (3, 2)
    text = subprocess.run(
        [sys.executable, "-m", "toolq.edges.cli", "show", ref, "--app", APP,
         "--redis-url", module_redis_url],
        capture_output=True, text=True, timeout=120, env=toolq_env(),
    ).stdout  # fmt: skip
    assert "verification: 3 checks made, 2 failed" in text
    assert text.count("verifier unavailable: checks again later") == 2
    # The verifier's own words never reach any of them
    for out in (json.dumps(view), json.dumps(events), shown.stdout, text):
        assert "abc123" not in out and "try later" not in out


def test_not_found_inside_the_window_is_a_check_that_names_the_next_one(rt: ToolQueue) -> None:
    # Given a write whose reply is lost and whose verifier finds nothing, a minute
    # before "not found" may be believed
    ref = "v/too_early"
    rt.submit("deliver", {}, operation_ref=ref)

    def checked() -> bool:
        rec = rt.get(ref)
        return rec is not None and any(h.note for h in rec.history)

    # When its first check is made
    assert wait_until(checked, 20)
    rec = rt.get(ref)
    assert rec is not None and rec.state is State.VERIFYING
    # Then the check is in the history: not found, too early, the next at the window's end
    entry = next(h for h in rec.history if h.note)
    assert (entry.from_, entry.to) == (State.VERIFYING, State.VERIFYING)
    assert {k: entry.note[k] for k in ("result", "detail")} == {
        "result": "not_found",
        "detail": "TOO_EARLY",
    }
    v = why.verification(rec)
    assert v is not None and v.uncertain_at_ms is not None
    window_end = v.uncertain_at_ms + 60_000
    assert int(entry.note["next"]) == v.window_end_ms == v.next_check_ms == window_end
    assert (v.checks_made, v.failed) == (1, 0)
    assert 0 < (v.window_left_s(entry.at) or 0) <= 60
