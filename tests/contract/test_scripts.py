"""What each ledger script does, on fakeredis and on the real server (one suite)."""

from __future__ import annotations

import contextlib

import pytest
import redis

from tests.contract.ops import LEASE, NOW, QUEUE, TOOL, history, put, snapshot, submit
from toolq.adapters.ledger import Ledger, SubmitResult
from toolq.adapters.ledger.scripts import DUE_FIELDS, LIBRARY, WAKE_HORIZON_MS
from toolq.core.own_envelopes import escalation_envelope
from toolq.core.states import State
from toolq.decisions.recovery.transition import Transition

S = State


def ms(value: bytes | str | float | None) -> int:
    """A time the scripts wrote (Lua may format a number as a float)."""
    assert value is not None
    return int(float(value))


# ----------------------------------------------------------------------------- SUBMIT


def test_submit_writes_the_record_its_index_its_due_time_and_its_first_message(
    ledger: Ledger,
) -> None:
    k, r = ledger.keys, ledger.redis
    assert submit(ledger, "a/1") == SubmitResult("created", S.QUEUED)
    assert ledger.fields("a/1", "state", "attempt", "rev", "tool", "submit_fp") == {
        "state": "queued",
        "attempt": "1",
        "rev": "1",
        "tool": TOOL,
        "submit_fp": "fp-1",
    }
    assert ms(ledger.fields("a/1", "published")["published"]) == NOW
    assert r.lrange(QUEUE, 0, -1) == [b"run a/1"]
    assert r.zscore(k.index(TOOL, "queued"), "a/1") == NOW
    assert r.zscore(k.due, "a/1") == NOW + 60_000
    assert ledger.tools() == [TOOL]
    assert ledger.stats() == {f"{TOOL}|submitted": 1, f"{TOOL}|attempts": 1}
    assert [(h.from_, h.to, h.attempt, h.by) for h in history(ledger, "a/1")] == [
        (None, S.QUEUED, 1, "submit")
    ]


def test_a_submit_writes_the_extra_fields_it_is_given_with_the_others(ledger: Ledger) -> None:
    extra = (("dep", "stripe:acct_1"), ("trace", "00-abc-def-01"))
    assert submit(ledger, "x/1", extra=extra).outcome == "created"
    assert ledger.fields("x/1", "dep", "trace", "state") == {
        "dep": "stripe:acct_1",
        "trace": "00-abc-def-01",
        "state": "queued",
    }
    assert ledger.redis.lrange(QUEUE, 0, -1) == [b"run x/1"]
    # a repeat is answered for the first one and writes none of its own
    assert submit(ledger, "x/1", extra=(("dep", "other"),)).outcome == "exists"
    assert ledger.fields("x/1", "dep") == {"dep": "stripe:acct_1"}


def test_every_claim_answers_the_trace_context_the_submit_stored(ledger: Ledger) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01|vendor=1"
    submit(ledger, "t/1", extra=(("trace", parent),))
    assert ledger.claim("t/1", 1, "w1", NOW + 10, LEASE).trace == parent
    # a record without one (tracing off, or written before it) answers ""
    submit(ledger, "t/2")
    assert ledger.claim("t/2", 1, "w1", NOW + 10, LEASE).trace == ""


def test_a_submit_awaiting_approval_sends_nothing_and_counts_no_attempt(ledger: Ledger) -> None:
    assert submit(ledger, "a/2", state=S.AWAITING_APPROVAL).outcome == "created"
    assert ledger.fields("a/2", "attempt", "published") == {"attempt": "0", "published": "0"}
    assert ledger.redis.llen(QUEUE) == 0
    assert ledger.redis.zscore(ledger.keys.index(TOOL, "awaiting_approval"), "a/2") == NOW
    assert ledger.stats() == {f"{TOOL}|submitted": 1}


