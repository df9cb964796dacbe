"""Upgrades keep the data (issue 31): a ledger written by each earlier format
(``tests/data/ledgers/format-<n>.json``, made by ``make.py`` there from the commit
that wrote it) is refused by today's processes with the command to run, migrated by
``toolq migrate``, and then finished by real workers and a scheduler."""

from __future__ import annotations

import json
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from tests.helpers import (
    start_scheduler,
    start_toolq,
    start_worker,
    stop_process,
    stop_processes,
    wait_until,
)
from tests.integration.apps import legacy_app
from tests.integration.apps.legacy_app import APP, calls
from toolq import State, ToolQueue
from toolq.adapters.ledger import Ledger
from toolq.adapters.ledger.upgrade import STEP_RUNNERS, Migration
from toolq.core import errors
from toolq.core.keys import Keys
from toolq.decisions.formats import FORMAT
from toolq.edges.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "ledgers"
FORMATS = sorted(int(p.stem.split("-")[1]) for p in DATA.glob("format-*.json"))
NEW = Keys("toolq")


def readme_commands() -> list[list[str]]:
    """The commands the README's "Upgrading" section shows (run below, not copied)."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text.split("\n## Upgrading\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    return [shlex.split(line) for line in block.splitlines() if line.strip()]


def test_the_readme_shows_a_dry_run_then_the_migration() -> None:
    assert readme_commands() == [["toolq", "migrate", "--dry-run"], ["toolq", "migrate"]]


def test_there_is_a_ledger_of_every_earlier_format() -> None:
    assert list(range(1, FORMAT)) == FORMATS


def dump_of(fmt: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((DATA / f"format-{fmt}.json").read_text())
    assert data["format"] == fmt
    return data


def load(client: redis.Redis, keys: dict[str, Any]) -> None:
    """Write a dump's keys (``make.py``'s ``dump``) into ``client``'s database."""
    pipe = client.pipeline(transaction=False)
    for key, k in keys.items():
        kind, value = k["type"], k["value"]
        if kind == "string":
            pipe.set(key, value)
        elif kind == "hash":
            pipe.hset(key, mapping=value)
        elif kind == "list":
            pipe.rpush(key, *value)
        elif kind == "set":
            pipe.sadd(key, *value)
        elif kind == "zset":
            pipe.zadd(key, {m: s for m, s in value})
        if k["pttl"] > 0:
            pipe.pexpire(key, k["pttl"])
    pipe.execute()


def snapshot(client: redis.Redis) -> dict[bytes, Any]:
    """Every key's type and value (what a dry run must leave as it found)."""
    out: dict[bytes, Any] = {}
    for key in client.scan_iter(count=1000):
        kind = client.type(key)
        if kind == b"hash":
            out[key] = client.hgetall(key)
        elif kind == b"list":
            out[key] = client.lrange(key, 0, -1)
        elif kind == b"zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        elif kind == b"set":
            out[key] = client.smembers(key)
        else:
            out[key] = client.get(key)
    return out


def old_name(fmt: int, key: str) -> str:
    """A format-3 key's name in ``fmt`` (``{toolq}:due`` -> ``toolq:due`` in format 1)."""
    return key.replace("{toolq}", "toolq") if fmt == 1 else key


def entry_tuple(raw: dict[str, Any]) -> tuple[Any, ...]:
    return (
        int(raw["at"]),
        raw.get("from"),
        raw["to"],
        int(raw.get("attempt") or 0),
        raw.get("by") or "",
        raw.get("code"),
    )


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


@pytest.fixture
def tq(redis_url: str) -> Iterator[ToolQueue]:
    app = legacy_app.tq
    app.configure(redis_url=redis_url)
    yield app
    app.close()


