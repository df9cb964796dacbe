"""Settling escalated operations from the console, in a real browser (Debian's chromium,
driven by Playwright): resolved as committed, as not committed, and retried, each shown
with who did it; the reader's token is refused.

Its own stack (a ``toolq api`` process serving the console, a worker and a scheduler for
``tests/integration/apps/resolve_app.py``), as tests/e2e/test_console.py has for its app.
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

from tests.helpers import (
    REPO_ROOT,
    free_port,
    start_scheduler,
    start_toolq,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.apps import resolve_app
from toolq import ToolQueue
from toolq.core.envelope import ToolError, ToolSuccess
from toolq.core.states import State

APP = "tests.integration.apps.resolve_app:tq"
CHROMIUM = os.environ.get("TOOLQ_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(
    os.environ.get("TOOLQ_CONSOLE_SCREENSHOTS") or REPO_ROOT / "tests/artifacts/console"
)
RESOLVER = "console-resolver-token-0123"
APPROVER = "console-approver-token-012"
READER = "console-reader-token-012345"
TOKENS = f"{RESOLVER}=approve,resolve,read;{APPROVER}=approve,input,cancel,read;{READER}=read"
WHO = re.compile(r"console:token-[0-9a-f]{8}")

expect.set_options(timeout=20_000)


@pytest.fixture(scope="module")
def stack(
    module_redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ToolQueue, str]]:
    tq = resolve_app.tq
    tq.configure(redis_url=module_redis_url)
    log = tmp_path_factory.mktemp("console-resolve") / "api.log"
    port = free_port()
    procs = [start_worker(APP, module_redis_url), start_scheduler(APP, module_redis_url)]
    with log.open("ab") as out:
        api = start_toolq(
            ["api", "--app", APP, "--redis-url", module_redis_url, "--port", str(port)],
            env={"TOOLQ_API_TOKENS": TOKENS, "TOOLQ_CONSOLE_REFRESH_SECONDS": "1"},
            unset=("TOOLQ_CONSOLE_SESSION_SECRET",),
            stdout=out.fileno(),
            stderr=subprocess.STDOUT,
        )
    procs.append(api)

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
        stop_processes(procs, timeout=5)
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


def escalated(tq: ToolQueue, ref: str, mode: str) -> None:
    tq.submit("transfer", {"mode": mode}, operation_ref=ref)
    env = tq.wait(ref, timeout=30)
    assert isinstance(env, ToolError) and env.next_action == "escalate", env


def open_op(page: Any, ref: str) -> None:
    page.goto("/ui/operation?ref=" + urllib.request.quote(ref, safe=""))
    expect(page.locator("#op-state")).to_have_text("escalated")


def writes(tq: ToolQueue, ref: str) -> list[int]:
    return [int(x) for x in tq.redis.lrange(f"provider:writes:{ref}", 0, -1)]


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def test_the_three_resolutions_from_the_console_each_shown_with_who(
    context: Any, stack: tuple[ToolQueue, str]
) -> None:
    tq, _ = stack
    escalated(tq, "ui/committed", "lost_reply")
    escalated(tq, "ui/not", "exhaust")
    escalated(tq, "ui/retry", "lost_request")
    page = login(context, RESOLVER)

    # Resolve as committed: a reason is required; then with a reference, it succeeds
    open_op(page, "ui/committed")
    expect(page.get_by_text("Nothing to do while it is escalated")).to_have_count(0)
    shot(page, "operation-escalated")
    form = page.locator("#resolve-committed")
    form.get_by_label("Reference at the provider").fill("tr_500")
    form.get_by_role("button", name="Resolve as committed").click()
    # the browser asks for the reason before anything is sent
    assert form.get_by_label("Reason").evaluate("e => e.validity.valueMissing") is True
    form.get_by_label("Reason").fill("found tr_500 in the provider's dashboard")
    form.get_by_role("button", name="Resolve as committed").click()
    expect(page.locator("#op-state")).to_have_text("succeeded")
    settled = page.locator("ul.resolutions li")
    expect(settled).to_have_count(1)
    expect(settled).to_contain_text("resolved as committed by")
    expect(settled).to_contain_text("found tr_500 in the provider's dashboard")
    expect(settled.locator(".who")).to_have_text(WHO)
    expect(page.locator("#op-body")).to_contain_text('"evidence_ref": "operator:console:token-')
    expect(page.locator("#flash")).to_contain_text("resolve as committed by console:token-")
    env = tq.wait("ui/committed", timeout=5)
    assert isinstance(env, ToolSuccess) and env.result == {"reference": "tr_500"}
    assert writes(tq, "ui/committed") == [1]
    shot(page, "operation-resolved-committed")

    # Resolve as not committed
    open_op(page, "ui/not")
    form = page.locator("#resolve-not_committed")
    form.get_by_label("Reason").fill("no such transfer at the provider")
    form.get_by_role("button", name="Resolve as not committed").click()
    expect(page.locator("#op-state")).to_have_text("failed")
    expect(page.locator("ul.resolutions li")).to_contain_text("resolved as not committed by")
    expect(page.locator("ul.resolutions li .who")).to_have_text(WHO)
    assert tq.get("ui/not").state is State.FAILED  # type: ignore[union-attr]

    # Retry: the page follows the new attempt to succeeded; one write, same ref
    open_op(page, "ui/retry")
    page.evaluate("window.__sameDocument = true")
    expect(page.locator("#resolve-retry")).to_contain_text("Operator retries used: 0 of 2")
    form = page.locator("#resolve-retry")
    form.get_by_label("Reason").fill("nothing at the provider; sending again")
    form.get_by_role("button", name="Retry").click()
    expect(page.locator("#op-state")).to_have_text("succeeded")
    retried = page.locator("ul.resolutions li")
    expect(retried).to_contain_text("retried by")
    expect(retried).to_contain_text("nothing at the provider; sending again")
    expect(retried.locator(".who")).to_have_text(WHO)
    assert writes(tq, "ui/retry") == [2]
    rec = tq.get("ui/retry")
    assert rec is not None and rec.operation_ref == "ui/retry" and rec.operator_retries == 1
    assert page.evaluate("window.__sameDocument") is True
    shot(page, "operation-retried")


def test_a_stale_page_and_the_wrong_scope_are_refused(
    context: Any, stack: tuple[ToolQueue, str]
) -> None:
    tq, _ = stack
    escalated(tq, "ui/stale", "exhaust")

    # An approver's token may not settle: the page says which scope it needs
    page = login(context, APPROVER)
    open_op(page, "ui/stale")
    expect(page.get_by_text("needs the resolve scope")).to_be_visible()
    expect(page.locator("form.resolve-form")).to_have_count(0)
    # A form posted from this very page (right CSRF token, same origin) is refused too
    page.evaluate(
        """(ref) => {
            const f = document.createElement('form');
            f.method = 'post';
            f.action = document.body.dataset.base + '/actions/resolve';
            for (const [k, v] of [['ref', ref], ['outcome', 'not_committed'],
                                  ['reason', 'not mine to say'],
                                  ['csrf', document.querySelector('input[name=csrf]').value]]) {
                const i = document.createElement('input');
                i.type = 'hidden'; i.name = k; i.value = v; f.append(i);
            }
            document.body.append(f);
            f.submit();
        }""",
        "ui/stale",
    )
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.get_by_text("does not have the resolve scope")).to_be_visible()
    assert tq.get("ui/stale").state is State.ESCALATED  # type: ignore[union-attr]

    # A resolver's page that is out of date (retried meanwhile, escalated again) is refused
    page = login(context, RESOLVER)
    open_op(page, "ui/stale")
    tq.resolve("ui/stale", "retry", reason="retried elsewhere", by="operator:dana")
    assert wait_until(lambda: tq.get("ui/stale").state is State.ESCALATED, 30)  # type: ignore[union-attr]
    form = page.locator("#resolve-not_committed")
    form.get_by_label("Reason").fill("nothing there")
    form.get_by_role("button", name="Resolve as not committed").click()
    expect(page.locator("#flash")).to_contain_text("STALE_REVISION")
    assert tq.get("ui/stale").state is State.ESCALATED  # type: ignore[union-attr]