def test_a_reused_ref_answers_for_the_existing_operation_and_writes_nothing(
    ledger: Ledger,
) -> None:
    submit(ledger, "k/1")
    stats_key = ledger.keys.stats.encode()
    before = snapshot(ledger)
    assert submit(ledger, "k/1", now=NOW + 5) == SubmitResult("exists", S.QUEUED)
    assert submit(ledger, "k/1", fp="fp-2") == SubmitResult("conflict", S.QUEUED)
    assert submit(ledger, "k/1", tool="other") == SubmitResult("conflict", S.QUEUED)
    after = snapshot(ledger)
    # nothing but the count of the repeat answered for the existing one (a trust figure)
    assert {k: v for k, v in after.items() if k != stats_key} == {
        k: v for k, v in before.items() if k != stats_key
    }
    assert ledger.stats() == {f"{TOOL}|submitted": 1, f"{TOOL}|attempts": 1,
                              f"{TOOL}|duplicate_submits": 1}  # fmt: skip


# ----------------------------------------------------------------------------- CLAIM


def test_a_claim_moves_queued_to_running_and_the_next_claimer_is_told_who_holds_it(
    ledger: Ledger,
) -> None:
    k, r = ledger.keys, ledger.redis
    submit(ledger, "c/1")
    c = ledger.claim("c/1", 1, "w1", NOW + 10, LEASE)
    assert (c.outcome, c.tool, c.attempt, c.call_id, c.fp, c.max_attempts) == (
        "claimed",
        TOOL,
        1,
        "call-1",
        "fp-1",
        3,
    )
    f = ledger.fields("c/1", "state", "lease_holder", "lease_until", "rev")
    assert (f["state"], f["lease_holder"], ms(f["lease_until"]), f["rev"]) == (
        "running",
        "w1",
        NOW + 10 + LEASE,
        "2",
    )
    assert r.zscore(k.index(TOOL, "queued"), "c/1") is None
    assert r.zscore(k.index(TOOL, "running"), "c/1") == NOW + 10
    assert r.zscore(k.due, "c/1") == NOW + 10 + LEASE

    # The same holder asking again (its reply was lost) keeps its claim, renewed: a
    # write, which the waits after it on its connection then cover (durability).
    assert ledger.claim("c/1", 1, "w1", NOW + 20, LEASE).outcome == "claimed"
    assert ms(ledger.fields("c/1", "lease_until")["lease_until"]) == NOW + 20 + LEASE
    assert r.zscore(k.due, "c/1") == NOW + 20 + LEASE
    # Another delivery of the same attempt is told who holds it, until when.
    held = ledger.claim("c/1", 1, "w2", NOW + 20, LEASE)
    assert (held.outcome, held.holder, held.lease_until_ms) == ("held", "w1", NOW + 20 + LEASE)
    # An older attempt's delivery is stale.
    stale = ledger.claim("c/1", 0, "w3", NOW + 20, LEASE)
    assert (stale.outcome, stale.state) == ("stale", "running")
    assert ledger.claim("nope", 1, "w1", NOW, LEASE).outcome == "missing"

    assert ledger.stats()[f"{TOOL}|duplicates_prevented"] == 2
    assert [(h.from_, h.to, h.by) for h in history(ledger, "c/1")] == [
        (None, S.QUEUED, "submit"),
        (S.QUEUED, S.RUNNING, "w1"),
    ]


def test_a_verification_claim_is_held_while_its_lease_lives(ledger: Ledger) -> None:
    put(ledger, "v/1", S.VERIFYING, vcheck=2)
    assert ledger.claim("v/1", 1, "v-a", NOW, LEASE, kind="verify", vcheck=1).outcome == "stale"
    assert ledger.claim("v/1", 1, "v-a", NOW, LEASE, kind="verify", vcheck=2).outcome == "claimed"
    held = ledger.claim("v/1", 1, "v-b", NOW + 1, LEASE, kind="verify", vcheck=2)
    assert (held.outcome, held.holder, held.lease_until_ms) == ("held", "v-a", NOW + LEASE)
    # Once the lease has run out, another checker takes the check over.
    late = NOW + LEASE + 1
    assert ledger.claim("v/1", 1, "v-b", late, LEASE, kind="verify", vcheck=2).outcome == "claimed"
    assert ledger.fields("v/1", "state", "vholder") == {"state": "verifying", "vholder": "v-b"}
    assert ledger.redis.zscore(ledger.keys.due, "v/1") == late + LEASE
    assert history(ledger, "v/1") == []  # a check changes no state


# ----------------------------------------------------------------------------- RENEW


