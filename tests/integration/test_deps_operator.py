"""What an operator sees and does about dependency keys, on a real Valkey: the read side
(one tag and cells, sync and asyncio), lifting a pause and closing a breaker (recorded,
refused when they do not apply, the held-back calls made due), ``toolq deps`` and the
lines ``toolq status`` adds; and, with a real worker and scheduler, a call held back by
a paused key that runs as soon as the pause is lifted.

The limiter's state is seeded by writing its keys as the claim scripts would
(:func:`seed_dep`, the layout of toolq.core.deps).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from tests.helpers import run_aio, serving, wait_until
from tests.integration.apps import operator_app
from toolq import ToolQueue
from toolq.adapters.ledger.dep_state import DepState
from toolq.core import errors
from toolq.core.deps import dep_cell
from toolq.core.keys import Keys
from toolq.core.layout import Cells, Layout, SingleTag
from toolq.core.settings import ToolqSettings
from toolq.core.states import State
from toolq.edges.cli import main

APP = "tests.integration.apps.operator_app:tq"
LOG_FIELDS = ("op_at", "op_by", "op_what", "op_why", "op_log")


def dep_keys(layout: Layout, key: str) -> Keys:
    """Where a test seeds a key's limiter: the cell :func:`toolq.core.deps.dep_cell`
    picks (one of the cells a key's view sums), or the single tag's own keys."""
    if layout.cells is None:
        return layout.keys_of(key)
    return Keys(layout.prefix, dep_cell(key, layout.cells))


def seed_dep(
    client: redis.Redis,
    layout: Layout,
    key: str,
    now_ms: int,
    *,
    slots: dict[str, int] | None = None,
    waiting: dict[str, int] | None = None,
    **fields: Any,
) -> Keys:
    """Write a key's limiter state as the claim scripts do: its hash, its slots (ref ->
    lease end), its waiting set (ref -> not_before) and its entry in the set of keys."""
    keys = dep_keys(layout, key)
    if fields:
        client.hset(keys.dep(key), mapping={k: str(v) for k, v in fields.items()})
    if slots:
        client.zadd(keys.dep_slots(key), slots)
    if waiting:
        client.zadd(keys.dep_waiting(key), waiting)
    client.zadd(keys.deps, {key: now_ms})
    return keys


def seed_held_back(
    client: redis.Redis, layout: Layout, ref: str, key: str, not_before: int, state: str
) -> Keys:
    """An operation the key holds back: waiting_retry on ``key`` until ``not_before``."""
    keys = layout.keys_of(ref)
    client.hset(
        keys.op(ref),
        mapping={"state": state, "dep": key, "retry_due": str(not_before), "tool": "charge"},
    )
    client.zadd(keys.due, {ref: not_before})
    return keys


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    yield c
    c.close()


NOW = 1_700_000_000_000
LAYOUTS = [SingleTag("toolq"), Cells("toolq", 8)]


@pytest.mark.parametrize("layout", LAYOUTS, ids=["one-tag", "cells"])
def test_a_key_reads_as_the_limiter_left_it(client: redis.Redis, layout: Layout) -> None:
    # Given two keys, one paused with slots (one of them expired) and waiting calls
    keys = seed_dep(
        client,
        layout,
        "stripe:acct_1",
        NOW,
        slots={"a": NOW + 5000, "b": NOW + 1, "dead": NOW - 1},
        waiting={"w1": NOW + 9000, "w2": NOW + 9500},
        rate="20/s",
        burst=5,
        concurrency=3,
        paused_until=NOW + 30_000,
        pause_code="RATE_LIMITED",
        breaker="open",
        open_until=NOW + 20_000,
        n_admitted=40,
        n_limited=7,
    )
    seed_dep(client, layout, "mailer", NOW - 10, paused_until=NOW - 1, breaker="closed")
    state = DepState(client, layout)
    # When they are read
    views = {v.key: v for v in state.views(NOW)}
    # Then the key's limiter is read in its own cell
    assert sorted(views) == ["mailer", "stripe:acct_1"]
    v = views["stripe:acct_1"]
    assert v.cell == (None if layout.cells is None else dep_cell("stripe:acct_1", 8))
    assert keys.cell == v.cell
    assert (v.in_flight, v.waiting, v.paused_until_ms, v.breaker) == (2, 2, NOW + 30_000, "open")
    assert (v.limits.rate, v.limits.burst, v.limits.concurrency) == ("20/s", 5, 3)
    assert (v.admitted, v.limited, v.last_used_ms) == (40, 7, NOW)
    # and a pause that ended is no pause
    assert views["mailer"].paused_until_ms is None
    with pytest.raises(errors.UnknownDependency):
        state.view("nobody", NOW)
    with pytest.raises(errors.InvalidDependencyKey):
        state.view("bad key/with spaces", NOW)


@pytest.mark.parametrize("layout", LAYOUTS, ids=["one-tag", "cells"])
def test_lifting_a_pause_records_it_and_makes_the_held_back_calls_due_now(
    client: redis.Redis, layout: Layout
) -> None:
    # Given a paused key holding back three calls, one of which has moved on since
    later = NOW + 600_000
    refs = ["run/1", "run/2", "run/3"]
    seed_dep(
        client,
        layout,
        "stripe",
        NOW,
        waiting={r: later for r in refs},
        paused_until=later,
        pause_code="RATE_LIMITED",
    )
    for ref in refs[:2]:
        seed_held_back(client, layout, ref, "stripe", later, "waiting_retry")
    seed_held_back(client, layout, "run/3", "stripe", later, "running")
    # When an operator lifts the pause
    done = DepState(client, layout).act(
        "stripe", "lift", by="cli:ann:deps-lift", reason="incident over", now_ms=NOW
    )
    # Then the key is no longer paused, and says who, when and why
    assert done.dependency.paused_until_ms is None
    assert [(a.by, a.what, a.why, a.at_ms) for a in done.dependency.actions] == [
        ("cli:ann:deps-lift", "lift", "incident over", NOW)
    ]
    fields = client.hgetall(dep_keys(layout, "stripe").dep("stripe"))
    assert (fields["op_by"], fields["op_what"], fields["op_why"]) == (
        "cli:ann:deps-lift",
        "lift",
        "incident over",
    )
    assert "paused_until" not in fields and "pause_code" not in fields
    # and the calls still waiting on it are due now (plus jitter), the other untouched
    assert done.made_due == 2
    for ref in refs[:2]:
        keys = layout.keys_of(ref)
        due = client.zscore(keys.due, ref)
        assert due is not None and NOW <= due < NOW + 2000
        assert int(client.hget(keys.op(ref), "retry_due") or 0) == int(due)
    assert client.zscore(layout.keys_of("run/3").due, "run/3") == later


def test_an_action_that_does_not_apply_is_refused_and_writes_nothing(
    client: redis.Redis,
) -> None:
    layout = SingleTag("toolq")
    keys = seed_dep(client, layout, "stripe", NOW, breaker="closed", paused_until=NOW - 1)
    state = DepState(client, layout)
    before = client.hgetall(keys.dep("stripe"))
    with pytest.raises(errors.DependencyActionRefused) as lift:
        state.act("stripe", "lift", by="x", reason="r", now_ms=NOW)
    assert lift.value.code == "NOT_PAUSED"
    with pytest.raises(errors.DependencyActionRefused) as close:
        state.act("stripe", "close", by="x", reason="r", now_ms=NOW)
    assert close.value.code == "BREAKER_CLOSED"
    assert isinstance(close.value, errors.InvalidState)
    assert client.hgetall(keys.dep("stripe")) == before
    with pytest.raises(errors.UnknownDependency):
        state.act("nobody", "close", by="x", reason="r", now_ms=NOW)
    with pytest.raises(errors.InvalidDependencyKey):
        state.act("no spaces allowed", "close", by="x", reason="r", now_ms=NOW)
    with pytest.raises(errors.InvalidArguments, match="reason"):
        state.act("stripe", "close", by="x", reason="  ", now_ms=NOW)
    with pytest.raises(errors.InvalidArguments, match="lift or close"):
        state.act("stripe", "open", by="x", reason="r", now_ms=NOW)
    for by in ("x\ud800", "two\nlines", ""):  # who acts, as for an operation's action
        with pytest.raises(errors.InvalidArguments, match="by: who acts"):
            state.act("stripe", "close", by=by, reason="r", now_ms=NOW)
    assert client.hgetall(keys.dep("stripe")) == before


@pytest.mark.parametrize("breaker", ["open", "half_open"])
def test_closing_a_breaker_forgets_its_failures_and_keeps_a_short_log(
    client: redis.Redis, breaker: str
) -> None:
    layout = Cells("toolq", 4)
    keys = seed_dep(
        client,
        layout,
        "ticketing",
        NOW,
        breaker=breaker,
        fails=5,
        fails_since=NOW - 100,
        open_until=NOW + 30_000,
        probe="run/9",
        probe_until=NOW + 5000,
    )
    state = DepState(client, layout)
    for i in range(25):  # the log keeps the last 20
        client.hset(keys.dep("ticketing"), "breaker", breaker)
        state.act("ticketing", "close", by=f"op{i}", reason="back", now_ms=NOW + i)
    fields = client.hgetall(keys.dep("ticketing"))
    assert (fields["breaker"], fields["fails"]) == ("closed", "0")
    assert not {"fails_since", "open_until", "probe", "probe_until"} & set(fields)
    log = json.loads(fields["op_log"])
    assert len(log) == 20 and log[0]["by"] == "op24" and log[-1]["by"] == "op5"
    view = state.view("ticketing", NOW)
    assert (view.breaker, view.fails, view.probe, view.open_until_ms) == ("closed", 0, None, None)


def test_the_async_side_reads_and_acts_as_the_sync_one(redis_url: str) -> None:
    tq = ToolQueue(redis_url, settings=ToolqSettings(cells=8, durability="none"))
    try:
        layout = tq.app.topology.layout
        seed_dep(tq.redis, layout, "stripe", NOW, breaker="open", open_until=NOW + 5)

        async def go() -> tuple[Any, Any, Any]:
            listed = await tq.aio.deps.list()
            done = await tq.aio.deps.close("stripe", reason="provider back", by="api:abc")
            try:
                await tq.aio.deps.lift("stripe", reason="x")
            except errors.DependencyActionRefused as exc:
                return listed, done, exc.code
            return listed, done, None

        listed, done, refused = run_aio(tq, go)
        assert [v.key for v in listed] == ["stripe"] and listed[0].breaker == "open"
        assert done.dependency.breaker == "closed"
        assert done.dependency.actions[0].by == "api:abc"
        assert refused == "NOT_PAUSED"
        assert tq.deps.show("stripe").breaker == "closed"
    finally:
        tq.close()


def test_toolq_deps_lists_shows_and_settles_a_key(redis_url: str, tmp_path: Any) -> None:
    c = redis.Redis.from_url(redis_url, decode_responses=True)
    layout = SingleTag("toolq")
    now = int(__import__("time").time() * 1000)
    seed_dep(c, layout, "stripe", now, rate="20/s", concurrency=5, paused_until=now + 600_000,
             pause_code="RATE_LIMITED", waiting={"run/1": now + 600_000}, n_admitted=3)  # fmt: skip
    seed_dep(c, layout, "mailer", now, breaker="closed")
    run = CliRunner().invoke
    env = {"TOOLQ_REDIS_URL": redis_url}
    base = ["--state-dir", str(tmp_path)]

    listed = run(main, ["deps", *base], env=env)
    assert listed.exit_code == 0, listed.output
    assert "stripe" in listed.output and "20/s, 5 at once" in listed.output
    assert "paused 9m" in listed.output
    as_json = json.loads(run(main, ["deps", *base, "--json"], env=env).output)
    assert [d["key"] for d in as_json["deps"]] == ["mailer", "stripe"]

    status = run(main, ["status", *base], env=env)
    assert status.exit_code == 0, status.output
    lines = [line for line in status.output.splitlines() if line.startswith("dependency")]
    assert len(lines) == 1 and "stripe: paused 9m" in lines[0] and "1 waiting" in lines[0]

    shown = run(main, ["deps", "show", "stripe"], env=env)
    assert shown.exit_code == 0, shown.output
    assert "RATE_LIMITED" in shown.output and "waiting     1" in shown.output

    no_reason = run(main, ["deps", "lift", "stripe"], env=env)
    assert no_reason.exit_code == 2 and "--reason" in no_reason.output
    lifted = run(main, ["deps", "lift", "stripe", "--reason", "incident over"], env=env)
    assert lifted.exit_code == 0, lifted.output
    assert lifted.output.startswith("lifted the pause of stripe")
    again = run(main, ["deps", "lift", "stripe", "--reason", "again"], env=env)
    assert again.exit_code == 2 and "NOT_PAUSED" in again.output
    closed = run(main, ["deps", "close", "mailer", "--reason", "x", "--json"], env=env)
    assert closed.exit_code == 2 and "BREAKER_CLOSED" in closed.output
    unknown = run(main, ["deps", "show", "nobody"], env=env)
    assert unknown.exit_code == 2 and "UNKNOWN_DEPENDENCY" in unknown.output
    bad = run(main, ["deps", "show", "a b"], env=env)
    assert bad.exit_code == 2 and "INVALID_DEPENDENCY_KEY" in bad.output
    after = json.loads(run(main, ["deps", "show", "stripe", "--json"], env=env).output)
    assert after["paused_until_ms"] is None and after["actions"][0]["why"] == "incident over"
    assert after["actions"][0]["by"].startswith("cli:")
    c.close()


@pytest.fixture(scope="module")
def served(module_redis_url: str) -> Iterator[ToolQueue]:
    with serving(operator_app.tq, APP, module_redis_url) as q:
        yield q


def test_a_call_held_back_by_a_paused_key_runs_once_the_pause_is_lifted(
    served: ToolQueue,
) -> None:
    # Given a call waiting half an hour, held back by a paused key as the limiter does
    tq = served
    ref = "deps/lift/1"
    tq.submit("charge", {"mode": "slow_retry"}, operation_ref=ref)
    assert wait_until(lambda: (r := tq.get(ref)) is not None and r.state is State.WAITING_RETRY, 30)
    layout = tq.app.topology.layout
    not_before = int(tq.ledger.fields(ref, "retry_due")["retry_due"])
    tq.redis.hset(layout.keys_of(ref).op(ref), "dep", "stripe")
    seed_dep(tq.redis, layout, "stripe", tq.app.now_ms(), waiting={ref: not_before},
             paused_until=not_before, pause_code="RATE_LIMITED")  # fmt: skip
    # When an operator lifts the pause
    done = tq.deps.lift("stripe", reason="provider says it is over")
    # Then the call goes now, not in half an hour, and succeeds
    assert done.made_due == 1
    assert tq.wait(ref, timeout=30).ok
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.SUCCEEDED and rec.attempt == 2


READER = "reader-token-0123456789"
APPROVER = "approver-token-0123456789"
RESOLVER = "resolver-token-0123456789"


def test_the_http_api_lists_shows_and_settles_keys_with_the_resolve_scope(
    redis_url: str,
) -> None:
    from fastapi.testclient import TestClient

    from toolq.edges.api import ApiSettings, create_app

    tq = ToolQueue(redis_url, settings=ToolqSettings(durability="none"))
    try:
        now = tq.app.now_ms()
        layout = tq.app.topology.layout
        seed_dep(tq.redis, layout, "stripe:acct_1", now, paused_until=now + 60_000,
                 breaker="half_open", probe="run/7", rate="20/s")  # fmt: skip
        tokens = f"{READER}=read;{APPROVER}=approve,read;{RESOLVER}=resolve,read"
        app = create_app(tq, ApiSettings(tokens=tokens, allowed_hosts="testserver"))

        def as_(token: str) -> TestClient:
            return TestClient(app, headers={"Authorization": f"Bearer {token}"})

        reader, approver, resolver = as_(READER), as_(APPROVER), as_(RESOLVER)
        listed = reader.get("/v1/deps")
        assert listed.status_code == 200, listed.text
        [dep] = listed.json()["deps"]
        assert (dep["key"], dep["breaker"]) == ("stripe:acct_1", "half_open")
        assert dep["limits"]["rate"] == "20/s"
        # /v1/status names the key as toolq status does (paused, its breaker half-open)
        status = reader.get("/v1/status").json()
        assert [(d["key"], d["breaker"]) for d in status["deps"]] == [
            ("stripe:acct_1", "half_open")
        ]
        one = reader.get("/v1/deps/stripe:acct_1")
        assert one.status_code == 200 and one.json()["probe"] == "run/7"
        assert reader.get("/v1/deps/nobody").json()["code"] == "UNKNOWN_DEPENDENCY"
        assert reader.get("/v1/deps/nobody").status_code == 404
        bad = reader.get("/v1/deps/%20bad")
        assert (bad.status_code, bad.json()["code"]) == (422, "INVALID_DEPENDENCY_KEY")

        body = {"reason": "provider is back"}
        assert reader.post("/v1/deps/stripe:acct_1:lift", json=body).status_code == 403
        assert approver.post("/v1/deps/stripe:acct_1:close", json=body).status_code == 403
        assert resolver.post("/v1/deps/stripe:acct_1:lift", json={}).status_code == 422
        foreign = resolver.post(
            "/v1/deps/stripe:acct_1:lift", json=body, headers={"Origin": "http://evil.example"}
        )
        assert foreign.status_code == 403
        assert tq.deps.show("stripe:acct_1").paused_until_ms is not None  # nothing written

        lifted = resolver.post("/v1/deps/stripe:acct_1:lift", json=body)
        assert lifted.status_code == 200, lifted.text
        got = lifted.json()
        assert got["dependency"]["paused_until_ms"] is None and got["made_due"] == 0
        assert got["dependency"]["actions"][0]["by"].startswith("api:")
        again = resolver.post("/v1/deps/stripe:acct_1:lift", json=body)
        assert (again.status_code, again.json()["code"]) == (409, "NOT_PAUSED")
        closed = resolver.post("/v1/deps/stripe:acct_1:close", json=body)
        assert closed.status_code == 200 and closed.json()["dependency"]["breaker"] == "closed"

        paths = reader.get("/openapi.json").json()["paths"]
        assert {"/v1/deps", "/v1/deps/{key}", "/v1/deps/{key}:lift", "/v1/deps/{key}:close"} <= set(
            paths
        )
    finally:
        tq.close()


def test_a_scrape_serves_each_keys_series(redis_url: str) -> None:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    from toolq.edges.metrics import start_metrics_server

    tq = ToolQueue(redis_url, settings=ToolqSettings(cells=4, durability="none"))
    server = start_metrics_server(0, tq, "test")
    try:
        now = tq.app.now_ms()
        layout = tq.app.topology.layout
        seed_dep(tq.redis, layout, "stripe", now, slots={"a": now + 60_000},
                 waiting={"w": now + 1000, "x": now + 2000}, paused_until=now + 60_000,
                 breaker="half_open", n_admitted=11, n_limited=4)  # fmt: skip
        seed_dep(tq.redis, layout, "mailer", now, breaker="open", n_admitted=2)
        with urllib.request.urlopen(server.url, timeout=10) as response:
            text = response.read().decode()
        samples = {
            (s.name, s.labels.get("dependency")): s.value
            for family in text_string_to_metric_families(text)
            if family.name.startswith("toolq_dependency")
            for s in family.samples
        }
        assert samples[("toolq_dependency_in_flight", "stripe")] == 1
        assert samples[("toolq_dependency_waiting", "stripe")] == 2
        assert samples[("toolq_dependency_paused", "stripe")] == 1
        assert samples[("toolq_dependency_paused", "mailer")] == 0
        assert samples[("toolq_dependency_breaker_state", "stripe")] == 1
        assert samples[("toolq_dependency_breaker_state", "mailer")] == 2
        assert samples[("toolq_dependency_admitted_total", "stripe")] == 11
        assert samples[("toolq_dependency_limited_total", "stripe")] == 4
        assert samples[("toolq_dependency_admitted_total", "mailer")] == 2
    finally:
        server.shutdown()
        tq.close()


def readme_block(name: str) -> list[str]:
    """The commands of the README's ``<!-- doc-test: name -->`` shell block, one a line
    (continuation lines joined)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"<!-- doc-test: {name}\b[^>]*-->\n```sh\n(.*?)\n```", text, re.S)
    assert found, f"no doc-test block {name!r} in the README"
    return found.group(1).replace("\\\n", " ").splitlines()


