"""Limits per dependency (issue 28) with a real server and real worker and scheduler
processes: the rate across workers, the concurrency and a killed worker's slot, the
shared backoff of a 429, the breaker, the deadline of a held call, and the key's
typed errors at submit.

The tools (``apps/deps_app.py``) push what their fake provider sees to the same Redis.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis

from tests.helpers import (
    kill_group,
    start_scheduler,
    start_worker,
    stop_process,
    stop_processes,
    wait_until,
)
from tests.integration.apps import deps_app
from tests.integration.apps.deps_app import APP
from toolq import State, ToolQueue
from toolq.core import errors
from toolq.core.envelope import NextAction, ToolError

Starter = Callable[[str, str], subprocess.Popen[bytes]]


@pytest.fixture
def tq(redis_url: str) -> Iterator[ToolQueue]:
    app = deps_app.tq
    app.configure(redis_url=redis_url)
    yield app
    app.close()


@contextmanager
def running(redis_url: str, *starters: Starter) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [start(APP, redis_url) for start in starters]
    try:
        yield procs
    finally:
        stop_processes(procs, timeout=5)


def worker(threads: int = 4) -> Starter:
    return lambda app, url: start_worker(app, url, concurrency=threads)


def seen(tq: ToolQueue, tool: str) -> list[int]:
    return [int(x) for x in tq.redis.lrange(f"provider:seen:{tool}", 0, -1)]


def all_done(tq: ToolQueue, refs: list[str], timeout: float = 60) -> list[ToolError | object]:
    return [tq.wait(ref, timeout=timeout) for ref in refs]


def admitted(tq: ToolQueue, refs: list[str]) -> list[int]:
    """When the limiter let each call's attempts through, sorted: the stamps of their
    running entries, the claim's ``now`` that the admission was decided at. Not the
    provider's clock (``seen``): that adds the time from the claim to the tool's first
    line, which a loaded machine stretches unevenly, bunching calls the limiter spaced.
    """
    recs = [tq.get(r) for r in refs]
    return sorted(h.at for r in recs if r is not None for h in r.history if h.to is State.RUNNING)


def busiest_second(times: list[int]) -> int:
    """The most of ``times`` (ms) in any window of 1000 ms."""
    return max(sum(1 for t in times if s <= t < s + 1000) for s in times)


def held(tq: ToolQueue, ref: str) -> list[str]:
    """The reasons the call was held back (its DEPENDENCY_LIMITED history entries)."""
    rec = tq.get(ref)
    assert rec is not None
    return [h.code or "" for h in rec.history if h.code == "DEPENDENCY_LIMITED"]


def test_a_rate_holds_across_two_workers_and_spends_no_attempt(
    tq: ToolQueue, redis_url: str
) -> None:
    # Given "rated" limited to 10/s (burst 1), two workers of 4 threads and a scheduler
    with running(redis_url, worker(), worker(), start_scheduler):
        refs = [tq.submit("rated", {"n": i}).operation_ref for i in range(30)]
        envs = all_done(tq, refs)
    # Then every call succeeded on its only attempt (max_attempts=1: a spent one escalates)
    assert all(getattr(e, "ok", False) for e in envs), envs
    records = [tq.get(r) for r in refs]
    assert all(r is not None and r.attempt == 1 for r in records)
    # and the provider saw each once, and the limiter let at most 10 through in any
    # second (GCRA, burst 1: each admission's now at least 100 ms after the last one's)
    assert len(seen(tq, "rated")) == 30
    starts = admitted(tq, refs)
    assert len(starts) == 30
    assert busiest_second(starts) <= 10, starts
    # and calls were held back, not polled: each at most a few times
    assert sum(len(held(tq, r)) for r in refs) >= 15


def test_concurrency_is_never_exceeded_and_a_killed_workers_slot_comes_back(
    tq: ToolQueue, redis_url: str
) -> None:
    # Given "narrow" limited to 2 in flight, two workers of 4 threads
    with running(redis_url, worker(), worker(), start_scheduler):
        refs = [tq.submit("narrow", {"n": i, "sleep": 0.3}).operation_ref for i in range(8)]
        envs = all_done(tq, refs)
    assert all(getattr(e, "ok", False) for e in envs), envs
    assert int(tq.redis.get("provider:peak:narrow") or 0) == 2
    assert any(held(tq, r) for r in refs)

    # When a worker holding both slots is SIGKILLed mid-call, another one running
    tq.redis.delete(tq.ledger.keys.worker_nodes)
    w = start_worker(APP, redis_url, concurrency=4)
    with running(redis_url, start_scheduler):
        try:
            long = [tq.submit("narrow", {"sleep": 60}).operation_ref for _ in range(2)]
            assert wait_until(lambda: tq.redis.zcard(tq.ledger.keys.dep_slots("narrow")) == 2, 30)
            other = start_worker(APP, redis_url, concurrency=4)
            assert wait_until(lambda: tq.redis.hlen(tq.ledger.keys.worker_nodes) >= 2, 30)
        finally:
            kill_group(w)
        # Then a new call waits for a slot, and gets one once their lease (2 s) is over
        try:
            ref = tq.submit("narrow", {"n": 7}).operation_ref
            env = tq.wait(ref, timeout=30)
        finally:
            stop_process(other, timeout=5)
    assert getattr(env, "ok", False), env
    assert held(tq, ref), "the call never waited for a slot"
    assert all(tq.get(r).state is State.ESCALATED for r in long)  # type: ignore[union-attr]


def test_the_asyncio_pool_claims_through_the_same_limiter(tq: ToolQueue, redis_url: str) -> None:
    # Given two -P asyncio workers (their claims go through the asyncio ledger)
    aio: Starter = lambda app, url: start_worker(app, url, pool="asyncio", concurrency=16)  # noqa: E731
    with running(redis_url, aio, aio, start_scheduler):
        rated = [tq.submit("rated", {"n": i}).operation_ref for i in range(20)]
        narrow = [tq.submit("narrow", {"n": i, "sleep": 0.3}).operation_ref for i in range(6)]
        envs = all_done(tq, rated + narrow)
    assert all(getattr(e, "ok", False) for e in envs), envs
    # Then the rate (10/s) and the concurrency (2) held there too, no attempt spent
    # (one server: at most 10 admitted in any second, as with the prefork workers)
    assert len(seen(tq, "rated")) == 20
    starts = admitted(tq, rated)
    assert len(starts) == 20
    assert busiest_second(starts) <= 10, starts
    assert int(tq.redis.get("provider:peak:narrow") or 0) <= 2
    assert all(r is not None and r.attempt == 1 for r in map(tq.get, rated))
    assert sum(len(held(tq, r)) for r in rated + narrow) > 0


def test_on_cells_each_cell_holds_its_share_of_the_rate(redis_url: str) -> None:
    # Given a ledger in 4 cells: "rated" (10/s) is limited in each cell on its own,
    # each with a quarter of the rate
    env = {"TOOLQ_CELLS": "4", "TOOLQ_DURABILITY": "none"}
    submit = (
        "from tests.integration.apps.deps_app import tq\n"
        "refs = [tq.submit('rated', {'n': i}).operation_ref for i in range(24)]\n"
        "envs = [tq.wait(r, timeout=60) for r in refs]\n"
        "print(sum(e.ok for e in envs), sum(tq.get(r).attempt for r in refs))\n"
        "recs = [tq.get(r) for r in refs]\n"
        "print(*[h.at for r in recs for h in r.history if h.to.value == 'running'])\n"
    )
    with running(
        redis_url,
        lambda a, u: start_worker(a, u, env=env),
        lambda a, u: start_worker(a, u, env=env),
        lambda a, u: start_scheduler(a, u, env=env),
    ):
        out = subprocess.run(
            [sys.executable, "-c", submit],
            env={**os.environ, **env, "TOOLQ_REDIS_URL": redis_url},
            capture_output=True,
            timeout=120,
            check=True,
        )
    # Then every call succeeded on its first attempt, and together they stayed in the rate
    counts, stamps = out.stdout.decode().splitlines()
    assert counts.split() == ["24", "24"], out.stderr[-2000:]
    r = redis.Redis.from_url(redis_url)
    assert r.llen("provider:seen:rated") == 24
    # Each cell's limiter admits a quarter of the rate, 2.5/s: in any second, at most
    # ceil(2.5) = 3 claims (a slot every 0.4 s), so the four together at most 12, where
    # one server admits 10 (the share's cost, decision 0019). Counted on the claims'
    # stamps, what the limiters decided on (admitted() says why not the provider's).
    starts = sorted(int(x) for x in stamps.split())
    assert len(starts) == 24
    per_cell = math.ceil(10 / 4)
    assert busiest_second(starts) <= 4 * per_cell, starts
    # and the limiter's state is in the cells the calls were in, not under one key
    assert len({k for k in r.scan_iter(match="*:dep:rated")}) >= 2


def test_a_429_pauses_the_key_for_every_call_not_one_429_each(
    tq: ToolQueue, redis_url: str
) -> None:
    # Given a provider that answers 429 for a second after the first call, one worker
    with running(redis_url, worker(threads=1), start_scheduler):
        refs = [tq.submit("busy", {"n": i}).operation_ref for i in range(6)]
        envs = all_done(tq, refs)
    assert all(getattr(e, "ok", False) for e in envs), envs
    # Then one call got the 429; the others waited for the key (no 429, no attempt spent)
    assert int(tq.redis.get("provider:429:busy") or 0) == 1
    attempts = sorted(tq.get(r).attempt for r in refs)  # type: ignore[union-attr]
    assert attempts == [1, 1, 1, 1, 1, 2]  # the 429's own call spent its attempt
    assert any("DEPENDENCY_LIMITED" in held(tq, r) for r in refs)


def test_the_breaker_opens_lets_one_probe_through_and_closes(tq: ToolQueue, redis_url: str) -> None:
    # Given "flaky" (breaker: 2 failures open it for 1 s) down, one worker
    tq.redis.set("provider:down", "1")
    with running(redis_url, worker(threads=1), start_scheduler):
        refs = [tq.submit("flaky", {"n": i}).operation_ref for i in range(6)]
        key = tq.ledger.keys.dep("flaky")
        # When the breaker has opened and a probe failed and opened it again
        assert wait_until(lambda: int(tq.redis.hget(key, "n_opened") or 0) >= 2, 60)
        tq.redis.delete("provider:down")
        down_calls = len(seen(tq, "flaky"))
        opened = int(tq.redis.hget(key, "n_opened") or 0)
        envs = all_done(tq, refs)
    # Then the provider saw the threshold and one probe per half-open, no more
    assert down_calls <= 2 + opened, (down_calls, opened)
    # and every call succeeded once it was back, none escalated for the outage
    assert all(getattr(e, "ok", False) for e in envs), envs
    assert tq.redis.hget(key, "breaker") == b"closed"


def test_a_call_whose_deadline_passes_while_its_key_is_paused_escalates_unsent(
    tq: ToolQueue, redis_url: str
) -> None:
    # Given the key of account z paused for a minute
    key = tq.ledger.keys.dep("acct:z")
    far = int(tq.clock() * 1000) + 60_000
    tq.redis.hset(key, mapping={"paused_until": far})
    with running(redis_url, worker(), start_scheduler):
        assert getattr(tq.wait(tq.submit("plain", {}).operation_ref, timeout=30), "ok", False)
        ref = tq.submit("per_account", {"account": "z"}).operation_ref
        env = tq.wait(ref, timeout=30)
    # Then it ends escalated DEADLINE_EXCEEDED (deadline 1.5 s), the tool never called
    assert isinstance(env, ToolError), env
    assert (env.code, env.next_action) == ("DEADLINE_EXCEEDED", NextAction.ESCALATE)
    assert held(tq, ref)
    assert seen(tq, "per_account") == []
    assert tq.redis.zscore(tq.ledger.keys.dep_waiting("acct:z"), ref) is None


def test_a_held_call_reads_as_dependency_limited(tq: ToolQueue, redis_url: str) -> None:
    key = tq.ledger.keys.dep("acct:y")
    far = int(tq.clock() * 1000) + 60_000
    tq.redis.hset(key, mapping={"paused_until": far})
    with running(redis_url, worker()):
        ref = tq.submit("account", {"account": "y"}).operation_ref
        assert wait_until(lambda: held(tq, ref), 30)
    rec = tq.get(ref)
    assert rec is not None and rec.state is State.WAITING_RETRY
    env = rec.envelope
    assert isinstance(env, ToolError)
    assert env.code == "DEPENDENCY_LIMITED"
    assert env.safe_details == {"dependency": "acct:y", "reason": "paused"}
    assert env.retry.not_before is not None
    assert int(env.retry.not_before.timestamp() * 1000) == far
    assert env.retry.max_attempts_remaining == 2


def test_a_bad_key_or_a_raising_key_function_is_refused_at_submit(tq: ToolQueue) -> None:
    for n in (0, 1):  # raises; returns no key
        with pytest.raises(errors.InvalidArguments) as caught:
            tq.submit("bad_key", {"n": n}, operation_ref=f"bad/{n}")
        assert "dependency key" in str(caught.value)
        assert tq.get(f"bad/{n}") is None
    with pytest.raises(ValueError, match="not a dependency key"):
        tq.limit("no key!", rate="1/s")
    with pytest.raises(ValueError, match="rate"):
        tq.limit("k", rate="fast")
    with pytest.raises(ValueError, match="dependency"):
        tq.tool(dependency="a b")(lambda: None)


def test_a_call_without_a_key_writes_nothing_of_a_limiter(tq: ToolQueue, redis_url: str) -> None:
    with running(redis_url, worker()):
        env = tq.wait(tq.submit("plain", {"n": 1}).operation_ref, timeout=30)
    assert getattr(env, "ok", False), env
    client = redis.Redis.from_url(redis_url)
    try:
        assert not list(client.scan_iter(match=tq.ledger.keys.dep_prefix + "*"))
    finally:
        client.close()