def test_renew_extends_the_leases_still_held_and_names_the_lost_ones(ledger: Ledger) -> None:
    k, r = ledger.keys, ledger.redis
    for ref, holder in (("r/1", "w1"), ("r/2", "w2")):
        submit(ledger, ref)
        ledger.claim(ref, 1, holder, NOW, LEASE)
    put(ledger, "r/3", S.VERIFYING, vholder="v1")
    later = NOW + 1000
    lost = ledger.renew(
        later,
        LEASE,
        [
            ("r/1", 1, "run", "w1"),
            ("r/2", 1, "run", "w1"),  # w2 holds it
            ("r/3", 1, "verify", "v1"),
            ("r/4", 1, "run", "w1"),  # no such operation
        ],
    )
    assert lost == ["r/2", "r/4"]
    assert ms(ledger.fields("r/1", "lease_until")["lease_until"]) == later + LEASE
    assert ms(ledger.fields("r/2", "lease_until")["lease_until"]) == NOW + LEASE
    assert ms(ledger.fields("r/3", "vlease_until")["vlease_until"]) == later + LEASE
    assert {ref: r.zscore(k.due, ref) for ref in ("r/1", "r/2", "r/3", "r/4")} == {
        "r/1": later + LEASE,
        "r/2": NOW + LEASE,
        "r/3": later + LEASE,
        "r/4": None,
    }
    assert not r.exists(k.op("r/4"))


# ----------------------------------------------------------------------------- APPLY


def test_apply_moves_the_record_and_everything_that_follows_it(ledger: Ledger) -> None:
    k, r = ledger.keys, ledger.redis
    submit(ledger, "p/1")
    ledger.claim("p/1", 1, "w1", NOW, LEASE)

    # Given a running attempt that was rate limited
    wait = Transition(
        ref="p/1",
        states=(S.RUNNING,),
        to=S.WAITING_RETRY,
        by="w1",
        code="RATE_LIMITED",
        expect={"running": {"lease_holder": "w1"}},
        set={"retry_due": str(NOW + 5000)},
        delete=("lease_holder", "lease_until"),
        due_ms=NOW + 5000,
        stats=("rate_limited",),
    )
    assert ledger.apply([wait], NOW + 100) == ["ok"]
    f = ledger.fields("p/1", "state", "rev", "entered", "retry_due", "lease_holder")
    assert (f["state"], f["rev"], ms(f["entered"]), "lease_holder" in f) == (
        "waiting_retry",
        "3",
        NOW + 100,
        False,
    )
    assert r.zscore(k.index(TOOL, "running"), "p/1") is None
    assert r.zscore(k.index(TOOL, "waiting_retry"), "p/1") == NOW + 100
    assert r.zscore(k.due, "p/1") == NOW + 5000

    # When the scheduler dispatches it: a new attempt, a message on another queue
    dispatch = Transition(
        ref="p/1",
        states=(S.WAITING_RETRY,),
        to=S.QUEUED,
        by="scheduler",
        expect={"*": {"rev": "3"}},
        attempt_incr=1,
        push=("tq.other", "run p/1 #2"),
        due_ms=NOW + 9000,
    )
    assert ledger.apply([dispatch], NOW + 5000) == ["ok"]
    assert r.lrange("tq.other", 0, -1) == [b"run p/1 #2"]
    f = ledger.fields("p/1", "attempt", "published")
    assert (f["attempt"], ms(f["published"])) == ("2", NOW + 5000)

    # Then it is cancelled: settled, out of the due set, kept for the retention time
    env = escalation_envelope("ATTEMPTS_EXHAUSTED", "p/1", TOOL, None)
    cancel = Transition(
        ref="p/1",
        states=(S.QUEUED,),
        to=S.CANCELLED,
        by="operator",
        envelope=env,
        remove_due=True,
        ttl=600,
        stats=("cancelled",),
    )
    assert ledger.apply([cancel], NOW + 6000) == ["ok"]
    assert r.zscore(k.due, "p/1") is None
    assert 0 < r.ttl(k.op("p/1")) <= 600
    assert ledger.envelope("p/1") == env
    assert ledger.stats() == {
        f"{TOOL}|submitted": 1,
        f"{TOOL}|attempts": 2,
        f"{TOOL}|rate_limited": 1,
        f"{TOOL}|cancelled": 1,
        # 4.9 s in waiting_retry (toolq.core.stats): its bucket, and the sum
        f"{TOOL}|recovery_ms:waiting_retry:5000": 1,
        f"{TOOL}|recovery_ms:waiting_retry:sum": 4900,
    }
    assert [(h.from_, h.to, h.attempt, h.code) for h in history(ledger, "p/1")][1:] == [
        (S.QUEUED, S.RUNNING, 1, None),
        (S.RUNNING, S.WAITING_RETRY, 1, "RATE_LIMITED"),
        (S.WAITING_RETRY, S.QUEUED, 2, None),
        (S.QUEUED, S.CANCELLED, 2, None),
    ]