def migrate_cli(redis_url: str, *more: str) -> str:
    result = CliRunner().invoke(main, ["migrate", "--redis-url", redis_url, *more])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_ledger_of_an_earlier_format_migrates_whole_and_its_work_finishes(
    fmt: int, client: redis.Redis, redis_url: str, tq: ToolQueue
) -> None:
    # Given a ledger an earlier toolq wrote
    data = dump_of(fmt)
    old = data["keys"]
    load(client, old)

    # Then today's processes refuse it, naming the command to run
    with pytest.raises(errors.LedgerFormat, match=f"in format {fmt} .*`toolq migrate`"):
        Ledger(client, "toolq").record_cells()
    show = CliRunner().invoke(
        main, ["show", "legacy/succeeded", "--app", APP, "--redis-url", redis_url]
    )
    assert show.exit_code != 0 and "toolq migrate" in show.output, show.output
    for light in (["show", "legacy/succeeded"], ["status"]):  # the no-app reads too
        said = CliRunner().invoke(main, [*light, "--redis-url", redis_url])
        assert said.exit_code != 0 and "toolq migrate" in said.output, said.output
    for process in ("worker", "scheduler"):  # each exits at once, saying so
        p = start_toolq([process, "--app", APP, "--redis-url", redis_url], stderr=subprocess.PIPE)
        try:
            _, err = p.communicate(timeout=60)
        finally:
            stop_process(p, timeout=5)
        assert p.returncode != 0 and b"toolq migrate" in err, err

    # When a dry run looks first (the README's commands): it says what it would do
    # and changes nothing
    dry_run, run = (command[1:] for command in readme_commands())
    before = snapshot(client)
    said = migrate_cli(redis_url, *dry_run[1:])
    assert f"was in format {fmt}" in said and "dry run: nothing was changed" in said, said
    assert snapshot(client) == before

    # When it runs
    said = migrate_cli(redis_url, *run[1:])
    assert f"was in format {fmt}" in said and f"is now in format {FORMAT}" in said, said
    assert "8 histories" in said
    assert client.hget(NEW.meta, "format") == str(FORMAT).encode()
    assert not [k for k in client.scan_iter(match="toolq:*")]  # nothing left untagged
    assert not [k for k in client.scan_iter(match="{toolq}:hist:*")]  # no history list
    migrated = snapshot(client)
    assert "already" in migrate_cli(redis_url)  # a second run is a no-op
    assert "already" in migrate_cli(redis_url, "--dry-run")
    assert snapshot(client) == migrated

    # Then every record, its history, state, indexes, due set and counters are intact
    for name, state in data["states"].items():
        ref = f"legacy/{name}"
        stored = {k.decode(): v.decode() for k, v in client.hgetall(NEW.op(ref)).items()}
        was = old[old_name(fmt, NEW.op(ref))]
        assert {k: v for k, v in stored.items() if k[0] != "h"} == was["value"]
        history = old[old_name(fmt, NEW.op(ref).replace(":op:", ":hist:"))]["value"]
        record = tq.get(ref)
        assert record is not None and record.state == State(state)
        assert [
            (h.at, h.from_ and h.from_.value, h.to.value, h.attempt, h.by, h.code)
            for h in record.history
        ] == [entry_tuple(json.loads(e)) for e in history]
        if was["pttl"] > 0:  # a settled record keeps its retention
            assert 0 < client.pttl(NEW.op(ref)) <= was["pttl"]
    for key in [k for k in old if ":idx:" in k or k.endswith((":due", ":stats", ":tools"))]:
        new = key if fmt == 2 else key.replace("toolq:", "{toolq}:", 1)
        assert snapshot(client)[new.encode()] == before[key.encode()], key

    # When real workers and a scheduler start on it (and an operator approves)
    procs = [start_worker(APP, redis_url), start_scheduler(APP, redis_url)]
    try:
        assert tq.approve("legacy/approval") == State.QUEUED
        for name in ("queued-1", "queued-2", "retry", "verify", "approval"):
            env = tq.wait(f"legacy/{name}", timeout=60)
            assert env.ok, (name, env)
        # every message the earlier version queued has been taken
        assert wait_until(lambda: client.llen("toolq.calls") == 0, 30)
    finally:
        stop_processes(procs, timeout=10)

    # Then each queued operation ran once, the uncertain write was verified (not run
    # again), and what had settled stayed as it was
    ran = {name: calls(client, f"legacy/{name}") for name in data["states"]}
    assert ran == {
        "succeeded": 0,
        "queued-1": 1,
        "queued-2": 1,
        "retry": 1,
        "verify": 0,
        "escalated": 0,
        "failed": 0,
        "approval": 1,
    }
    for name in ("succeeded", "escalated", "failed"):
        record = tq.get(f"legacy/{name}")
        assert record is not None and record.state == State(data["states"][name])
    verified = tq.get("legacy/verify")
    assert verified is not None and verified.history[-1].to == State.SUCCEEDED


def test_an_interrupted_migration_is_refused_until_a_second_run_finishes_it(
    client: redis.Redis, redis_url: str
) -> None:
    data = dump_of(1)
    load(client, data["keys"])
    # Given a run that stopped after its first step (keys renamed, histories still lists)
    STEP_RUNNERS[1](client, Migration("toolq", 1, dry_run=False), lambda _line: None)
    with pytest.raises(errors.LedgerFormat, match="in format 2"):
        Ledger(client, "toolq").record_cells()
    # When it is run again: it finishes
    said = migrate_cli(redis_url)
    assert "was in format 2" in said and "8 histories" in said, said
    Ledger(client, "toolq").record_cells()
    record = Ledger(client, "toolq").get("legacy/retry")
    assert record is not None and record.state == State.WAITING_RETRY
    assert len(record.history) == 3


def test_it_refuses_while_a_scheduler_beats_unless_forced(
    client: redis.Redis, redis_url: str
) -> None:
    load(client, dump_of(2)["keys"])
    client.hset(NEW.schedulers, "host:1:abc", int(__import__("time").time() * 1000))
    refused = CliRunner().invoke(main, ["migrate", "--redis-url", redis_url])
    assert refused.exit_code != 0 and "scheduler host:1:abc" in refused.output
    assert client.exists("{toolq}:hist:legacy/retry")  # nothing moved
    assert "is now in format" in migrate_cli(redis_url, "--force")


def test_a_newer_format_is_refused_by_processes_and_by_migrate(
    client: redis.Redis, redis_url: str
) -> None:
    client.hset(NEW.meta, "format", FORMAT + 1)
    with pytest.raises(errors.LedgerFormat, match="upgrade toolq"):
        Ledger(client, "toolq").record_cells()
    result = CliRunner().invoke(main, ["migrate", "--redis-url", redis_url])
    assert result.exit_code != 0 and "upgrade toolq" in result.output, result.output


def test_cells_migrate_refuses_a_ledger_of_an_earlier_format(
    client: redis.Redis, redis_url: str
) -> None:
    load(client, dump_of(2)["keys"])
    result = CliRunner().invoke(
        main, ["cells", "migrate", "--redis-url", redis_url, "--cells", "4"]
    )
    assert result.exit_code != 0 and "toolq migrate" in result.output, result.output
    assert client.exists("{toolq}:op:legacy/retry")  # nothing moved
