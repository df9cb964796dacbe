"""``toolq status`` and ``toolq schema`` against a real server."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from pydantic import BaseModel

from toolq.adapters.liveness import WorkerNode
from toolq.client.queue import ToolQueue
from toolq.core.states import State
from toolq.core.tools import CallContext
from toolq.decisions.recovery.transition import Transition
from toolq.edges.cli import main
from toolq.edges.cli import monitor as cli_monitor
from toolq.edges.monitor import STATES, status_snapshot

APP = "toolq_status_test_app:tq"
T0 = 1_700_000_000.0  # the fake clock's start (s)


class Invoice(BaseModel):
    amount: int


class Refund(BaseModel):
    payment: str


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tq(redis_url: str, clock: Clock, monkeypatch: pytest.MonkeyPatch) -> Iterator[ToolQueue]:
    """An app with three tools, importable as ``--app toolq_status_test_app:tq``."""
    queue = ToolQueue(redis_url=redis_url, clock=clock)

    @queue.tool(writes=True)
    def create_invoice(args: Invoice, ctx: CallContext) -> dict[str, int]:
        return {"amount": args.amount}

    @queue.tool(writes=True, requires_approval=True)
    def refund_payment(args: Refund, ctx: CallContext) -> dict[str, str]:
        return {"payment": args.payment}

    @queue.tool(writes=False)
    def lookup(args: Refund, ctx: CallContext) -> dict[str, str]:
        return {}

    module = types.ModuleType("toolq_status_test_app")
    module.tq = queue  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "toolq_status_test_app", module)
    yield queue
    queue.close()


def _populate(tq: ToolQueue, clock: Clock) -> None:
    """inv/0 queued, inv/1 waiting_retry, inv/2 verifying, inv/3 needs_input, inv/4 running;
    two refunds awaiting approval; one lookup cancelled."""
    for i in range(5):
        tq.submit("create_invoice", {"amount": i}, operation_ref=f"inv/{i}")
        clock.now += 1
    for i in range(2):
        tq.submit("refund_payment", {"payment": f"p{i}"}, operation_ref=f"refund/{i}")
    tq.submit("lookup", {"payment": "p0"}, operation_ref="look/0")
    tq.cancel("look/0")
    clock.now += 10  # T0 + 15
    now_ms = int(clock.now * 1000)
    moves = {"inv/1": State.WAITING_RETRY, "inv/2": State.VERIFYING, "inv/3": State.NEEDS_INPUT}
    for ref in ("inv/1", "inv/2", "inv/3", "inv/4"):
        assert tq.ledger.claim(ref, 1, "worker-1", now_ms, 15_000).outcome == "claimed"
    for ref, to in moves.items():
        t = Transition(ref=ref, states=(State.RUNNING,), to=to, by="test", due_ms=now_ms + 5000)
        assert tq.ledger.apply_one(t, now_ms) == "ok"
    clock.now += 45  # T0 + 60: the moved ones entered their state 45 s ago


def _status(*args: str, redis_url: str) -> dict[str, object]:
    result = CliRunner().invoke(
        cli_monitor.status, ["--app", APP, "--redis-url", redis_url, "--no-workers", *args]
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.output)  # type: ignore[no-any-return]


def test_status_json_counts_every_state_and_ages_pending_recovery(
    tq: ToolQueue, clock: Clock, redis_url: str
) -> None:
    _populate(tq, clock)

    snap: dict[str, object] = _status("--json", redis_url=redis_url)

    tools = snap["tools"]
    assert isinstance(tools, dict)
    inv = tools["create_invoice"]
    assert inv["states"] == {
        **dict.fromkeys(STATES, 0),
        "queued": 1, "running": 1, "waiting_retry": 1, "verifying": 1, "needs_input": 1,
    }  # fmt: skip
    assert inv["pending_recovery"] == 3
    for state in ("waiting_retry", "verifying", "needs_input"):
        assert inv["oldest"][state]["age_s"] == 45.0
    assert inv["oldest"]["queued"] == {
        "ref": "inv/0", "since": "2023-11-14T22:13:20.000+00:00", "age_s": 60.0,
    }  # fmt: skip
    refunds = tools["refund_payment"]
    assert refunds["states"]["awaiting_approval"] == 2
    assert refunds["oldest"]["awaiting_approval"]["age_s"] == 55.0
    assert tools["lookup"]["states"]["cancelled"] == 1
    assert tools["lookup"]["counters"]["cancelled"] == 1
    assert inv["counters"]["submitted"] == 5

    # The oldest per state across tools: inv/0 was submitted at T0, the refunds at T0 + 5,
    # inv/1-4 were claimed (and three of them moved) at T0 + 15; it is T0 + 60 now.
    def oldest(tool: str, ref: str, since: str, age_s: float) -> dict[str, object]:
        return {"tool": tool, "ref": ref, "since": f"2023-11-14T22:13:{since}.000+00:00",
                "age_s": age_s}  # fmt: skip

    assert snap["totals"] == {
        "states": {**dict.fromkeys(STATES, 0), "queued": 1, "running": 1, "waiting_retry": 1,
                   "verifying": 1, "needs_input": 1, "awaiting_approval": 2, "cancelled": 1},
        "pending_recovery": 5,
        "oldest": {
            "queued": oldest("create_invoice", "inv/0", "20", 60.0),
            "running": oldest("create_invoice", "inv/4", "35", 45.0),
            "waiting_retry": oldest("create_invoice", "inv/1", "35", 45.0),
            "verifying": oldest("create_invoice", "inv/2", "35", 45.0),
            "needs_input": oldest("create_invoice", "inv/3", "35", 45.0),
            "awaiting_approval": oldest("refund_payment", "refund/0", "25", 55.0),
        },
    }  # fmt: skip
    # Every queued submit published a message; nothing has consumed one.
    never = {"last_beat_ms": None, "age_s": None, "alive": False}  # no worker ever beat
    assert snap["queues"] == {
        "depth": {"toolq.calls": 6, "toolq.verify": 0},
        "unacked": 0,
        "workers": {"toolq.calls": never, "toolq.verify": never},
    }
    scheduler = snap["scheduler"]
    assert isinstance(scheduler, dict)
    assert scheduler["backlog"] == 7  # every unfinished operation
    # Due by now: the moved ones (5 s after their move), inv/4's lease (15 s after its claim)
    # and inv/0's unclaimed-message check (60 s after its submit); not the approvals.
    assert scheduler["due_now"] == 5
    assert scheduler["live"] == 0
    assert snap["workers"] == {"checked": False}


def test_status_prints_a_table(tq: ToolQueue, clock: Clock, redis_url: str) -> None:
    _populate(tq, clock)

    result = CliRunner().invoke(
        cli_monitor.status, ["--app", APP, "--redis-url", redis_url, "--no-workers"]
    )

    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if line.startswith("create_invoice"))
    assert "1 (45s)" in row
    assert "refund_payment" in result.output
    assert "toolq.calls 6" in result.output
    assert "backlog 7" in result.output


def test_workers_are_found_by_a_short_ping_when_asked(tq: ToolQueue) -> None:
    snap = status_snapshot(tq, ping=True, worker_timeout=0.2)

    assert snap["workers"] == {"checked": True, "live": 0, "names": []}


def test_workers_come_from_their_heartbeats_by_default(tq: ToolQueue, clock: Clock) -> None:
    now = int(clock() * 1000)
    live = WorkerNode("celery@a", 11, "prefork", 4, ("toolq.calls",), now - 60_000, now - 2_000)
    dead = WorkerNode("celery@b", 12, "threads", 8, ("toolq.verify",), now - 90_000, now - 60_000)
    tq.redis.hset(tq.ledger.keys.worker_nodes, mapping={n.field: n.to_json() for n in (live, dead)})

    workers = status_snapshot(tq)["workers"]

    assert (workers["source"], workers["live"], workers["names"]) == ("heartbeats", 1, ["celery@a"])
    assert [(w["node"], w["alive"], w["age_s"]) for w in workers["nodes"]] == [
        ("celery@a", True, 2.0),
    ]
    assert [(w["node"], w["age_s"], w["gone_since"]) for w in workers["gone"]] == [
        (
            "celery@b",
            60.0,
            datetime.fromtimestamp(now / 1000 - 60, UTC).isoformat("T", "milliseconds"),
        ),
    ]
    shown = cli_monitor.render_status(status_snapshot(tq))
    assert "workers     live 1  (celery@a)  gone 1 (the latest beat 1m00s ago)" in shown


def test_status_without_an_app_reads_the_ledger_with_the_env_settings(
    tq: ToolQueue, clock: Clock, redis_url: str
) -> None:
    _populate(tq, clock)

    result = CliRunner().invoke(main, ["status", "--redis-url", redis_url, "--json"])

    assert result.exit_code == 0, result.output
    snap = json.loads(result.output)
    assert sorted(snap["tools"]) == ["create_invoice", "lookup", "refund_payment"]
    assert snap["totals"]["states"]["awaiting_approval"] == 2
    assert snap["workers"]["source"] == "heartbeats"


def test_status_without_a_server_says_so_in_one_line(tq: ToolQueue) -> None:
    result = CliRunner().invoke(main, ["status", "--redis-url", "redis://127.0.0.1:1/0"])

    assert result.exit_code == 2
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    "args",
    [["status"], ["show", "op_1"], ["list"], ["worker"]],
    ids=lambda args: args[0],
)
def test_a_server_that_refuses_the_first_command_is_named_in_its_words(
    valkey: str, args: list[str]
) -> None:
    # A database the server does not have: it answers, it refuses (not "cannot reach")
    url = f"{str(valkey).rsplit('/', 1)[0]}/99999"
    result = CliRunner().invoke(main, [*args, "--redis-url", url])
    assert result.exit_code == 2, result.output
    assert "ResponseError: DB index is out of range" in result.output
    assert "cannot reach" not in result.output


def test_watch_refreshes_until_ctrl_c(
    tq: ToolQueue, clock: Clock, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _populate(tq, clock)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli_monitor, "_pause", sleep)
    args = ["--app", APP, "--redis-url", redis_url, "--no-workers", "--watch", "--json"]

    result = CliRunner().invoke(cli_monitor.status, [*args, "--interval", "0.5"])

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) == 2  # one JSON document per refresh
    assert all(json.loads(line)["totals"]["pending_recovery"] == 5 for line in lines)
    assert sleeps == [0.5, 0.5]


def test_watch_says_an_outage_once_and_its_end_spacing_its_tries(
    tq: ToolQueue, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given a server that fails three refreshes in a row, then answers
    real = cli_monitor.status_snapshot
    answers = iter([redis.ConnectionError("gone")] * 3)

    def snapshot(*args: Any, **kwargs: Any) -> dict[str, Any]:
        failure = next(answers, None)
        if failure is not None:
            raise failure
        return real(*args, **kwargs)

    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        if len(sleeps) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(cli_monitor, "status_snapshot", snapshot)
    monkeypatch.setattr(cli_monitor, "_pause", sleep)
    args = ["--app", APP, "--redis-url", redis_url, "--no-workers", "--watch", "--json"]

    # When it is watched every 0.1 s
    result = CliRunner().invoke(cli_monitor.status, [*args, "--interval", "0.1"])

    # Then the outage is one line and its end another, not a line per refresh
    assert result.exit_code == 0, result.output
    said = result.stderr.splitlines()
    assert len(said) == 2, said
    assert said[0].endswith("unavailable (ConnectionError); retrying every ≤ 2 s")
    assert "back after" in said[1]
    # And the tries back off as every process's do, then the refresh goes on
    assert sleeps == [0.5, 1.0, 2.0, 0.1, 0.1]
    assert len(result.stdout.splitlines()) == 2


def test_an_unreachable_server_is_one_line_and_a_failure(tq: ToolQueue) -> None:
    result = CliRunner().invoke(
        cli_monitor.status, ["--app", APP, "--redis-url", "redis://127.0.0.1:1/0"]
    )

    assert result.exit_code != 0
    assert result.output.strip().count("\n") == 0
    assert "cannot reach Redis at redis://127.0.0.1:1/0" in result.output


def test_schema_prints_the_envelope_json_schema() -> None:
    result = CliRunner().invoke(main, ["schema"])

    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    assert schema["title"] == "ToolqEnvelope"
    assert schema["type"] == "object"


def test_status_and_schema_are_toolq_commands() -> None:
    assert {"status", "schema"} <= set(main.commands)


def test_status_rates_are_the_count_over_the_window_on_a_young_stack(
    tq: ToolQueue, clock: Clock
) -> None:
    """The issue's numbers: 1,014 submits in the stack's first minutes are 202.8 a minute
    over the last 5 minutes and 16.9 over the last 60, as the console and the API say."""
    from toolq.services.scheduler.series import bucket, sample_of

    now = bucket(int(clock() * 1000))
    first, second = now - 180_000, now - 60_000
    tq.redis.hset(
        tq.ledger.keys.series,
        mapping={
            str(at): json.dumps(sample_of({"create_invoice|submitted": n}, {}, at))
            for at, n in ((first, 0), (second, 1014))
        },
    )

    snap = status_snapshot(tq)

    assert snap["rates"]["last_5m"]["submitted"] == 202.8
    assert snap["rates"]["last_60m"]["submitted"] == 16.9
    shown = cli_monitor.render_status(snap)
    assert "per minute  last 5 min: submitted 202.8, succeeded 0" in shown
    assert "last 60 min: submitted 16.9" in shown