def test_apply_refuses_a_failed_compare_and_set_and_writes_nothing(ledger: Ledger) -> None:
    submit(ledger, "x/1")
    before = snapshot(ledger)
    refused = [
        # not in the expected state
        Transition(ref="x/1", states=(S.WAITING_RETRY,), to=S.QUEUED, by="t", push=(QUEUE, "m")),
        # a guarded field moved on
        Transition(
            ref="x/1", states=(S.QUEUED,), to=S.CANCELLED, by="t", expect={"*": {"rev": "7"}}
        ),
        Transition(
            ref="x/1",
            states=(S.QUEUED,),
            to=S.QUEUED,
            by="t",
            quiet=True,
            expect={"queued": {"repubs": "3"}},
        ),
        Transition(ref="x/404", states=(S.QUEUED,), to=S.CANCELLED, by="t"),
    ]
    assert ledger.apply(refused, NOW + 1) == ["queued", "queued", "queued", "missing"]
    assert snapshot(ledger) == before


def test_a_transition_whose_record_write_fails_leaves_nothing_else_written(
    ledger: Ledger,
) -> None:
    submit(ledger, "e/1")
    before = snapshot(ledger)
    # Given a dispatch of one operation (written at once, not buffered) whose field
    # value the server's HSET refuses (a JSON true, as a caller's bug could send)
    t = Transition(
        ref="e/1",
        states=(S.QUEUED,),
        to=S.CANCELLED,
        by="t",
        set={"x": "@@bad@@"},
        push=("tq.other", "m"),
        due_ms=NOW + 5000,
        stats=("cancelled",),
    )
    keys, args = ledger.calls.apply([t], NOW + 1)
    args[2] = args[2].replace('"@@bad@@"', "true")
    # When the script runs, it fails
    with pytest.raises(redis.ResponseError):
        ledger.scripts("apply", keys, args)
    # Then no message, index move or counter was written for the record that never moved
    assert snapshot(ledger) == before


def test_guards_and_fields_are_compared_and_written_as_strings(ledger: Ledger) -> None:
    submit(ledger, "n/1")
    # A guard or a field given as a number (not what the types say, but what an old
    # caller or a plugin may pass) means its text, as the ledger always read it
    t = Transition(
        ref="n/1",
        states=(S.QUEUED,),
        to=S.QUEUED,
        by="t",
        quiet=True,
        expect={"*": {"rev": 1}},  # type: ignore[dict-item]
        set={"repubs": 2},  # type: ignore[dict-item]
    )
    assert ledger.apply([t], NOW + 1) == ["ok"]
    assert ledger.fields("n/1", "rev", "repubs") == {"rev": "2", "repubs": "2"}


def test_a_batch_decides_each_item_alone_and_keeps_each_refs_last_word(ledger: Ledger) -> None:
    k, r = ledger.keys, ledger.redis
    for ref in ("b/1", "b/2", "b/3"):
        put(ledger, ref, S.WAITING_RETRY)
        r.zadd(k.index(TOOL, "waiting_retry"), {ref: NOW})

    def dispatch(ref: str, queue: str) -> Transition:
        return Transition(
            ref=ref,
            states=(S.WAITING_RETRY,),
            to=S.QUEUED,
            by="s",
            push=(queue, f"run {ref}"),
            due_ms=NOW + 10,
        )

    batch = [
        dispatch("b/1", "q.a"),
        Transition(ref="b/2", states=(S.NEEDS_INPUT,), to=S.QUEUED, by="s"),  # refused
        dispatch("b/3", "q.b"),
        # b/1 again in the same batch: the due set and the indexes keep its last word
        Transition(ref="b/1", states=(S.QUEUED,), to=S.CANCELLED, by="s", remove_due=True),
    ]
    assert ledger.apply(batch, NOW + 1) == ["ok", "waiting_retry", "ok", "ok"]
    assert (r.lrange("q.a", 0, -1), r.lrange("q.b", 0, -1)) == ([b"run b/1"], [b"run b/3"])
    assert r.zrange(k.index(TOOL, "waiting_retry"), 0, -1) == [b"b/2"]
    assert r.zrange(k.index(TOOL, "queued"), 0, -1) == [b"b/3"]
    assert r.zrange(k.index(TOOL, "cancelled"), 0, -1) == [b"b/1"]
    assert r.zrange(k.due, 0, -1) == [b"b/3"]


