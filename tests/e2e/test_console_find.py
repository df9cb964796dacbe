"""Finding and sorting in the console, in a real browser (issue 27, "Find and sort"):
the header's search box from the overview, pages of 200 rows at 50 without a Next on
the last, sorting by age, the rates on a stack younger than their window, and a dead
worker listed as gone, not as a worker.

A stack of its own (``toolq api`` and a worker for ``console_app``), with no scheduler:
the rates test writes the only samples, as the scheduler's Sampler does.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from playwright.sync_api import expect

from tests.e2e.test_console import OPERATOR, Stack, browser, context, login, shot
from tests.helpers import free_port, start_worker, stop_process
from tests.integration.apps import console_app
from tests.integration.apps.console_app import APP
from toolq.adapters.liveness import WorkerNode
from toolq.core.states import State
from toolq.services.scheduler.series import Sampler, bucket

__all__ = ["browser", "context"]  # the fixtures, shared with the console's other tests


@pytest.fixture(scope="module")
def stack(module_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tq = console_app.tq
    tq.configure(redis_url=module_redis_url)
    log = tmp_path_factory.mktemp("console-find") / "api.log"
    worker = start_worker(APP, module_redis_url)
    s = Stack(tq, module_redis_url, free_port(), log)
    try:
        s.start_api()
        yield s
    finally:
        if s.api is not None:
            stop_process(s.api, timeout=5)
        stop_process(worker, timeout=5)
        tq.close()


def _refs(page: Any) -> list[str]:
    return page.locator("table.list tbody tr a.ref").all_inner_texts()


def test_the_search_box_finds_an_operation_by_a_ref_part_from_the_overview(
    context: Any, stack: Stack
) -> None:
    # Given operations in three states, two of them with run_81 in their refs
    stack.tq.submit("ping", {"host": "a"}, operation_ref="find/run_81/step_4")
    stack.tq.submit("charge", {"amount": 0}, operation_ref="find/run_81/step_5")
    stack.tq.submit("ping", {"host": "b"}, operation_ref="find/run_82/step_1")
    stack.until_state("find/run_81/step_4", State.WAITING_RETRY)
    stack.until_state("find/run_81/step_5", State.NEEDS_INPUT)
    stack.until_state("find/run_82/step_1", State.WAITING_RETRY)  # the state tab's below
    page = login(context, stack, OPERATOR)

    # When the operator types a part of a ref into the header's search box
    page.get_by_label("Find operations by ref or tool").fill("run_81")
    page.get_by_label("Find operations by ref or tool").press("Enter")

    # Then both are listed, from every state, each with its state, attempt and duration
    expect(page).to_have_url(re.compile(r"/ui/operations\?q=run_81"))
    expect(
        page.get_by_role("heading", name=re.compile("Search: .?run_81.? in every state"))
    ).to_be_visible()
    rows = page.locator("table.list tbody tr")
    expect(rows).to_have_count(2)
    # (in the order they entered their states, which the worker's slots decide)
    assert sorted(_refs(page)) == ["find/run_81/step_4", "find/run_81/step_5"]
    step_4 = rows.filter(has_text="find/run_81/step_4")
    expect(step_4).to_contain_text("waiting_retry")
    expect(rows.filter(has_text="find/run_81/step_5")).to_contain_text("needs_input")
    expect(step_4.locator("td.attempt")).to_have_text("1/3")
    expect(step_4.locator("td.duration")).to_have_text(re.compile(r"^\d+ s so far$"))
    expect(page.get_by_label("Find operations by ref or tool")).to_have_value("run_81")
    shot(page, "search-run-81")
    # the search box is on every page: from an operation's page, a tool's name
    page.get_by_role("link", name="find/run_81/step_5").click()
    page.get_by_label("Find operations by ref or tool").fill("charge")
    page.get_by_role("button", name="Find").click()
    expect(rows).to_have_count(1)
    assert _refs(page) == ["find/run_81/step_5"]
    # a search narrowed to one state, from the tabs
    page.goto("/ui/operations?q=run_8&state=waiting_retry")
    expect(rows).to_have_count(2)
    assert sorted(_refs(page)) == ["find/run_81/step_4", "find/run_82/step_1"]
    # bad input: a message naming the search, not a trace
    page.goto("/ui/operations?q=run%0A81")
    expect(page.get_by_role("alert")).to_contain_text("search: 1 to 200 printable characters")


def test_paging_200_rows_at_50_ends_without_next_on_page_4_and_sorts_by_age(
    context: Any, stack: Stack
) -> None:
    # Given 200 operations awaiting approval, submitted one after the other
    refs = [f"page/{i:03d}" for i in range(200)]
    for i, ref in enumerate(refs):
        stack.tq.submit("publish", {"text": f"post {i}"}, operation_ref=ref)
    page = login(context, stack, OPERATOR)
    page.goto("/ui/operations?state=awaiting_approval&tool=publish&limit=50")
    count = page.locator("#list-count")
    expect(count).to_contain_text("200 operations in awaiting_approval")

    # When the operator pages through them: 50 a page, Next on pages 1 to 3 only
    shown: list[str] = []
    for n in range(1, 5):
        expect(page.locator("table.list tbody tr")).to_have_count(50)
        shown += _refs(page)
        if n < 4:
            page.get_by_role("link", name="Next page").click()
    assert shown == refs
    expect(page.get_by_role("link", name="Next page")).to_have_count(0)
    expect(page.get_by_role("link", name="First page")).to_be_visible()
    shot(page, "list-last-page")
    # Previous goes back a page, and the first page offers no Previous
    page.get_by_role("link", name="Previous page").click()
    expect(page.locator("table.list tbody tr a.ref").first).to_have_text("page/100")
    for _ in range(2):
        page.get_by_role("link", name="Previous page").click()
    expect(page.locator("table.list tbody tr a.ref").first).to_have_text("page/000")
    expect(page.get_by_role("link", name="Previous page")).to_have_count(0)

    # Sorting by age flips the order: newest first, then oldest first again
    page.get_by_role("link", name="Newest first").click()
    expect(page.locator("table.list tbody tr a.ref").first).to_have_text("page/199")
    expect(count).to_contain_text("newest first")
    assert _refs(page) == refs[::-1][:50]
    page.get_by_role("link", name="Next page").click()
    expect(page.locator("table.list tbody tr a.ref").first).to_have_text("page/149")
    page.get_by_role("link", name="Oldest first").click()
    expect(page.locator("table.list tbody tr a.ref").first).to_have_text("page/000")


def test_the_rates_are_the_count_over_the_window_on_a_young_stack(
    context: Any, stack: Stack
) -> None:
    # Given a stack two minutes old: a sample before 24 submits, one after (the
    # scheduler's Sampler, at the minutes it would have sampled)
    keys = stack.tq.ledger.keys
    sampler = Sampler(lambda: stack.tq.redis, keys, stack.tq.clock)
    now_bucket = bucket(int(stack.tq.clock() * 1000))
    stack.provider.delete(keys.series)
    sampler.sample(now_bucket - 120_000)
    for i in range(24):
        stack.tq.submit("publish", {"text": "r"}, operation_ref=f"rates/{i}")
    sampler.sample(now_bucket - 60_000)
    # and a worker killed a while ago, whose entry is still there
    dead = WorkerNode("calls-9@gone", 4242, "solo", 1, ("toolq.calls",), 0, now_bucket - 600_000)
    stack.provider.hset(keys.worker_nodes, dead.field, dead.to_json())

    page = login(context, stack, OPERATOR)

    # Then 24 in the last 5 minutes is 4.8 a minute, and 0.4 over the last 60 (not 24
    # a minute for both: the minute of history the stack has)
    five = page.get_by_role("row", name=re.compile("^5 minutes"))
    sixty = page.get_by_role("row", name=re.compile("^60 minutes"))
    expect(five.locator("td").first).to_have_text("4.8")
    expect(sixty.locator("td").first).to_have_text("0.4")
    expect(page.locator("#rates-help")).to_contain_text("count over the whole window")
    # The dead worker is not listed among the workers, but as gone since its last beat
    workers = page.locator("table", has=page.get_by_role("columnheader", name="Pool"))
    expect(workers).not_to_contain_text("calls-9@gone")
    expect(page.locator("#workers-gone")).to_contain_text("calls-9@gone (pid 4242) since")
    expect(page.locator("li.card", has_text="Workers alive").locator(".n")).to_have_text("1")
    shot(page, "overview-rates")