def test_the_readmes_deps_commands_run_as_shown(redis_url: str, tmp_path: Any) -> None:
    import shlex

    c = redis.Redis.from_url(redis_url, decode_responses=True)
    now = int(__import__("time").time() * 1000)
    seed_dep(c, SingleTag("toolq"), "stripe", now, paused_until=now + 60_000, breaker="open")
    env = {"TOOLQ_REDIS_URL": redis_url, "TOOLQ_STATE_DIR": str(tmp_path)}
    commands = readme_block("deps-cli")
    assert len(commands) == 5
    for line in commands:
        argv = shlex.split(line)
        assert argv[0] == "toolq"
        result = CliRunner().invoke(main, argv[1:], env=env)
        assert result.exit_code == 0, (line, result.output)
    view = DepState(c, SingleTag("toolq")).view("stripe", now)
    assert (view.paused_until_ms, view.breaker) == (None, "closed")
    assert [a.what for a in view.actions] == ["close", "lift"]
    c.close()


def test_the_readmes_deps_requests_answer_as_shown(redis_url: str) -> None:
    import shlex
    from urllib.parse import urlsplit

    from fastapi.testclient import TestClient

    from toolq.edges.api import ApiSettings, create_app

    token = "readme-token-0123456789"
    tq = ToolQueue(redis_url, settings=ToolqSettings(durability="none"))
    try:
        now = tq.app.now_ms()
        seed_dep(tq.redis, tq.app.topology.layout, "stripe", now, paused_until=now + 60_000,
                 breaker="open")  # fmt: skip
        app = create_app(tq, ApiSettings(tokens=f"{token}=read,resolve"))
        client = TestClient(app, base_url="http://127.0.0.1:8000")
        requests = readme_block("deps-http")
        assert len(requests) == 4
        for line in requests:
            argv = shlex.split(line.replace("$TOKEN", token))
            assert argv[0] == "curl"
            method, headers, data, url = "GET", {}, None, ""
            args = iter(argv[1:])
            for a in args:
                if a == "-X":
                    method = next(args)
                elif a == "-H":
                    name, _, value = next(args).partition(": ")
                    headers[name] = value
                elif a == "-d":
                    data = next(args)
                else:
                    url = a
            r = client.request(method, urlsplit(url).path, headers=headers, content=data)
            assert r.status_code == 200, (line, r.text)
        assert tq.deps.show("stripe").breaker == "closed"
    finally:
        tq.close()