def test_every_state_entered_is_announced_settled_ones_apart(ledger: Ledger) -> None:
    k = ledger.keys
    classic = ledger.redis.pubsub()
    with contextlib.closing(ledger.redis.pubsub()) as sub, contextlib.closing(classic):
        # Sharded Pub/Sub (SPUBLISH): a classic subscriber to the same names hears nothing.
        sub.ssubscribe(k.notify, k.notify_steps)
        classic.subscribe(k.notify, k.notify_steps)
        for _ in range(2):
            assert sub.get_message(timeout=5)["type"] == "ssubscribe"  # type: ignore[index]
            assert classic.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
        submit(ledger, "n/1")
        ledger.claim("n/1", 1, "w1", NOW, LEASE)
        verify = Transition(ref="n/1", states=(S.RUNNING,), to=S.VERIFYING, by="w1")
        env = escalation_envelope("VERIFICATION_UNAVAILABLE", "n/1", TOOL, None)
        escalate = Transition(
            ref="n/1", states=(S.VERIFYING,), to=S.ESCALATED, by="v", envelope=env
        )
        assert ledger.apply([verify, escalate], NOW + 1) == ["ok", "ok"]
        # a quiet update changes no state: no notice
        quiet = Transition(ref="n/1", states=(S.ESCALATED,), to=S.ESCALATED, by="v", quiet=True)
        assert ledger.apply([quiet], NOW + 2) == ["ok"]
        ledger.redis.spublish(k.notify, "end\n\n")  # what follows the last notice
        notices = [sub.get_message(timeout=5) for _ in range(5)]
        ledger.redis.publish(k.notify, "classic end")
        heard = classic.get_message(timeout=5)
        assert heard is not None and heard["data"] == b"classic end"  # nothing before it
    got = [(n["channel"].decode(), *n["data"].decode().split("\n", 2)) for n in notices if n]
    assert [(channel, head, numbers) for channel, head, numbers, _ in got] == [
        (k.notify_steps, "queued n/1", "1 1"),  # state ref / rev seq
        (k.notify_steps, "running n/1", "2 2"),
        (k.notify_steps, "verifying n/1", "3 3"),
        (k.notify, "escalated n/1", "4 4"),  # settled: where waiters listen
        (k.notify, "end", ""),
    ]
    assert got[3][3] == env.model_dump_json(exclude_none=True)


