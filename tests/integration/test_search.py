"""The search (``q``): operations in every state by a part of their ref or of their
tool's name, on a real Valkey with 10,000 operations, page by page, in both orders.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

from toolq import ToolQueue
from toolq.core import errors
from toolq.core.record import OperationPage
from toolq.core.states import State
from toolq.edges.loader import load_app

APP = "tests.integration.apps.cli_app:tq"
TOOLS = ("echo", "limited", "leak", "dropped")
STATES = ("queued", "succeeded", "failed", "escalated", "waiting_retry")
N = 10_000


def _seed(r: redis.Redis, tq: ToolQueue, n: int, now_ms: int) -> None:
    """``n`` operations as the scripts leave them: a record and its state's index entry."""
    keys = tq.ledger.keys
    pipe = r.pipeline(transaction=False)
    pipe.sadd(keys.tools, *TOOLS)
    for i in range(n):
        tool, state = TOOLS[i % len(TOOLS)], STATES[i % len(STATES)]
        ref = f"bulk/{i:05d}/{tool}"
        at = now_ms - (n - i) * 10
        pipe.zadd(keys.index(tool, state), {ref: at})
        pipe.hset(
            keys.op(ref),
            mapping={"ref": ref, "tool": tool, "state": state, "attempt": 1, "max_attempts": 3,
                     "created": at - 5, "entered": at},
        )  # fmt: skip
        if i % 1000 == 999:
            pipe.execute()
    pipe.execute()


@pytest.fixture
def tq(redis_url: str) -> Iterator[ToolQueue]:
    app = load_app(APP, redis_url)
    try:
        yield app
    finally:
        app.close()


def _walk(tq: ToolQueue, **kwargs: object) -> tuple[list[str], list[OperationPage]]:
    refs: list[str] = []
    pages: list[OperationPage] = []
    cursor = None
    while True:
        page = tq.list_operations(None, cursor=cursor, **kwargs)
        pages.append(page)
        refs += [i.operation_ref for i in page.items]
        cursor = page.next_cursor
        if cursor is None or len(pages) > 500:
            return refs, pages


def test_the_search_finds_a_ref_part_among_ten_thousand_in_every_state(tq: ToolQueue) -> None:
    # Given 10,000 operations in five states and four tools, and two real submits
    _seed(tq.redis, tq, N, tq.app.now_ms() - 60_000)
    tq.submit("echo", {"text": "a"}, operation_ref="run_81/step_4")
    tq.submit("transfer", {"text": "b"}, operation_ref="run_81/step_5")

    # When an operator searches for a part of their refs
    tq.list_operations(None, search="run_81")  # the script loaded
    started = time.perf_counter()
    page = tq.list_operations(None, search="run_81")
    took = time.perf_counter() - started

    # Then both are found, each in its own state, on one page, with nothing after it
    found = [(i.operation_ref, i.tool, i.state) for i in page.items]
    assert found == [
        ("run_81/step_4", "echo", State.QUEUED),
        ("run_81/step_5", "transfer", State.AWAITING_APPROVAL),
    ]
    assert (page.next_cursor, page.prev_cursor, page.partial) == (None, None, False)
    assert page.scanned == N + 2  # every index entry examined once, no record read past them
    print(f"search of {N + 2} entries: {took * 1000:.1f} ms")

    # and the async client answers the same
    apage = asyncio.run(tq.aio.list_operations(None, search="run_81"))
    assert [i.operation_ref for i in apage.items] == ["run_81/step_4", "run_81/step_5"]


def test_a_tool_name_finds_its_operations_page_by_page_with_no_empty_last_page(
    tq: ToolQueue,
) -> None:
    _seed(tq.redis, tq, 2_000, tq.app.now_ms() - 60_000)

    refs, pages = _walk(tq, search="leak", limit=50)  # 500 of 2,000: a tool's name

    assert len(refs) == 500 == len(set(refs)) and all("/leak" in r for r in refs)
    assert len(pages) == 10 and all(len(p.items) == 50 for p in pages)  # the 10th: no Next
    states = {i.state for p in pages for i in p.items}
    assert states == {State(s) for s in STATES}
    newest, _ = _walk(tq, search="leak", limit=50, newest_first=True)
    assert newest == refs[::-1]


def test_a_bad_search_is_refused_with_the_field_named(tq: ToolQueue) -> None:
    for bad in ("", "x" * 201, "run\x00", "a\nb"):
        with pytest.raises(errors.InvalidArguments) as info:
            tq.list_operations(None, search=bad)
        assert [fe.field for fe in info.value.field_errors] == ["q"]


def test_toolq_list_finds_pages_and_refuses_bad_input(tq: ToolQueue, redis_url: str) -> None:
    from click.testing import CliRunner

    from toolq.edges.cli import main

    _seed(tq.redis, tq, 200, tq.app.now_ms() - 60_000)
    tq.submit("echo", {"text": "a"}, operation_ref="run_81/step_4")
    run = CliRunner().invoke
    base = ["--app", APP, "--redis-url", redis_url]

    found = run(main, ["list", "--find", "run_81", *base])
    assert found.exit_code == 0, found.output
    assert found.output.splitlines()[0].startswith("run_81/step_4  echo  queued  attempt 1/5  ")
    assert "1 on this page" in found.output and "next:" not in found.output

    first = run(main, ["list", "--state", "failed", "--limit", "30", "--newest", *base])
    assert first.exit_code == 0, first.output
    assert "30 of 40 on this page" in first.output
    cursor = first.output.split("next:     --cursor ")[1].split()[0]
    last = run(main, ["list", "--state", "failed", "--newest", "--cursor", cursor, *base])
    assert "10 of 40 on this page" in last.output and "next:" not in last.output
    assert "previous: --cursor" in last.output

    bad = run(main, ["list", "--find", "a\tb", *base])
    assert bad.exit_code == 2 and "INVALID_ARGUMENTS" in bad.output and "q:" in bad.output
