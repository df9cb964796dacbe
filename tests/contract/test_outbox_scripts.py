"""Outbox mode in the ledger's scripts (issue 18): a message goes to the outbox stream,
with its queue's name, in the same call as the transition; nothing is pushed to a
queue. Runs on fakeredis and on the real server, as functions and as scripts."""

from __future__ import annotations

import pytest
import redis

from tests.contract.ops import NOW, QUEUE, submit
from toolq.adapters.ledger import Ledger
from toolq.core.layout import Layout
from toolq.core.states import State as S
from toolq.decisions.recovery.transition import Transition


@pytest.fixture
def outbox_ledger(ledger: Ledger, layout: Layout) -> Ledger:
    """The contract's ledger (functions or scripts, in its layout) in outbox mode."""
    boxed = Ledger(ledger.redis, prefix=layout.prefix, outbox=True, cells=layout.cells)
    if layout.cells is not None:  # the cell every ref of a test is in (conftest)
        boxed = boxed.in_cell(0)
    boxed.scripts.functions = ledger.scripts.functions
    return boxed


def entries(ledger: Ledger) -> list[tuple[str, str]]:
    rows = ledger.redis.xrange(ledger.keys.outbox)
    return [(f[b"queue"].decode(), f[b"message"].decode()) for _, f in rows]


def test_a_submit_appends_its_message_to_the_outbox_and_pushes_nothing(
    outbox_ledger: Ledger, layout: Layout
) -> None:
    assert submit(outbox_ledger, "o/1").outcome == "created"
    assert entries(outbox_ledger) == [(QUEUE, "run o/1")]
    assert not outbox_ledger.redis.exists(QUEUE)
    # and the outbox is declared, tagged as every ledger key: one slot with the record
    keys, _ = outbox_ledger.calls.submit(
        ref="o/1", tool="t", args_json="{}", fp="f", call_id="", now_ms=NOW, max_attempts=1,
        deadline_ms=0, state=S.QUEUED, due_ms=NOW, queue=QUEUE, message="m",
    )  # fmt: skip
    tagged = "{tq}:outbox" if layout.cells is None else "{tq:c000}:outbox"
    assert keys[-1] == outbox_ledger.keys.outbox == tagged
    assert QUEUE not in keys


def test_a_submit_that_sends_nothing_adds_no_entry(outbox_ledger: Ledger) -> None:
    submit(outbox_ledger, "o/2", state=S.AWAITING_APPROVAL)
    assert entries(outbox_ledger) == []


def test_apply_appends_each_message_with_its_queue_single_and_batched(
    outbox_ledger: Ledger,
) -> None:
    for ref in ("a/1", "a/2", "a/3"):
        submit(outbox_ledger, ref, state=S.AWAITING_APPROVAL)

    def approve(ref: str, queue: str) -> Transition:
        return Transition(
            ref=ref, states=(S.AWAITING_APPROVAL,), to=S.QUEUED, by="op", push=(queue, f"run {ref}")
        )

    # one item (a worker's call: written at once) and a batch (the scheduler's: buffered)
    assert outbox_ledger.apply([approve("a/1", QUEUE)], NOW) == ["ok"]
    assert outbox_ledger.apply([approve("a/2", "tq.other"), approve("a/3", QUEUE)], NOW) == [
        "ok",
        "ok",
    ]
    assert entries(outbox_ledger) == [
        (QUEUE, "run a/1"),
        ("tq.other", "run a/2"),
        (QUEUE, "run a/3"),
    ]
    assert not outbox_ledger.redis.exists(QUEUE, "tq.other")
    keys, _ = outbox_ledger.calls.apply([approve("a/2", "tq.other"), approve("a/3", QUEUE)], NOW)
    assert keys.count(outbox_ledger.keys.outbox) == 1 and QUEUE not in keys


def test_a_refused_transition_adds_no_entry(outbox_ledger: Ledger) -> None:
    submit(outbox_ledger, "r/1")
    before = entries(outbox_ledger)
    t = Transition(ref="r/1", states=(S.WAITING_RETRY,), to=S.QUEUED, by="t", push=(QUEUE, "m"))
    assert outbox_ledger.apply([t], NOW) == ["queued"]
    assert entries(outbox_ledger) == before


def test_without_a_broker_url_the_scripts_push_as_before(ledger: Ledger) -> None:
    submit(ledger, "d/1")
    assert ledger.redis.lrange(QUEUE, 0, -1) == [b"run d/1"]
    assert not ledger.redis.exists(ledger.keys.outbox)


def _commands(client: redis.Redis, ledger: Ledger, ref: str) -> dict[str, int]:
    """The commands a submit and an approval's APPLY of ``ref`` cost the server."""
    submit(ledger, ref, state=S.AWAITING_APPROVAL)
    t = Transition(
        ref=ref, states=(S.AWAITING_APPROVAL,), to=S.QUEUED, by="op", push=(QUEUE, f"run {ref}")
    )
    client.config_resetstat()
    submit(ledger, ref + "+")
    ledger.apply([t], NOW)
    stats = client.info("commandstats")
    skip = ("cmdstat_config|resetstat", "cmdstat_info")
    return {k: int(v["calls"]) for k, v in stats.items() if k not in skip}


def test_the_outbox_changes_which_command_a_message_costs_not_how_many(redis_url: str) -> None:
    """``INFO commandstats`` on the real server: LPUSH becomes XADD, one for one."""
    client = redis.Redis.from_url(redis_url)
    try:
        pushed = _commands(client, Ledger(client, prefix="cs"), "c/1")
        boxed = _commands(client, Ledger(client, prefix="cs", outbox=True), "c/2")
    finally:
        client.close()
    assert pushed.pop("cmdstat_lpush") == 2 and "cmdstat_xadd" not in pushed
    assert boxed.pop("cmdstat_xadd") == 2 and "cmdstat_lpush" not in boxed
    assert boxed == pushed


def test_the_async_ledger_writes_the_outbox_as_the_sync_one_does() -> None:
    import asyncio

    import fakeredis
    import fakeredis.aioredis

    from toolq.adapters.ledger.aio import AsyncLedger

    server = fakeredis.FakeServer()
    sync = fakeredis.FakeRedis(server=server)
    boxed = Ledger(sync, prefix="tq", outbox=True)
    again = Transition(
        ref="x/1", states=(S.QUEUED,), to=S.QUEUED, by="op", quiet=True, push=(QUEUE, "again x/1")
    )

    async def main() -> None:
        client = fakeredis.aioredis.FakeRedis(server=server)
        ledger = AsyncLedger(client, prefix="tq", outbox=True)
        await ledger.submit(
            ref="x/1", tool="t", args_json="{}", fp="f", call_id="", now_ms=NOW, max_attempts=3,
            deadline_ms=NOW + 60_000, state=S.QUEUED, due_ms=NOW + 1000, queue=QUEUE,
            message="run x/1",
        )  # fmt: skip
        assert await ledger.apply([again], NOW) == ["ok"]
        await client.aclose()

    asyncio.run(main())
    assert entries(boxed) == [(QUEUE, "run x/1"), (QUEUE, "again x/1")]
    assert not sync.exists(QUEUE)
