"""Dependency keys in the console, in a real browser (Debian's chromium, driven by
Playwright): the Dependencies page linked from the header, live as the other pages are;
a key's page lifting its pause and closing its breaker with a reason, each recorded with
who did it; refusals said; a reader's token gets no buttons; nothing loads from elsewhere.

Its own ``toolq api`` process; the limiter's state is seeded as the claim scripts write it
(tests/integration/test_deps_operator.py's ``seed_dep``).
"""

from __future__ import annotations

import os
import re
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright import sync_api as playwright_api
from playwright.sync_api import expect

from tests.helpers import free_port, start_toolq, stop_process, wait_until
from tests.integration.apps import resolve_app
from tests.integration.test_deps_operator import seed_dep
from toolq import ToolQueue

APP = "tests.integration.apps.resolve_app:tq"
CHROMIUM = os.environ.get("TOOLQ_CHROMIUM", "/usr/bin/chromium")
RESOLVER = "console-resolver-token-0123"
READER = "console-reader-token-012345"
TOKENS = f"{RESOLVER}=approve,resolve,read;{READER}=read"
WHO = re.compile(r"console:token-[0-9a-f]{8}")

expect.set_options(timeout=20_000)


@pytest.fixture(scope="module")
def stack(
    module_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ToolQueue, str]]:
    tq = resolve_app.tq
    tq.configure(redis_url=module_redis_url)
    log = tmp_path_factory.mktemp("console-deps") / "api.log"
    port = free_port()
    with log.open("ab") as out:
        api = start_toolq(
            ["api", "--app", APP, "--redis-url", module_redis_url, "--port", str(port)],
            env={"TOOLQ_API_TOKENS": TOKENS, "TOOLQ_CONSOLE_REFRESH_SECONDS": "1"},
            unset=("TOOLQ_CONSOLE_SESSION_SECRET",),
            stdout=out.fileno(),
            stderr=subprocess.STDOUT,
        )

    def healthy() -> bool:
        assert api.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    try:
        assert wait_until(healthy, timeout=30), log.read_text()
        yield tq, f"http://localhost:{port}"
    finally:
        stop_process(api, timeout=5)
        tq.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        why = f"no chromium at {CHROMIUM}: apt-get install chromium, or TOOLQ_CHROMIUM=/path"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    pw = playwright_api.sync_playwright().start()
    try:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield b
        finally:
            b.close()
    finally:
        pw.stop()


@pytest.fixture
def context(browser: Any, stack: tuple[ToolQueue, str]) -> Iterator[Any]:
    ctx = browser.new_context(base_url=stack[1], viewport={"width": 1280, "height": 900})
    try:
        yield ctx
    finally:
        ctx.close()


def login(ctx: Any, token: str) -> Any:
    page = ctx.new_page()
    page.goto("/ui/login")
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible()
    return page


def test_an_operator_sees_the_keys_live_lifts_a_pause_and_closes_a_breaker(
    context: Any, stack: tuple[ToolQueue, str]
) -> None:
    tq, base = stack
    now = tq.app.now_ms()
    layout = tq.app.topology.layout
    keys = seed_dep(tq.redis, layout, "stripe:acct_1", now, rate="20/s", concurrency=5,
                    paused_until=now + 600_000, pause_code="RATE_LIMITED", breaker="open",
                    open_until=now + 300_000, slots={"a": now + 60_000},
                    waiting={"w1": now + 600_000}, n_admitted=40, n_limited=7)  # fmt: skip
    page = login(context, RESOLVER)
    elsewhere: list[str] = []
    page.on("request", lambda r: None if r.url.startswith(base) else elsewhere.append(r.url))

    # The header links the Dependencies page: each key, its limit, counts, pause, breaker
    page.get_by_role("link", name="dependencies").click()
    expect(page.get_by_role("heading", name="Dependencies")).to_be_visible()
    row = page.locator("#deps-table tr[data-key='stripe:acct_1']")
    expect(row.locator("[data-col=limit]")).to_have_text("20/s, 5 at once")
    expect(row.locator("[data-col=in_flight]")).to_have_text("1")
    expect(row.locator("[data-col=waiting]")).to_have_text("1")
    expect(row.locator("[data-col=paused]")).to_contain_text(re.compile(r"in (9|10) min"))
    expect(row.locator("[data-col=breaker]")).to_have_text("OPEN")
    # live: what the limiter writes shows without a reload
    page.evaluate("window.__sameDocument = true")
    tq.redis.hset(keys.dep("stripe:acct_1"), "n_admitted", "41")
    expect(row.locator("[data-col=admitted]")).to_have_text("41")
    assert page.evaluate("window.__sameDocument") is True

    # The key's page: lifting needs a reason; then the pause is gone, recorded with who
    row.get_by_role("link", name="stripe:acct_1").click()
    expect(page.get_by_role("heading", name="Dependency stripe:acct_1")).to_be_visible()
    expect(page.locator("[data-fact=paused]")).to_contain_text("RATE_LIMITED")
    lift = page.locator("#dep-lift")
    lift.get_by_role("button", name="Lift pause").click()
    assert lift.get_by_label("Reason").evaluate("e => e.validity.valueMissing") is True
    lift.get_by_label("Reason").fill("Stripe's status page says it is over")
    lift.get_by_role("button", name="Lift pause").click()
    expect(page.locator("#flash")).to_contain_text("lift pause by console:token-")
    expect(page.locator("[data-fact=paused]")).to_have_text("-")
    entry = page.locator("#dep-log li").first
    expect(entry).to_contain_text("Stripe's status page says it is over")
    expect(entry).to_contain_text(WHO)
    # lifting again is refused, said, and nothing written
    page.locator("#dep-lift").get_by_label("Reason").fill("again")
    page.locator("#dep-lift").get_by_role("button", name="Lift pause").click()
    expect(page.locator("#flash")).to_contain_text("NOT_PAUSED")
    expect(page.locator("#dep-log li")).to_have_count(1)

    # Closing the breaker
    close = page.locator("#dep-close")
    close.get_by_label("Reason").fill("provider back, probe stuck")
    close.get_by_role("button", name="Close breaker").click()
    expect(page.locator("#flash")).to_contain_text("close breaker by console:token-")
    expect(page.locator("[data-fact=breaker]")).to_contain_text("closed")
    expect(page.locator("#dep-log li")).to_have_count(2)
    view = tq.deps.show("stripe:acct_1")
    assert view.breaker == "closed" and view.paused_until_ms is None
    assert [a.what for a in view.actions] == ["close", "lift"]
    assert elsewhere == []


def test_a_reader_sees_a_key_but_gets_no_buttons_and_an_unknown_key_is_not_found(
    context: Any, stack: tuple[ToolQueue, str]
) -> None:
    tq, _ = stack
    seed_dep(tq.redis, tq.app.topology.layout, "mailer", tq.app.now_ms(), breaker="half_open")
    page = login(context, READER)
    page.goto("/ui/deps/mailer")
    expect(page.locator("[data-fact=breaker]")).to_contain_text("half-open")
    expect(page.locator("#dep-no-scope")).to_contain_text("resolve")
    expect(page.get_by_role("button", name="Close breaker")).to_have_count(0)
    missing = page.goto("/ui/deps/nobody")
    assert missing is not None and missing.status == 404
    expect(page.get_by_text("There is no dependency key by that name.")).to_be_visible()