def test_a_note_goes_into_the_history_entry_and_a_quiet_one_is_announced_to_watchers(
    ledger: Ledger,
) -> None:
    k = ledger.keys
    with contextlib.closing(ledger.redis.pubsub()) as sub:
        sub.ssubscribe(k.notify, k.notify_steps)
        for _ in range(2):
            assert sub.get_message(timeout=5)["type"] == "ssubscribe"  # type: ignore[index]
        submit(ledger, "q/1")
        ledger.claim("q/1", 1, "w1", NOW, LEASE)
        verify = Transition(ref="q/1", states=(S.RUNNING,), to=S.VERIFYING, by="w1")
        assert ledger.apply([verify], NOW + 1) == ["ok"]
        rev = ledger.fields("q/1", "rev")["rev"]
        # Given a quiet update with a note (a check's verdict), one without, and a
        # transition with a note whose words need escaping
        checked = Transition(
            ref="q/1",
            states=(S.VERIFYING,),
            to=S.VERIFYING,
            by="v1",
            quiet=True,
            set={"vfail": "1"},
            note={"check": "1", "result": "unavailable", "detail": "UPSTREAM_DOWN"},
        )
        silent = Transition(ref="q/1", states=(S.VERIFYING,), to=S.VERIFYING, by="s", quiet=True)
        env = escalation_envelope("VERIFICATION_UNAVAILABLE", "q/1", TOOL, None)
        escalate = Transition(
            ref="q/1",
            states=(S.VERIFYING,),
            to=S.ESCALATED,
            by="v2",
            code="VERIFICATION_UNAVAILABLE",
            envelope=env,
            note={"check": "2", "detail": 'say "hi"\\'},
        )
        assert ledger.apply([checked, silent], NOW + 2) == ["ok", "ok"]
        assert ledger.apply([escalate], NOW + 3) == ["ok"]
        ledger.redis.spublish(k.notify, "end\n\n")
        notices = [sub.get_message(timeout=5) for _ in range(6)]
    # Then the quiet one with a note appended an entry, from == to; the silent one none
    assert [(h.from_, h.to, h.by, h.code, h.note) for h in history(ledger, "q/1")][2:] == [
        (S.RUNNING, S.VERIFYING, "w1", None, {}),
        (
            S.VERIFYING,
            S.VERIFYING,
            "v1",
            None,
            {"check": "1", "result": "unavailable", "detail": "UPSTREAM_DOWN"},
        ),
        (
            S.VERIFYING,
            S.ESCALATED,
            "v2",
            "VERIFICATION_UNAVAILABLE",
            {"check": "2", "detail": 'say "hi"\\'},
        ),
    ]
    assert ledger.fields("q/1", "state", "vfail", "hn") == {
        "state": "escalated",
        "vfail": "1",
        "hn": "5",
    }
    # And it was announced on the steps channel (watchers), not where waiters listen
    got = [(n["channel"].decode(), *n["data"].decode().split("\n", 2)[:2]) for n in notices if n]
    assert got[2:] == [
        (k.notify_steps, "verifying q/1", f"{rev} 3"),
        (k.notify_steps, "verifying q/1", f"{int(rev) + 1} 4"),
        (k.notify, "escalated q/1", f"{int(rev) + 3} 5"),
        (k.notify, "end", ""),
    ]


def test_an_entry_without_a_note_is_written_as_before(ledger: Ledger) -> None:
    submit(ledger, "q/2")
    t = Transition(ref="q/2", states=(S.QUEUED,), to=S.CANCELLED, by="op", code="CANCELLED")
    assert ledger.apply([t], NOW + 1) == ["ok"]
    raw = ledger.redis.hget(ledger.keys.op("q/2"), "h2")
    assert raw is not None
    assert raw.decode() == (
        f'{{"at":{NOW + 1},"from":"queued","to":"cancelled","attempt":1,"by":"op",'
        '"code":"CANCELLED"}'
    )


# ----------------------------------------------------------------------------- CLAIM_DUE


def test_claim_due_hands_out_due_items_once_until_their_hold_ends(ledger: Ledger) -> None:
    k, r = ledger.keys, ledger.redis
    submit(ledger, "d/1", due=NOW + 10)
    submit(ledger, "d/2", due=NOW + 20)
    submit(ledger, "d/3", due=NOW + 10_000)
    r.zadd(k.due, {"d/gone": NOW})  # its record expired: the script drops it

    rows = ledger.claim_due(NOW + 100, limit=10, hold_ms=5000)
    assert [(row["ref"], row["state"], row["tool"], ms(row["due_score"])) for row in rows] == [
        ("d/1", "queued", TOOL, NOW + 10),
        ("d/2", "queued", TOOL, NOW + 20),
    ]
    assert set(rows[0]) == {"ref", "due_score", *DUE_FIELDS}
    assert dict(r.zrange(k.due, 0, -1, withscores=True)) == {
        b"d/1": NOW + 5100,
        b"d/2": NOW + 5100,
        b"d/3": NOW + 10_000,
    }
    # held from other schedulers until the hold ends
    assert ledger.claim_due(NOW + 200, limit=10, hold_ms=5000) == []
    assert [row["ref"] for row in ledger.claim_due(NOW + 5100, limit=1, hold_ms=5000)] == ["d/1"]


