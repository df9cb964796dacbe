"""Limits per dependency in the scripts (issue 28): the claim admits or holds a call back
as :func:`toolq.decisions.deps.admit` says, the record of an outcome moves the key as
:func:`toolq.decisions.deps.after_outcome` says, and a call without a key costs no
command. One table drives the Lua and the Python model."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from tests.contract.ops import LEASE, NOW, put, submit
from toolq.adapters.ledger import Ledger
from toolq.core.deps import Limits, limits_table
from toolq.core.envelope import ToolError
from toolq.core.own_envelopes import dependency_limited_envelope
from toolq.core.record import load_envelope
from toolq.core.states import State
from toolq.decisions.deps import DepState, admit, after_outcome
from toolq.decisions.recovery.transition import Transition

S = State
KEY = "stripe:acct_1"
#: 10/s: one call every 100 ms, a burst of 2; a breaker of 3 in 10 s, open 5 s.
LIMITS = Limits(rate="10/s", burst=2, breaker_failures=3, breaker_window=10, breaker_open=5)
TABLE = limits_table({"stripe": LIMITS})


def queued(ledger: Ledger, ref: str, now: int = NOW, **fields: Any) -> None:
    submit(ledger, ref, now=now, extra=(("dep", KEY), *((k, str(v)) for k, v in fields.items())))


def claim(ledger: Ledger, ref: str, now: int, table: str = TABLE) -> tuple[str, str, int]:
    c = ledger.claim(ref, 1, f"w-{ref}", now, LEASE, limits=table)
    return c.outcome.value, c.state, c.lease_until_ms


def dep_fields(ledger: Ledger) -> dict[str, str]:
    raw = ledger.redis.hgetall(ledger.keys.dep(KEY))
    return {k.decode(): v.decode() for k, v in raw.items()}


def model_state(ledger: Ledger) -> DepState:
    f = dep_fields(ledger)
    return DepState(
        tat=float(f.get("tat", 0)),
        atat=float(f.get("atat", 0)),
        paused_until=int(float(f.get("paused_until", 0))),
        breaker=f.get("breaker", "closed"),
        fails=int(f.get("fails", 0)),
        fails_since=int(float(f.get("fails_since", 0))),
        open_until=int(float(f.get("open_until", 0))),
        probe=f.get("probe", ""),
        probe_until=int(float(f.get("probe_until", 0))),
        resume=f.get("resume") == "1",
    )


def model_admit(ledger: Ledger, ref: str, now: int) -> tuple[str | None, int]:
    slots = ledger.redis.zrange(ledger.keys.dep_slots(KEY), 0, -1, withscores=True)
    slot = ledger.redis.hget(ledger.keys.op(ref), "dep_slot")
    a = admit(
        model_state(ledger),
        ref=ref,
        now=now,
        lease_ms=LEASE,
        interval_ms=100,
        burst=2,
        concurrency=0,
        live_slots=[(r.decode(), int(s)) for r, s in slots],
        slot=int(float(slot)) if slot else None,
    )
    return a.reason, a.not_before


def both(ledger: Ledger, ref: str, now: int) -> tuple[str, str, int]:
    """The script's answer, checked against the model's on the same state."""
    reason, nb = model_admit(ledger, ref, now)
    got = claim(ledger, ref, now)
    if reason is None:
        assert got[0] == "claimed", (got, reason)
    else:
        assert got[:2] == ("limited", reason), (got, reason, nb)
        assert got[2] == nb
    return got


def test_the_rate_reserves_each_call_a_slot_it_passes_on_without_consuming_again(
    ledger: Ledger,
) -> None:
    for i in range(4):
        queued(ledger, f"r/{i}")
    # a burst of 2 goes at once; the third and fourth get the next slots
    assert both(ledger, "r/0", NOW)[0] == "claimed"
    assert both(ledger, "r/1", NOW)[0] == "claimed"
    assert both(ledger, "r/2", NOW) == ("limited", "rate", NOW + 100)
    assert both(ledger, "r/3", NOW) == ("limited", "rate", NOW + 200)
    # held back: waiting_retry, no attempt spent, its slot on the record
    rec = ledger.get("r/2")
    assert rec is not None and rec.state is S.WAITING_RETRY and rec.attempt == 1
    assert ledger.fields("r/2", "dep_slot", "dep_held") == {"dep_slot": "1700000000100",
                                                            "dep_held": "rate"}  # fmt: skip
    tat = dep_fields(ledger)["tat"]
    # back at its slot (as the scheduler sends it: queued, the same attempt), it passes
    # and the key's clock does not move
    ledger.redis.hset(ledger.keys.op("r/2"), mapping={"state": "queued"})
    assert claim(ledger, "r/2", NOW + 100)[0] == "claimed"
    assert dep_fields(ledger)["tat"] == tat
    assert ledger.fields("r/2", "dep_slot", "dep_held") == {}


def test_the_held_back_calls_envelope_is_the_python_one(ledger: Ledger) -> None:
    queued(ledger, "e/1")
    ledger.redis.hset(ledger.keys.dep(KEY), "paused_until", NOW + 1_234)

    assert claim(ledger, "e/1", NOW)[:2] == ("limited", "paused")

    raw = ledger.redis.hget(ledger.keys.op("e/1"), "envelope")
    env = load_envelope(raw.decode() if isinstance(raw, bytes) else str(raw))
    assert isinstance(env, ToolError)
    assert env == dependency_limited_envelope("e/1", "send", "call-1", KEY, "paused", NOW + 1_234,
                                              3)  # fmt: skip
    assert ledger.redis.zscore(ledger.keys.dep_waiting(KEY), "e/1") is not None
    assert ledger.redis.zscore(ledger.keys.deps, KEY) == NOW


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"paused_until": NOW + 500}, "paused"),
        ({"breaker": "open", "open_until": NOW + 500}, "breaker_open"),
        ({"breaker": "open", "open_until": NOW - 1}, None),  # half-open: this is the probe
        ({"breaker": "half_open", "probe": "other", "probe_until": NOW + 900}, "half_open"),
        ({"breaker": "half_open", "probe": "other", "probe_until": NOW - 1}, None),
        ({"tat": NOW + 150}, "rate"),
        ({"tat": NOW + 50}, None),
    ],
)
def test_admission_follows_the_model(
    ledger: Ledger, fields: dict[str, Any], reason: str | None
) -> None:
    queued(ledger, "a/1")
    ledger.redis.hset(ledger.keys.dep(KEY), mapping=fields)
    got = both(ledger, "a/1", NOW)
    assert (got[1] if got[0] == "limited" else None) == reason
    if reason is None and fields.get("breaker"):
        assert dep_fields(ledger)["probe"] == "a/1"


def test_concurrency_holds_back_the_third_call_and_a_release_wakes_it(ledger: Ledger) -> None:
    for i in range(3):
        queued(ledger, f"c/{i}")
    t = limits_table({"stripe": Limits(concurrency=2)})
    assert claim(ledger, "c/0", NOW, t)[0] == "claimed"
    assert claim(ledger, "c/1", NOW, t)[0] == "claimed"
    assert claim(ledger, "c/2", NOW + 1, t) == ("limited", "concurrency", NOW + LEASE)
    # c/0 ends: its slot back, and c/2 due now
    done = Transition(ref="c/0", states=(S.RUNNING,), to=S.SUCCEEDED, by="w-c/0", remove_due=True)
    assert ledger.apply([done], NOW + 50) == ["ok"]
    assert ledger.redis.zscore(ledger.keys.due, "c/2") == NOW + 50
    assert ledger.redis.zcard(ledger.keys.dep_slots(KEY)) == 1
    # an expired slot (its worker died) is dropped on the next acquire
    assert claim(ledger, "c/2", NOW + LEASE + 1, t)[0] == "stale"  # waiting_retry now
    ledger.redis.hset(ledger.keys.op("c/2"), mapping={"state": "queued"})
    assert claim(ledger, "c/2", NOW + LEASE + 1, t)[0] == "claimed"


@pytest.mark.parametrize(
    ("signal", "to", "paused", "fails"),
    [
        ("pause", S.WAITING_RETRY, True, 0),
        ("down", S.WAITING_RETRY, True, 1),
        ("failure", S.VERIFYING, False, 1),
        (None, S.SUCCEEDED, False, 0),
    ],
)
def test_an_outcome_moves_the_key_as_the_model_says(
    ledger: Ledger, signal: str | None, to: State, paused: bool, fails: int
) -> None:
    queued(ledger, "o/1")
    assert claim(ledger, "o/1", NOW)[0] == "claimed"
    before = model_state(ledger)
    due = NOW + 3_000
    t = Transition(ref="o/1", states=(S.RUNNING,), to=to, by="w-o/1",
                   set={"dep_signal": signal} if signal else {},
                   due_ms=due if to is S.WAITING_RETRY else None)  # fmt: skip
    assert ledger.apply([t], NOW + 10) == ["ok"]

    want = after_outcome(
        before,
        ref="o/1",
        now=NOW + 10,
        signal=signal,  # type: ignore[arg-type]
        due=due if to is S.WAITING_RETRY else None,
        succeeded=to is S.SUCCEEDED,
        breaker_failures=3,
        breaker_window_ms=10_000,
        breaker_open_ms=5_000,
    )
    got = model_state(ledger)
    assert (got.paused_until, got.fails, got.breaker, got.resume) == (
        want.paused_until, want.fails, want.breaker, want.resume)  # fmt: skip
    assert (got.paused_until == due) is paused
    assert got.fails == fails
    assert ledger.redis.zcard(ledger.keys.dep_slots(KEY)) == 0


def test_a_pause_ends_with_one_probe_whose_success_lets_the_others_go(ledger: Ledger) -> None:
    for ref in ("p/0", "p/1", "p/2", "p/3"):
        queued(ledger, ref)
    # p/0 gets a 429: the key is paused until its retry is due
    assert claim(ledger, "p/0", NOW)[0] == "claimed"
    pause = Transition(ref="p/0", states=(S.RUNNING,), to=S.WAITING_RETRY, by="w-p/0",
                       set={"dep_signal": "pause"}, due_ms=NOW + 1_000)  # fmt: skip
    assert ledger.apply([pause], NOW + 1) == ["ok"]
    assert claim(ledger, "p/1", NOW + 2) == ("limited", "paused", NOW + 1_000)
    # the pause over: p/2 is the probe, p/3 waits for it (its lease), not the provider
    assert claim(ledger, "p/2", NOW + 1_100)[0] == "claimed"
    assert dep_fields(ledger)["probe"] == "p/2"
    assert claim(ledger, "p/3", NOW + 1_101) == ("limited", "paused", NOW + 1_100 + LEASE)
    assert ledger.redis.zscore(ledger.keys.due, "p/3") > NOW + 1_100 + LEASE  # type: ignore[operator]
    # the probe succeeds: the calls held back are due now, spread, and the key is open
    done = Transition(ref="p/2", states=(S.RUNNING,), to=S.SUCCEEDED, by="w-p/2", remove_due=True)
    assert ledger.apply([done], NOW + 1_200) == ["ok"]
    dues = [ledger.redis.zscore(ledger.keys.due, r) for r in ("p/1", "p/3")]
    assert all(d is not None and d < NOW + 2_200 for d in dues), dues  # due, at most 1 s on
    assert dep_fields(ledger)["resume"] == "0"
    ledger.redis.hset(ledger.keys.op("p/3"), mapping={"state": "queued"})  # as RELEASE does
    assert claim(ledger, "p/3", NOW + 1_300)[0] == "claimed"


def test_the_breaker_opens_at_its_threshold_and_its_probe_closes_or_reopens_it(
    ledger: Ledger,
) -> None:
    t = limits_table({"stripe": Limits(breaker_failures=2, breaker_window=10, breaker_open=5)})

    def run(ref: str, now: int, signal: str | None) -> str:
        queued(ledger, ref, now=now)
        out = claim(ledger, ref, now, t)
        if out[0] != "claimed":
            return out[1]
        to = S.WAITING_RETRY if signal else S.SUCCEEDED
        tr = Transition(ref=ref, states=(S.RUNNING,), to=to, by=f"w-{ref}",
                        set={"dep_signal": signal} if signal else {})  # fmt: skip
        assert ledger.apply([tr], now + 1) == ["ok"]
        return "ran"

    assert run("b/1", NOW, "failure") == "ran"
    assert run("b/2", NOW + 10, "failure") == "ran"
    assert dep_fields(ledger)["breaker"] == "open"
    assert run("b/3", NOW + 20, None) == "breaker_open"
    # open time over: one probe; it fails: open again
    assert run("b/4", NOW + 5_100, "failure") == "ran"
    assert dep_fields(ledger)["breaker"] == "open"
    assert run("b/5", NOW + 10_200, None) == "ran"
    assert dep_fields(ledger)["breaker"] == "closed"
    assert int(dep_fields(ledger)["n_opened"]) == 2


def test_a_call_past_its_deadline_is_claimed_and_never_held(ledger: Ledger) -> None:
    queued(ledger, "d/1")
    ledger.redis.hset(ledger.keys.dep(KEY), "paused_until", NOW + 10_000_000)
    # the worker's budget check then escalates it (DEADLINE_EXCEEDED), nothing sent
    assert claim(ledger, "d/1", NOW + 3_600_001)[0] == "claimed"


def _commands(client: redis.Redis, run: Any) -> dict[str, int]:
    client.config_resetstat()
    run()
    stats = client.info("commandstats")
    skip = ("cmdstat_config|resetstat", "cmdstat_info")
    return {k: int(v["calls"]) for k, v in stats.items() if k not in skip}


def test_a_call_without_a_key_costs_no_command_more(redis_url: str) -> None:
    """``INFO commandstats`` on the real server: a claim and its record of a call with no
    dependency key run the same commands whether the worker declares limits or not,
    and write no limiter key; a call with one runs the limiter's."""
    client = redis.Redis.from_url(redis_url)
    try:
        ledger = Ledger(client, prefix="dc", durability="none")

        def cycle(ref: str, table: str, dep: bool = False) -> None:
            submit(ledger, ref, extra=(("dep", KEY),) if dep else ())
            assert ledger.claim(ref, 1, "w", NOW + 1, LEASE, limits=table).outcome == "claimed"
            done = Transition(ref=ref, states=(S.RUNNING,), to=S.SUCCEEDED, by="w")
            assert ledger.apply([done], NOW + 2) == ["ok"]

        cycle("warm/1", "")  # loads the library
        plain = _commands(client, lambda: cycle("p/1", ""))
        declared = _commands(client, lambda: cycle("p/2", TABLE))
        assert not list(client.scan_iter(match=ledger.keys.dep_prefix + "*"))
        keyed = _commands(client, lambda: cycle("k/1", TABLE, dep=True))
    finally:
        client.close()

    assert plain == declared
    assert sum(keyed.values()) > sum(plain.values())


