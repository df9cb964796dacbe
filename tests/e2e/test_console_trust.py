"""The trust figures on the console (issue 27), in a real browser: the overview's block
and a tool's page show what the test caused on a stack of its own (``toolq api``, a
worker and a scheduler for ``tests/integration/apps/console_app.py``, as
tests/e2e/test_console.py starts them, on this module's database).

The figures' exact arithmetic on a real stack (3 found, 2 not found and run again) is
tests/integration/test_trust.py's; here: they reach the pages, per tool and window.
"""

from __future__ import annotations

import re
from typing import Any

import httpx
from playwright.sync_api import expect

from tests.e2e import test_console as console
from tests.e2e.test_console import OPERATOR, Stack, login, shot
from tests.helpers import wait_until
from toolq.core.states import State
from toolq.edges.api.console.present import recovery_time

# The console tests' fixtures: this module gets a stack (and a browser) of its own.
browser, context, stack = console.browser, console.context, console.stack

#: The ``publish`` writes whose first reply is lost (verified as found), and the
#: charge and the ping that wait for input and for a retry.
LOST = [f"trust/lost/{i}" for i in range(2)]


def cause(st: Stack) -> None:
    tq = st.tq
    # the scheduler's first sample: the baseline of every window
    assert wait_until(lambda: tq.redis.hlen(tq.ledger.keys.series) >= 1, 30)
    for ref in LOST:
        tq.submit("publish", {"text": "lost", "lose_reply": True}, operation_ref=ref)
        tq.approve(ref, by="operator:test")
    tq.submit("charge", {"amount": 0}, operation_ref="trust/input")
    st.until_state("trust/input", State.NEEDS_INPUT)
    tq.provide_input("trust/input", {"amount": 5}, by="operator:test")
    tq.submit("ping", {"host": "trust"}, operation_ref="trust/retry")
    st.until_state("trust/retry", State.WAITING_RETRY)
    tq.retry_now("trust/retry", by="operator:test")
    for ref in [*LOST, "trust/input", "trust/retry"]:
        assert tq.wait(ref, timeout=30).ok, ref
    # a second delivery of a finished attempt, and the same submit again
    queue, message = tq.app.messages.run(LOST[0], 1)
    tq.redis.lpush(queue, message)
    assert wait_until(lambda: tq.ledger.stats().get("publish|duplicates_prevented") == 1, 20)
    assert tq.submit("publish", {"text": "lost", "lose_reply": True}, operation_ref=LOST[0])
    assert tq.ledger.stats().get("publish|duplicate_submits") == 1


def api_trust(st: Stack, window: str) -> dict[str, Any]:
    r = httpx.get(
        f"{st.url}/v1/trust",
        params={"window": window},
        headers={"Authorization": f"Bearer {OPERATOR}"},
    )
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_the_overview_and_the_tool_page_show_the_trust_figures(context: Any, stack: Stack) -> None:
    # Given known outcomes: 2 unknown (found), 1 second delivery, 1 repeated submit,
    # and a stay in each of awaiting_approval, verifying, needs_input, waiting_retry
    cause(stack)
    page = login(context, stack, OPERATOR)

    # Then the overview's block shows them for the tool, over the last hour
    block = page.locator("#trust-table")
    row = block.locator("tr[data-tool='publish']")
    for figure, n in {
        "unknown": 2,
        "found": 2,
        "not_found": 0,
        "unknown_escalated": 0,
        "duplicates_prevented": 2,
        "escalated": 0,
        "resolved_committed": 0,
        "resolved_retry": 0,
    }.items():
        expect(row.locator(f"td[data-figure='{figure}']")).to_have_text(str(n))
    expect(row.locator("td[data-figure='duplicates_prevented']")).to_have_attribute(
        "title", "1 second deliveries refused, 1 repeated submits answered"
    )
    expect(page.locator("#trust-window")).to_contain_text("1h")
    times = page.locator("#recovery-time-table tr[data-tool='publish']")
    figures = api_trust(stack, "1h")["tools"]["publish"]["recovery"]
    for state in ("awaiting_approval", "verifying"):
        assert figures[state]["count"] == 2
        expect(times.locator(f"td[data-state='{state}']")).to_have_text(
            recovery_time(figures[state])
        )
        expect(times.locator(f"td[data-state='{state}']")).to_contain_text("(2 left)")
    charge = page.locator("#recovery-time-table tr[data-tool='charge']")
    expect(charge.locator("td[data-state='needs_input']")).to_contain_text("(1 left)")
    ping = page.locator("#recovery-time-table tr[data-tool='ping']")
    expect(ping.locator("td[data-state='waiting_retry']")).to_contain_text("(1 left)")
    shot(page, "overview-trust")

    # And the window can be changed: the 7 days of a young stack hold the same
    page.locator("#trust-window").get_by_role("link", name="7d").click()
    expect(page).to_have_url(re.compile(r"/ui/\?trust=7d$"))
    expect(page.locator("#trust-window strong")).to_have_text("7d")
    expect(row.locator("td[data-figure='unknown']")).to_have_text("2")

    # And the tool's page shows every window, from the overview's link
    block.get_by_role("link", name="publish").click()
    expect(page).to_have_url(re.compile(r"/ui/tools/publish$"))
    expect(page.get_by_role("heading", name="Tool publish")).to_be_visible()
    table = page.locator("#tool-trust-table")
    for window in ("1h", "24h", "7d"):
        cell = f"td[data-window='{window}']"
        expect(table.locator(f"tr[data-figure='unknown'] {cell}")).to_have_text("2")
        expect(table.locator(f"tr[data-figure='found'] {cell}")).to_have_text("2")
        expect(table.locator(f"tr[data-figure='deliveries_refused'] {cell}")).to_have_text("1")
        expect(table.locator(f"tr[data-figure='submits_deduplicated'] {cell}")).to_have_text("1")
        expect(
            page.locator(f"#tool-recovery-table tr[data-state='verifying'] {cell}")
        ).to_contain_text("(2 left)")
    # live: one more lost reply shows up without a reload
    stack.tq.submit("publish", {"text": "one more", "lose_reply": True}, operation_ref="trust/3")
    stack.tq.approve("trust/3", by="operator:test")
    expect(table.locator("tr[data-figure='found'] td[data-window='1h']")).to_have_text("3")
    shot(page, "tool-trust")

    # A tool that does not exist is a 404 page
    missing = context.new_page()
    answer = missing.goto("/ui/tools/no-such-tool")
    assert answer is not None and answer.status == 404
    expect(missing.get_by_text("There is no tool by that name.")).to_be_visible()