def test_the_drains_pipelined_calls_answer_as_the_plain_ones(ledger: Ledger) -> None:
    """The scheduler's drain sends EVALSHA itself: with its keys, on its own connection."""
    submit(ledger, "e/1", due=NOW)
    ledger.load_scripts()
    pool = ledger.redis.connection_pool
    conn = pool.get_connection()
    try:
        ledger.send_claim_due(conn, NOW + 1, 10, 5000)
        rows = ledger.read_claim_due(conn)
        assert [row["ref"] for row in rows] == ["e/1"]
        cancel = Transition(ref="e/1", states=(S.QUEUED,), to=S.CANCELLED, by="s", remove_due=True)
        ledger.send_apply(conn, [cancel], NOW + 2)
        assert ledger.read_apply(conn) == ["ok"]
    finally:
        pool.release(conn)
    assert ledger.fields("e/1", "state") == {"state": "cancelled"}
    assert ledger.redis.zcard(ledger.keys.due) == 0


# ----------------------------------------------------------------------------- PLAN_SLEEP


def test_a_planned_sleep_is_cut_short_only_by_an_earlier_item(ledger: Ledger) -> None:
    k, r = ledger.keys, ledger.redis
    # nothing due: the longest sleep, never past the horizon however long max_sleep is
    assert ledger.plan_sleep(NOW, 5_000) == NOW + 5_000
    assert ledger.plan_sleep(NOW, 60_000) == NOW + WAKE_HORIZON_MS
    assert ms(r.get(k.sleep_until)) == NOW + WAKE_HORIZON_MS

    submit(ledger, "s/1", due=NOW + 90_000)  # beyond the wake-up: nobody is woken
    assert r.llen(k.wake) == 0
    submit(ledger, "s/2", due=NOW + 1000)  # before it: the scheduler is woken
    assert r.lrange(k.wake, 0, -1) == [b"1"]
    assert ms(r.get(k.sleep_until)) == NOW + 1000

    assert ledger.plan_sleep(NOW, 60_000) == NOW + 1000  # the earliest due item
    assert r.llen(k.wake) == 0
    # APPLY wakes it as SUBMIT does
    move = Transition(
        ref="s/1", states=(S.QUEUED,), to=S.QUEUED, by="s", quiet=True, due_ms=NOW + 500
    )
    assert ledger.apply([move], NOW) == ["ok"]
    assert r.lrange(k.wake, 0, -1) == [b"1"]


def test_an_item_past_the_horizon_never_looks_at_the_planned_sleep(ledger: Ledger) -> None:
    # Given a planned wake-up further away than any scheduler plans (set by hand)
    k, r = ledger.keys, ledger.redis
    r.set(k.sleep_until, NOW + 10 * WAKE_HORIZON_MS)
    # When an item is added at least the horizon past the caller's now: not read, no wake
    submit(ledger, "h/1", due=NOW + WAKE_HORIZON_MS)
    assert r.llen(k.wake) == 0
    # and one just inside it is compared with the plan, and wakes the scheduler
    submit(ledger, "h/2", due=NOW + WAKE_HORIZON_MS - 1)
    assert r.lrange(k.wake, 0, -1) == [b"1"]


def test_a_durable_call_after_the_server_lost_the_scripts_loads_them_again(
    ledger: Ledger,
) -> None:
    # A ledger whose submits and claims wait for the fsync (on the real server: the
    # script call and WAITAOF in one pipeline, not the plain call that reloads itself)
    durable = Ledger(ledger.redis, prefix="tq", durability="fsync")
    durable.scripts.functions = ledger.scripts.functions
    assert submit(durable, "l/1").outcome == "created"
    # Given a server that lost them (FUNCTION FLUSH, SCRIPT FLUSH, a restart without
    # persistence); this library only, as other tests share the server
    if durable.scripts.functions:
        ledger.redis.function_delete(LIBRARY)
    else:
        ledger.redis.script_flush()
    # When the next submit and claim come
    assert submit(durable, "l/2").outcome == "created"
    assert durable.claim("l/1", 1, "w1", NOW, LEASE).outcome == "claimed"
    # Then they were loaded again and each call did its work once
    assert [h.to for h in history(durable, "l/1")] == [S.QUEUED, S.RUNNING]
    assert ledger.redis.llen(QUEUE) == 2