def test_on_cells_a_keys_view_sums_its_cells_and_a_lift_reaches_every_one(
    client: redis.Redis,
) -> None:
    # Given a key limited in two cells (each cell limits the calls it holds): one cell
    # paused with a call in flight, the other with its breaker open and a call held back
    layout = Cells("toolq", 8)
    a, b = Keys("toolq", 1), Keys("toolq", 5)
    client.hset(a.dep("mail"), mapping={"paused_until": NOW + 60_000, "n_admitted": 3})
    client.zadd(a.dep_slots("mail"), {"x/1": NOW + 9_000})
    client.hset(b.dep("mail"), mapping={"breaker": "open", "open_until": NOW + 30_000,
                                        "n_admitted": 4, "n_limited": 2})  # fmt: skip
    client.zadd(b.dep_waiting("mail"), {"x/2": NOW + 30_000})
    for k in (a, b):
        client.zadd(k.deps, {"mail": NOW})
    deps = DepState(client, layout)
    # Then its view is the sum, the latest pause and the worst breaker
    v = deps.view("mail", NOW)
    assert (v.in_flight, v.waiting, v.admitted, v.limited) == (1, 1, 7, 2)
    assert (v.paused_until_ms, v.breaker, v.cell) == (NOW + 60_000, "open", None)
    # When an operator lifts the pause: the paused cell is lifted, the other left as it is
    deps.act("mail", "lift", by="cli:ann", reason="over", now_ms=NOW)
    assert client.hget(a.dep("mail"), "paused_until") is None
    assert deps.view("mail", NOW).paused_until_ms is None
    # and closing the breaker closes it where it is open
    deps.act("mail", "close", by="cli:ann", reason="back", now_ms=NOW)
    assert client.hget(b.dep("mail"), "breaker") == "closed"
    # and an action that applies in no cell is refused
    with pytest.raises(errors.DependencyActionRefused):
        deps.act("mail", "lift", by="cli:ann", reason="again", now_ms=NOW)
