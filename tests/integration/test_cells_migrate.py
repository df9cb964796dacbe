"""``toolq cells migrate`` (issue 18): a single-tag ledger with operations in every
state moved into cells on its server, and then working in cells mode."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from tests.contract.ops import LEASE, NOW, TOOL, single_tag_ledger
from toolq.adapters.ledger import Ledger
from toolq.adapters.ledger.migrate import to_cells
from toolq.core import errors
from toolq.core.cells import cell_of
from toolq.core.keys import Keys
from toolq.core.states import PENDING_RECOVERY, State
from toolq.edges.cli import main

CELLS = 8
OLD = Keys("toolq")


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_a_ledger_in_every_state_moves_into_cells_and_works_there(client: redis.Redis) -> None:
    old_ledger, refs = single_tag_ledger(client)
    records = {ref: client.hgetall(OLD.op(ref)) for ref in refs}
    due = dict(client.zrange(OLD.due, 0, -1, withscores=True))
    indexes = {
        state: dict(client.zrange(OLD.index(TOOL, state), 0, -1, withscores=True))
        for state in State
    }
    stats = client.hgetall(OLD.stats)
    assert stats and client.smembers(OLD.tools) == {TOOL.encode()}

    moved = to_cells(client, "toolq", CELLS, NOW)

    assert (moved.records, moved.due, moved.indexes) == (len(refs), len(due), len(State))
    assert sorted(client.keys("{toolq}:*")) == [OLD.meta.encode()]  # nothing left behind
    assert client.hget(OLD.meta, "cells") == b"8"
    for ref in refs:
        keys = Keys("toolq", cell_of(ref, CELLS))
        assert client.hgetall(keys.op(ref)) == records[ref]
    assert client.ttl(Keys("toolq", cell_of(refs[-1], CELLS)).op(refs[-1])) > 3000
    for member, score in due.items():
        ref = member.decode()
        assert client.zscore(Keys("toolq", cell_of(ref, CELLS)).due, ref) == score
    for state, members in indexes.items():
        for member, score in members.items():
            ref = member.decode()
            index = Keys("toolq", cell_of(ref, CELLS)).index(TOOL, state)
            assert client.zscore(index, ref) == score
    assert client.hgetall(Keys("toolq", 0).stats) == stats

    # The ledger in cells mode finds every operation, claims, and its scheduler's
    # claim finds what is due, in every cell.
    ledger = Ledger(client, "toolq", "none", cells=CELLS)
    ledger.record_cells()
    assert ledger.stats() == {k.decode(): int(v) for k, v in stats.items()}
    for ref in refs:
        record = ledger.get(ref)
        assert record is not None and record.operation_ref == ref
    assert ledger.claim(refs[2], 1, "worker-2", NOW, LEASE).outcome == "claimed"
    assert ledger.claim(refs[0], 1, "worker-2", NOW, LEASE).outcome == "held"
    taken = {
        row["ref"]
        for rows in ledger.claim_due_cells(range(CELLS), NOW + 120_000, 100, 5_000)
        for row in rows
    }
    assert taken >= set(refs[3:6]) | {f"mig/put/{s}" for s in PENDING_RECOVERY}
    assert ledger.tools() == [TOOL]
    assert old_ledger.get(refs[0]) is None  # a process left on one tag finds nothing...
    with pytest.raises(errors.RequestRefused, match="has no TOOLQ_CELLS: set TOOLQ_CELLS=8"):
        old_ledger.record_cells()  # ...and is refused where it starts (App.ledger, tq.aio)


def test_a_second_run_finds_the_ledger_moved_and_another_number_is_refused(
    client: redis.Redis,
) -> None:
    single_tag_ledger(client)
    assert not to_cells(client, "toolq", CELLS, NOW).already
    assert to_cells(client, "toolq", CELLS, NOW).already
    with pytest.raises(errors.RequestRefused, match="lives in 8 cells, not 16"):
        to_cells(client, "toolq", 16, NOW)


def test_it_refuses_while_a_writer_beats_or_the_outbox_holds_messages(
    client: redis.Redis,
) -> None:
    single_tag_ledger(client)
    client.hset(OLD.schedulers, "host:1:abc", NOW - 1_000)
    with pytest.raises(errors.RequestRefused, match="scheduler host:1:abc"):
        to_cells(client, "toolq", CELLS, NOW)
    client.hdel(OLD.schedulers, "host:1:abc")
    client.hset(OLD.relays, "relay-1", json.dumps({"at": NOW, "published": 0, "lag_ms": 0}))
    with pytest.raises(errors.RequestRefused, match="relay relay-1"):
        to_cells(client, "toolq", CELLS, NOW)
    client.delete(OLD.relays)
    client.xadd(OLD.outbox, {"queue": "q", "message": "m"})
    with pytest.raises(errors.RequestRefused, match="outbox still holds"):
        to_cells(client, "toolq", CELLS, NOW)
    assert client.exists(OLD.op("mig/submitted/0"))  # nothing moved


def test_the_command_moves_and_says_what_it_did(client: redis.Redis, redis_url: str) -> None:
    single_tag_ledger(client)
    runner = CliRunner()
    args = ["cells", "migrate", "--redis-url", redis_url, "--cells", str(CELLS)]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert "into 8 cells" in result.output and "TOOLQ_CELLS=8" in result.output
    again = runner.invoke(main, [*args[:-1], "16"])
    assert again.exit_code == 2
    assert "lives in 8 cells, not 16" in again.output
