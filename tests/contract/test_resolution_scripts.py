"""The scripts' side of settling an escalated operation (on fakeredis and the real
server, functions and scripts, both layouts): a resolution is one compare-and-set out of
``escalated``, bound to the revision; a retry drops the record's TTL, a resolution to a
terminal state sets it again; the state index and the due set follow."""

from __future__ import annotations

from tests.contract.ops import NOW, QUEUE, TOOL, history, snapshot, submit
from toolq.adapters.ledger import Ledger
from toolq.core.own_envelopes import escalation_envelope
from toolq.core.states import State
from toolq.decisions.recovery import operator, outcome
from toolq.decisions.recovery.transition import Transition

S = State
POLICY = outcome.Policy(
    unclaimed_after_ms=1000, approval_timeout_ms=1000, input_timeout_ms=1000, retention_s=600
)
MESSAGES = outcome.Messages(
    run=lambda ref, attempt: (QUEUE, f"run {ref} {attempt}"),
    verify=lambda ref, attempt, vcheck: (QUEUE, f"verify {ref}"),
)


def escalate(ledger: Ledger, ref: str) -> operator.View:
    submit(ledger, ref)
    return escalate_again(ledger, ref, NOW + 1)


def settle(v: operator.View, how: operator.Settle, **said: str) -> Transition:
    r = operator.Resolution(by="operator:ann", reason="checked", **said)
    return operator.resolve(v, how, NOW + 2, POLICY, MESSAGES, r, result=None, window_ms=60_000)


def test_a_retry_persists_the_record_and_queues_the_next_attempt(ledger: Ledger) -> None:
    v = escalate(ledger, "r/1")
    key = ledger.keys.op("r/1")
    assert 0 < ledger.redis.ttl(key) <= 600

    assert ledger.apply([settle(v, operator.Settle.RETRY)], NOW + 2) == ["ok"]

    assert ledger.redis.ttl(key) == -1
    f = ledger.fields("r/1", "state", "attempt", "max_attempts", "op_retries", "envelope")
    assert f == {"state": "queued", "attempt": "2", "max_attempts": "2", "op_retries": "1"}
    assert ledger.redis.zscore(ledger.keys.index(TOOL, "queued"), "r/1") is not None
    assert ledger.redis.zscore(ledger.keys.index(TOOL, "escalated"), "r/1") is None
    assert ledger.redis.zscore(ledger.keys.due, "r/1") is not None
    h = history(ledger, "r/1")[-1]
    assert (h.from_, h.to, h.by, h.code, h.note) == (
        S.ESCALATED,
        S.QUEUED,
        "operator:ann",
        "RESOLVED_RETRY",
        {"reason": "checked"},
    )


def test_a_resolution_sets_the_retention_ttl_and_a_stale_one_writes_nothing(
    ledger: Ledger,
) -> None:
    v = escalate(ledger, "r/2")
    stale = settle(v, operator.Settle.NOT_COMMITTED)
    assert ledger.apply([settle(v, operator.Settle.RETRY)], NOW + 2) == ["ok"]
    before = snapshot(ledger)
    # the revision it was decided on has passed: refused, nothing written
    assert ledger.apply([stale], NOW + 3) == ["queued"]
    assert snapshot(ledger) == before

    # back to escalated, then resolved as committed: terminal, TTL set again
    v = escalate_again(ledger, "r/2")
    done = settle(v, operator.Settle.COMMITTED, reference="tr_1")
    assert ledger.apply([done], NOW + 4) == ["ok"]
    assert ledger.fields("r/2", "state")["state"] == "succeeded"
    assert 0 < ledger.redis.ttl(ledger.keys.op("r/2")) <= 600
    assert ledger.redis.zscore(ledger.keys.due, "r/2") is None


def escalate_again(ledger: Ledger, ref: str, now: int = NOW + 3) -> operator.View:
    """``ref``, queued, escalated as the scheduler does it (its retention TTL set)."""
    env = escalation_envelope("ATTEMPTS_EXHAUSTED", ref, TOOL, None)
    t = Transition(
        ref=ref,
        states=(S.QUEUED,),
        to=S.ESCALATED,
        by="scheduler",
        code="ATTEMPTS_EXHAUSTED",
        envelope=env,
        remove_due=True,
        ttl=600,
    )
    assert ledger.apply([t], now) == ["ok"]
    return operator.View.from_fields(ref, ledger.fields(ref, *operator.FIELDS))
