"""Every key a ledger script touches carries the deployment's hash tag.

Redis Cluster runs a script only if all its keys hash to one slot; the tag
(the settings prefix in braces) makes that so. The Celery queue lists are
kombu's and the one exception (see toolq.adapters.ledger.scripts).
"""

from __future__ import annotations

import redis

from tests.contract.ops import LEASE, NOW, QUEUE, TOOL, put, submit
from toolq.adapters.ledger import Ledger
from toolq.core.own_envelopes import escalation_envelope
from toolq.core.states import ALLOWED, TERMINAL, State
from toolq.decisions.recovery.transition import Transition

S = State
VERIFY_QUEUE = "tq.verify"


def test_every_key_the_scripts_write_is_tagged_and_named_by_keys(client: redis.Redis) -> None:
    ledger = Ledger(client, prefix="cell-a")
    k = ledger.keys
    assert k.tag == "{cell-a}"
    refs: list[str] = []

    # Given a submit (queued and awaiting approval), claims, renewals
    for ref, state in (("q/1", S.QUEUED), ("a/1", S.AWAITING_APPROVAL)):
        submit(ledger, ref, state=state, due=NOW + 10)
        refs.append(ref)
    ledger.plan_sleep(NOW, 60_000)
    # When a running attempt moves to every state a run can end in
    for to in sorted(ALLOWED[S.RUNNING]):
        ref = f"run/{to}"
        refs.append(ref)
        submit(ledger, ref, due=NOW + 5)
        assert ledger.claim(ref, 1, "w1", NOW, LEASE).outcome == "claimed"
        assert ledger.renew(NOW + 1, LEASE, [(ref, 1, "run", "w1")]) == []
        env = escalation_envelope("ATTEMPTS_EXHAUSTED", ref, TOOL, None) if to in TERMINAL else None
        push = (QUEUE, f"run {ref} #2") if to is S.QUEUED else None
        t = Transition(
            ref=ref,
            states=(S.RUNNING,),
            to=to,
            by="w1",
            envelope=env,
            push=push,
            stats=(f"to_{to}",),
            ttl=600 if to in TERMINAL else None,
            due_ms=None if to in TERMINAL else NOW + 1,
            remove_due=to in TERMINAL,
        )
        assert ledger.apply([t], NOW + 2) == ["ok"]
    # and a verification is claimed, renewed and re-published; a queued one cancelled
    put(ledger, "v/1", S.VERIFYING, vcheck=1)
    refs.append("v/1")
    assert ledger.claim("v/1", 1, "v1", NOW, LEASE, kind="verify", vcheck=1).outcome == "claimed"
    assert ledger.renew(NOW + 1, LEASE, [("v/1", 1, "verify", "v1")]) == []
    recheck = Transition(
        ref="v/1",
        states=(S.VERIFYING,),
        to=S.VERIFYING,
        by="s",
        quiet=True,
        push=(VERIFY_QUEUE, "v"),
    )
    cancel = Transition(ref="a/1", states=(S.AWAITING_APPROVAL,), to=S.CANCELLED, by="op", ttl=60)
    assert ledger.apply([recheck, cancel], NOW + 3) == ["ok", "ok"]
    assert ledger.claim_due(NOW + 100, 100, 5000) != []
    ledger.plan_sleep(NOW + 100, 60_000)

    # Then every key but the Celery queues is under the tag, with a name from toolq.core.keys
    names = {key.decode() for key in client.scan_iter(count=1000)}
    queues = {QUEUE, VERIFY_QUEUE}
    assert queues <= names
    ledger_keys = names - queues
    assert all(name.startswith(k.tag + ":") for name in ledger_keys), sorted(ledger_keys)
    known = {k.due, k.wake, k.sleep_until, k.stats, k.tools, k.meta}  # meta: the format
    known |= {k.op(ref) for ref in refs}
    known |= {k.index(TOOL, str(s)) for s in State}
    assert ledger_keys <= known, sorted(ledger_keys - known)
    # the indexes the scripts named from data are the ones toolq.core.keys names
    for to in ALLOWED[S.RUNNING]:
        assert client.zscore(k.index(TOOL, str(to)), f"run/{to}") == NOW + 2
