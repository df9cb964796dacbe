"""The ledger counts the time spent in each pending-recovery state when an operation
leaves it (toolq.core.stats), on fakeredis and on the real server."""

from __future__ import annotations

import pytest
import redis

from tests.contract.ops import LEASE, NOW, TOOL, put, submit
from toolq.adapters.ledger import Ledger
from toolq.core.states import PENDING_RECOVERY, State
from toolq.core.stats import is_recovery_field
from toolq.decisions.recovery.transition import Transition

S = State


def times(ledger: Ledger) -> dict[str, int]:
    return {
        k.partition("|")[2]: v
        for k, v in ledger.stats().items()
        if is_recovery_field(k.partition("|")[2])
    }


def test_a_call_that_never_enters_recovery_counts_no_time(ledger: Ledger) -> None:
    submit(ledger, "t/1")
    assert ledger.claim("t/1", 1, "w1", NOW + 10, LEASE).outcome == "claimed"
    done = Transition(ref="t/1", states=(S.RUNNING,), to=S.SUCCEEDED, by="w1", remove_due=True)
    assert ledger.apply([done], NOW + 20) == ["ok"]

    assert times(ledger) == {}


@pytest.mark.parametrize("state", PENDING_RECOVERY, ids=str)
@pytest.mark.parametrize(
    ("spent_ms", "bucket"),
    [(0, "100"), (100, "100"), (101, "500"), (4_900, "5000"), (700_000_000, "inf")],
)
def test_leaving_a_recovery_state_counts_its_time_in_one_bucket_and_the_sum(
    ledger: Ledger, state: State, spent_ms: int, bucket: str
) -> None:
    put(ledger, "t/2", state, entered=NOW)
    out = Transition(ref="t/2", states=(state,), to=S.ESCALATED, by="scheduler")

    assert ledger.apply([out], NOW + spent_ms) == ["ok"]

    assert times(ledger) == {
        f"recovery_ms:{state}:{bucket}": 1,
        f"recovery_ms:{state}:sum": spent_ms,
    }


def test_staying_in_a_state_counts_nothing_and_a_batch_counts_each(ledger: Ledger) -> None:
    for i in range(3):
        put(ledger, f"b/{i}", S.WAITING_RETRY, entered=NOW)
    put(ledger, "v/1", S.VERIFYING, entered=NOW)
    recheck = Transition(ref="v/1", states=(S.VERIFYING,), to=S.VERIFYING, by="v", quiet=True)
    again = Transition(ref="v/1", states=(S.VERIFYING,), to=S.VERIFYING, by="operator")
    # the scheduler's batch: every item of one call (the buffered writes)
    batch = [
        Transition(ref=f"b/{i}", states=(S.WAITING_RETRY,), to=S.QUEUED, by="scheduler")
        for i in range(3)
    ]

    assert ledger.apply([recheck, again, *batch], NOW + 2_000) == ["ok"] * 5

    assert times(ledger) == {
        "recovery_ms:waiting_retry:2500": 3,
        "recovery_ms:waiting_retry:sum": 6_000,
    }
    # verifying's clock did not restart: leaving it later counts from when it entered
    found = Transition(ref="v/1", states=(S.VERIFYING,), to=S.SUCCEEDED, by="v")
    assert ledger.apply([found], NOW + 40_000) == ["ok"]
    assert times(ledger)["recovery_ms:verifying:60000"] == 1


def test_the_tool_is_the_records(ledger: Ledger) -> None:
    put(ledger, "o/1", S.NEEDS_INPUT, tool="other", entered=NOW)
    out = Transition(ref="o/1", states=(S.NEEDS_INPUT,), to=S.QUEUED, by="operator")

    assert ledger.apply([out], NOW + 50) == ["ok"]
    assert ledger.stats()["other|recovery_ms:needs_input:100"] == 1
    assert not any(k.startswith(f"{TOOL}|") for k in ledger.stats())


def _commands(client: redis.Redis, ledger: Ledger, ref: str, state: State) -> dict[str, int]:
    """The server's commands for one APPLY moving ``ref`` from ``state`` to escalated."""
    put(ledger, ref, state, entered=NOW)
    client.config_resetstat()
    out = Transition(ref=ref, states=(state,), to=S.ESCALATED, by="t", stats=("escalated",))
    assert ledger.apply([out], NOW + 1_000) == ["ok"]
    stats = client.info("commandstats")
    skip = ("cmdstat_config|resetstat", "cmdstat_info")
    return {k: int(v["calls"]) for k, v in stats.items() if k not in skip}


def test_only_a_move_out_of_recovery_costs_more_commands(redis_url: str) -> None:
    """``INFO commandstats`` on the real server: a move from ``running`` (every call's)
    reads nothing more; one out of a recovery state reads ``entered`` and counts twice."""
    client = redis.Redis.from_url(redis_url)
    try:
        ledger = Ledger(client, prefix="rt")
        _commands(client, ledger, "warm/1", S.RUNNING)  # loads the library
        hot = _commands(client, ledger, "hot/1", S.RUNNING)
        recovered = _commands(client, ledger, "rec/1", S.VERIFYING)
    finally:
        client.close()

    assert "cmdstat_hget" not in hot
    assert recovered.pop("cmdstat_hget") == 1
    assert recovered.pop("cmdstat_hincrby") == hot.pop("cmdstat_hincrby") + 2
    assert recovered == hot