def test_a_put_record_with_a_key_in_running_releases_on_any_way_out(ledger: Ledger) -> None:
    put(ledger, "x/1", S.RUNNING, dep=KEY, lease_holder="w")
    ledger.redis.zadd(ledger.keys.dep_slots(KEY), {"x/1": NOW + LEASE})
    back = Transition(ref="x/1", states=(S.RUNNING,), to=S.QUEUED, by="scheduler")
    assert ledger.apply([back], NOW) == ["ok"]
    assert ledger.redis.zcard(ledger.keys.dep_slots(KEY)) == 0
    assert json.loads("[]") == []


def test_a_renewed_lease_renews_the_slot_and_the_probe(ledger: Ledger) -> None:
    queued(ledger, "n/1")
    ledger.redis.hset(ledger.keys.dep(KEY), mapping={"breaker": "open", "open_until": NOW - 1})
    t = limits_table({"stripe": Limits(concurrency=1)})
    assert claim(ledger, "n/1", NOW, t)[0] == "claimed"
    assert ledger.renew(NOW + 10_000, LEASE, [("n/1", 1, "run", "w-n/1")]) == []
    assert ledger.redis.zscore(ledger.keys.dep_slots(KEY), "n/1") == NOW + 10_000 + LEASE
    assert dep_fields(ledger)["probe_until"] == str(NOW + 10_000 + LEASE)


def test_a_held_call_an_operator_retries_is_held_no_more_once_admitted(ledger: Ledger) -> None:
    queued(ledger, "h/1")
    ledger.redis.hset(ledger.keys.dep(KEY), "paused_until", NOW + 100)
    assert claim(ledger, "h/1", NOW)[:2] == ("limited", "paused")
    # an operator's retry now: queued again, a new attempt, dep_held left on the record
    ledger.redis.hset(ledger.keys.op("h/1"), mapping={"state": "queued", "attempt": 2})
    c = ledger.claim("h/1", 2, "w", NOW + 200, LEASE, limits=TABLE)
    assert c.outcome.value == "claimed"
    assert ledger.fields("h/1", "dep_held") == {}
