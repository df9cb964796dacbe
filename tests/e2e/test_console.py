"""The operator's console (``/ui/``) in a real browser: Debian's chromium, driven by Playwright.

One stack for the module: a ``toolq api`` process (which serves the console), a
worker and a scheduler for ``tests/integration/apps/console_app.py``, on this
module's database of the session's Valkey. One browser for the module, a fresh
context (cookies) per test.

Screenshots of each page go to ``tests/artifacts/console/`` (or
``TOOLQ_CONSOLE_SCREENSHOTS``); with ``TOOLQ_UPDATE_SCREENSHOTS=1`` the overview
test also writes ``docs/console-overview.png``, the README's picture.

Chromium missing: the tests fail under CI (``CI`` set), and are skipped, saying
why, elsewhere.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from playwright import sync_api as playwright_api
from playwright.sync_api import expect

from tests.helpers import (
    REPO_ROOT,
    free_port,
    start_scheduler,
    start_toolq,
    start_worker,
    stop_process,
    stop_processes,
    wait_until,
)
from tests.integration.apps import console_app
from tests.integration.apps.console_app import APP, open_gate
from toolq import ToolQueue
from toolq.core.own_envelopes import fixed_envelope
from toolq.core.states import State
from toolq.decisions.recovery.transition import Transition
from toolq.services.scheduler.series import EVERY_S, sample_of

CHROMIUM = os.environ.get("TOOLQ_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(
    os.environ.get("TOOLQ_CONSOLE_SCREENSHOTS") or REPO_ROOT / "tests/artifacts/console"
)
DOCS_SCREENSHOT = REPO_ROOT / "docs" / "console-overview.png"

OPERATOR = "console-operator-token-0123"
READER = "console-reader-token-012345"
TOKENS = f"{OPERATOR}=approve,input,cancel,read;{READER}=read"
#: What the ``charge`` tests send as the provider key: no page may show it.
SECRET = "sk-live-0123456789abcdefCONSOLE"

#: Playwright's assertions wait for their condition up to this long (ms).
expect.set_options(timeout=20_000)


@dataclass
class Stack:
    """The module's processes, and how to reach the console."""

    tq: ToolQueue
    redis_url: str
    port: int
    log: Path
    api: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        # localhost, not 127.0.0.1: the forged page is served from another port of
        # the same host name, so that it is same-site (and gets the cookie).
        return f"http://localhost:{self.port}"

    @property
    def provider(self) -> redis.Redis:
        return self.tq.redis

    def start_api(self) -> None:
        self.api = start_api(self.redis_url, self.port, self.log, {"TOOLQ_API_TOKENS": TOKENS})

    def kill_api(self) -> None:
        assert self.api is not None
        stop_process(self.api, signal.SIGKILL, timeout=5)
        self.api = None

    def state(self, ref: str) -> State:
        rec = self.tq.get(ref)
        assert rec is not None, ref
        return rec.state

    def until_state(self, ref: str, state: State, timeout: float = 30) -> None:
        assert wait_until(lambda: self.state(ref) is state, timeout=timeout), (ref, self.state(ref))


def start_api(redis_url: str, port: int, log: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """``toolq api`` for the console app on ``port``, answering its health check."""
    out = log.open("ab")
    api = start_toolq(
        ["api", "--app", APP, "--redis-url", redis_url, "--port", str(port), "-l", "warning"],
        env={
            "TOOLQ_API_POLL_INTERVAL": "0.5",
            "TOOLQ_API_KEEPALIVE": "5",
            "TOOLQ_CONSOLE_REFRESH_SECONDS": "1",
            **env,
        },
        unset=("TOOLQ_API_TOKENS", "TOOLQ_CONSOLE_SESSION_SECRET"),
        stdout=out.fileno(),
        stderr=subprocess.STDOUT,
    )
    out.close()

    def healthy() -> bool:
        assert api.poll() is None, log.read_text()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    assert wait_until(healthy, timeout=30), log.read_text()
    return api


@pytest.fixture(scope="module")
def stack(module_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tq = console_app.tq
    tq.configure(redis_url=module_redis_url)
    log = tmp_path_factory.mktemp("console") / "api.log"
    procs = [start_worker(APP, module_redis_url), start_scheduler(APP, module_redis_url)]
    s = Stack(tq, module_redis_url, free_port(), log)
    try:
        s.start_api()
        yield s
    finally:
        if s.api is not None:
            stop_process(s.api, timeout=5)
        stop_processes(procs, timeout=5)
        tq.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not Path(CHROMIUM).exists():
        why = (
            f"no chromium at {CHROMIUM}: the console's browser tests need Debian's chromium "
            "(apt-get install chromium; .ci/run does it) or TOOLQ_CHROMIUM=/path/to/chromium"
        )
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
def context(browser: Any, stack: Stack) -> Iterator[Any]:
    ctx = browser.new_context(base_url=stack.url, viewport={"width": 1280, "height": 900})
    try:
        yield ctx
    finally:
        ctx.close()


def login(ctx: Any, stack: Stack, token: str) -> Any:
    """A page of ``ctx`` logged in with ``token``, on the overview."""
    page = ctx.new_page()
    page.goto("/ui/")
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible()
    return page


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def op_url(ref: str) -> str:
    return "/ui/operation?ref=" + urllib.request.quote(ref, safe="")


def timeline_states(page: Any) -> Any:
    """The timeline's "to" cells, for ``expect(...).to_have_text([...])``: it waits for
    the rows, which arrive by their own event, apart from the state's (a CI run read
    the state "running" before the row that says it)."""
    return page.locator("table.timeline tbody tr td:nth-child(5)")


def session_cookie(ctx: Any) -> dict[str, Any]:
    return next(c for c in ctx.cookies() if c["name"] == "toolq_console")


# --------------------------------------------------------------------------- the tests


def test_log_in_with_a_token_sets_a_strict_http_only_cookie_without_it(
    context: Any, stack: Stack
) -> None:
    # A wrong token is refused on the form, with the reason next to the field
    page = context.new_page()
    page.goto("/ui/")
    page.get_by_label("Token").fill("not-a-token-at-all-0000")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_text("That token is not valid.")).to_be_visible()
    expect(page.get_by_label("Token")).to_have_attribute("aria-invalid", "true")
    shot(page, "login")

    page = login(context, stack, OPERATOR)
    cookie = session_cookie(context)
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert cookie["path"] == "/ui"
    assert OPERATOR not in cookie["value"]
    expect(page.get_by_text("Signed in as")).to_contain_text("token-")

    # Logging out ends it: the next page asks for a token again
    page.get_by_role("button", name="Log out").click()
    expect(page).to_have_url(re.compile(r"/ui/login"))
    page.goto("/ui/operations?state=queued")
    expect(page).to_have_url(re.compile(r"/ui/login\?next="))


def test_a_write_goes_queued_running_verifying_succeeded_live_after_approval(
    context: Any, stack: Stack
) -> None:
    # Given a write awaiting approval whose run and verifier wait at gates, and whose
    # first attempt loses its reply
    ref = "console/live-1"
    stack.tq.submit(
        "publish", {"text": "hello", "gate": True, "lose_reply": True}, operation_ref=ref
    )
    page = login(context, stack, OPERATOR)
    page.goto(op_url(ref))
    state = page.locator("#op-state")
    expect(state).to_have_text("awaiting_approval")
    page.evaluate("window.__sameDocument = true")

    # When the operator approves it from the keyboard
    approve = page.get_by_role("button", name="Approve")
    approve.focus()
    page.keyboard.press("Enter")

    # Then the page follows it without a reload: held running at the first gate...
    expect(state).to_have_text("running")
    expect(page.locator("#flash")).to_contain_text("approved")
    expect(timeline_states(page)).to_have_text(["awaiting_approval", "queued", "running"])
    approved_by = page.locator("table.timeline tbody tr").nth(1).locator("td").nth(6)
    expect(approved_by).to_have_text(re.compile(r"^console:token-[0-9a-f]{8}$"))
    shot(page, "operation-running")

    # ...verifying once the reply is lost (the verifier held at its gate)...
    open_gate(stack.provider, ref, "run")
    expect(state).to_have_text("verifying")
    expect(page.locator("#op-body")).to_contain_text("OUTCOME_UNKNOWN")

    # ...and succeeded once the verifier finds the write
    open_gate(stack.provider, ref, "verify")
    expect(state).to_have_text("succeeded")
    expect(page.locator("#op-body")).to_contain_text("found: the write happened")
    expect(page.locator("#op-body pre.json").first).to_contain_text('"ok": true')
    expect(timeline_states(page)).to_have_text(
        ["awaiting_approval", "queued", "running", "verifying", "succeeded"]
    )
    assert page.evaluate("window.__sameDocument") is True
    assert stack.state(ref) is State.SUCCEEDED
    shot(page, "operation-succeeded")


def test_corrected_input_through_the_form_generated_from_the_schema(
    context: Any, stack: Stack
) -> None:
    # Given a charge that needs input (a negative amount), carrying a provider key
    ref = "console/input-1"
    args = {"amount": -5, "currency": "USD", "api_key": SECRET}
    stack.tq.submit("charge", args, operation_ref=ref)
    stack.until_state(ref, State.NEEDS_INPUT)
    page = login(context, stack, OPERATOR)
    page.goto(op_url(ref))
    expect(page.locator("#op-state")).to_have_text("needs_input")

    # The key is never in the page: not in the arguments shown, not in the form
    assert SECRET not in page.content()
    expect(page.locator("#op-body")).to_contain_text('"api_key": "[redacted]"')
    amount = page.get_by_label("amount")
    expect(amount).to_have_value("-5")
    expect(page.get_by_label("currency")).to_have_value('"USD"')
    expect(page.get_by_label("api_key")).to_have_value("")
    expect(page.get_by_text("Leave it empty to keep the current value")).to_be_visible()

    # The same arguments again are refused, saying so
    submit = page.get_by_role("button", name="Submit the corrected arguments")
    submit.click()
    expect(page.get_by_role("alert")).to_contain_text("needed fixing")

    # A value the tool's model refuses is shown by its field
    page.get_by_label("amount").fill("2000000")
    submit.click()
    amount = page.get_by_label("amount")
    expect(amount).to_have_attribute("aria-invalid", "true")
    expect(page.locator(".field.invalid .field-error")).to_contain_text("less than equal")
    expect(amount).to_have_value("2000000")
    shot(page, "operation-input-error")

    # A good one runs: the key kept, the history saying who changed the arguments
    amount.fill("25")
    page.get_by_label("memo").fill("fixed in the console")
    page.get_by_role("button", name="Submit the corrected arguments").click()
    expect(page.locator("#flash")).to_contain_text("new arguments queued")
    expect(page.locator("#op-state")).to_have_text("succeeded")
    rec = stack.tq.get(ref)
    assert rec is not None
    assert rec.args == {
        "amount": 25,
        "currency": "USD",
        "memo": "fixed in the console",
        "api_key": SECRET,
    }
    fixed = next(h for h in rec.history if h.code == "INPUT_PROVIDED")
    assert fixed.by.startswith("console:token-")


def test_verify_now_checks_at_once_instead_of_at_the_next_check(context: Any, stack: Stack) -> None:
    # Given a write whose outcome is unknown and whose first lookup failed: the next
    # check is two minutes away
    ref = "console/verify-1"
    stack.tq.submit("notify", {"text": "hi"}, operation_ref=ref)

    def first_lookup_failed() -> bool:
        return stack.tq.ledger.fields(ref, "vfail").get("vfail") == "1"

    assert wait_until(first_lookup_failed, timeout=30)
    page = login(context, stack, OPERATOR)
    page.goto(op_url(ref))
    expect(page.locator("#op-state")).to_have_text("verifying")

    # When the operator asks for a check now, it is made now and finds the write
    page.get_by_role("button", name="Verify now").click()
    expect(page.locator("#op-state")).to_have_text("succeeded")
    checks = page.locator("#op-verification table")
    expect(checks).to_contain_text("check asked for now by console:token-")
    expect(checks).to_contain_text("found: the write happened")
    shot(page, "operation-verified-now")


def test_a_verifying_operations_page_lists_each_check_and_the_next_ones_time(
    context: Any, stack: Stack
) -> None:
    # Given a write whose outcome is unknown and whose first lookup failed (the
    # scheduled check's verdict, which used to leave no trace)
    ref = "console/verify-2"
    stack.tq.submit("notify", {"text": "hi"}, operation_ref=ref)

    def first_lookup_failed() -> bool:
        return stack.tq.ledger.fields(ref, "vfail").get("vfail") == "1"

    assert wait_until(first_lookup_failed, timeout=30)
    rec = stack.tq.get(ref)
    assert rec is not None
    failed = next(h for h in rec.history if h.note.get("result") == "unavailable")
    # (the first check runs as the window opens: the page below says the window passed
    # only once it has, half a second later)
    window_end = rec.window_end
    assert window_end is not None
    assert wait_until(lambda: time.time() > window_end.timestamp() + 0.05, timeout=10)
    # When the operator opens its page
    page = login(context, stack, READER)
    page.goto(op_url(ref))
    expect(page.locator("#op-state")).to_have_text("verifying")
    # Then it lists the check, with its result and the verifier's safe detail...
    section = page.locator("#op-verification")
    expect(section.get_by_role("heading", name="Verification")).to_be_visible()
    expect(page.locator("#checks-made")).to_have_text("1")
    expect(page.locator("#checks-failed")).to_have_text("1")
    row = section.locator("table tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("verifier unavailable: checks again later")
    expect(row).to_contain_text("UPSTREAM_ERROR")
    expect(row).not_to_contain_text("the lookup failed")  # the verifier's own words
    # ...and the next check's time, counting down to it, and the window's end (passed)
    nxt = page.locator("#next-check time.countdown")
    expect(nxt).to_have_attribute("data-due-ms", failed.note["next"])
    expect(nxt).to_contain_text(re.compile(r"in (1|2) min"))
    expect(page.locator("#window-left")).to_contain_text("passed")
    shot(page, "operation-verification-checks")


def test_a_waiting_retrys_page_says_its_last_failure_and_the_attempts_left(
    context: Any, stack: Stack
) -> None:
    # Given a read rate limited for ten minutes on its first attempt
    ref = "console/why-retry"
    stack.tq.submit("ping", {"host": "why"}, operation_ref=ref)
    stack.until_state(ref, State.WAITING_RETRY)
    # When the operator opens its page, it says why it waits and what is left
    page = login(context, stack, READER)
    page.goto(op_url(ref))
    why = page.locator("#op-why")
    expect(why.get_by_role("heading", name="Why it waits")).to_be_visible()
    expect(page.locator("#last-failure")).to_contain_text("RATE_LIMITED")
    expect(page.locator("#last-failure")).to_contain_text(re.compile(r"retry_after=\d"))
    expect(page.locator("#attempts-left")).to_have_text("1 used, 2 left")
    expect(page.locator("#op-verification")).to_contain_text("No verification check has been made.")
    shot(page, "operation-why-retry")
    # (cancelled: the list tests count what waits to retry)
    assert stack.tq.cancel(ref) is State.CANCELLED


def test_an_escalated_operations_page_says_why_in_words_and_what_was_tried(
    context: Any, stack: Stack
) -> None:
    # Given a read waiting to retry whose budget the scheduler then finds used up (the
    # transition it applies, applied here: waiting ten minutes is not a test)
    ref = "console/why-escalated"
    stack.tq.submit("ping", {"host": "esc"}, operation_ref=ref)
    stack.until_state(ref, State.WAITING_RETRY)
    env = fixed_envelope("ATTEMPTS_EXHAUSTED", ref, "ping", None, {"reason": "RATE_LIMITED"})
    t = Transition(
        ref=ref,
        states=(State.WAITING_RETRY,),
        to=State.ESCALATED,
        by="scheduler",
        code="ATTEMPTS_EXHAUSTED",
        envelope=env,
        remove_due=True,
    )
    assert stack.tq.ledger.apply_one(t, int(time.time() * 1000)) == "ok"
    # When the operator opens its page, it says why, in words, and what was tried
    page = login(context, stack, READER)
    page.goto(op_url(ref))
    expect(page.locator("#op-state")).to_have_text("escalated")
    expect(page.get_by_role("heading", name="Why it was escalated")).to_be_visible()
    reason = page.locator("#escalation-reason")
    expect(reason).to_contain_text("Every attempt its budget allows was used without success.")
    expect(reason).to_contain_text("The last failure: RATE_LIMITED.")
    expect(page.locator("#escalation-tried")).to_have_text(
        "1 of 3 attempts; 0 verification checks, 0 failed"
    )
    shot(page, "operation-why-escalated")


def test_lists_filter_page_and_bulk_retry(context: Any, stack: Stack) -> None:
    # Given three reads waiting ten minutes to retry
    refs = [f"console/bulk-{i}" for i in range(3)]
    for i, ref in enumerate(refs):
        stack.tq.submit("ping", {"host": f"h{i}"}, operation_ref=ref)
    for ref in refs:
        stack.until_state(ref, State.WAITING_RETRY)
    page = login(context, stack, OPERATOR)

    # The list shows them, oldest first, with their retry countdowns
    page.goto("/ui/operations?state=waiting_retry&tool=ping")
    rows = page.locator("table.list tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("RATE_LIMITED")
    expect(rows.first.locator("time.countdown")).to_have_text(re.compile(r"^in \d+ min \d+ s$"))
    shot(page, "list-waiting-retry")

    # The operation page counts down to the retry, and offers to retry now
    page.get_by_role("link", name=refs[0]).click()
    expect(page.locator("#op-head time.countdown")).to_have_text(re.compile(r"^in 9 min \d+ s$"))
    expect(page.get_by_role("button", name="Retry now")).to_be_visible()
    page.go_back()

    # Filters: a code, a ref substring, a bad age (a message, not a trace), pages of two
    page.get_by_label("Code").fill("RATE_LIMITED")
    page.get_by_role("button", name="Apply filters").click()
    expect(rows).to_have_count(3)
    page.get_by_label("Code").fill("rate limited")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.get_by_role("alert")).to_contain_text("UPPER_SNAKE")
    page.get_by_label("Code").fill("")
    page.get_by_label("Ref contains").fill("bulk-1")
    page.get_by_role("button", name="Apply filters").click()
    expect(rows).to_have_count(1)
    page.get_by_label("Older than").fill("soon")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.get_by_role("alert")).to_contain_text("older than: write a number of seconds")
    expect(page.locator(".field.invalid")).to_contain_text("90s, 5m, 2h, 1d")
    expect(page.get_by_label("Older than")).to_have_attribute("aria-invalid", "true")
    shot(page, "list-bad-filter")
    page.goto("/ui/operations?state=waiting_retry&tool=ping&limit=2")
    expect(rows).to_have_count(2)
    page.get_by_role("link", name="Next page").click()
    expect(rows).to_have_count(1)

    # When the operator selects them all (from the keyboard) and retries now
    page.goto("/ui/operations?state=waiting_retry&tool=ping")
    select_all = page.get_by_label("Select every operation on this page")
    select_all.focus()
    page.keyboard.press("Space")
    for ref in refs:
        expect(page.get_by_label(f"Select {ref}")).to_be_checked()
    page.get_by_role("button", name="Retry now").click()

    # Then each runs again at once, same ref, attempt counted, recorded as the console's
    expect(page.locator("#flash")).to_contain_text("Retry now: 3 of 3 due now.")
    for ref in refs:
        stack.until_state(ref, State.SUCCEEDED)
        rec = stack.tq.get(ref)
        assert rec is not None and rec.attempt == 2
        retried = next(h for h in rec.history if h.code == "RETRY_NOW")
        assert retried.by.startswith("console:token-")
    # and the list empties by itself, without a reload
    expect(page.get_by_text("No operation matches the filters.")).to_be_visible()


def test_a_token_without_the_scope_is_refused(context: Any, stack: Stack) -> None:
    ref = "console/scope-1"
    stack.tq.submit("publish", {"text": "not yours"}, operation_ref=ref)
    page = login(context, stack, READER)
    page.goto(op_url(ref))
    expect(page.locator("#op-state")).to_have_text("awaiting_approval")
    # No button it cannot use; the page says which scope it would need
    expect(page.get_by_role("button", name="Approve")).to_have_count(0)
    expect(page.get_by_text("Approve needs the approve scope")).to_be_visible()
    shot(page, "operation-read-only")
    # nor on the list: no boxes to tick, and the same word on why
    page.goto("/ui/operations?state=awaiting_approval")
    expect(page.get_by_text("Approve needs the approve scope")).to_be_visible()
    expect(page.get_by_role("checkbox")).to_have_count(0)
    page.goto(op_url(ref))

    # A form posted from this very page (right CSRF token, same origin) is still refused
    page.evaluate(
        """(ref) => {
            const f = document.createElement('form');
            f.method = 'post';
            f.action = document.body.dataset.base + '/actions/approve';
            for (const [k, v] of [['ref', ref],
                                  ['csrf', document.querySelector('input[name=csrf]').value]]) {
                const i = document.createElement('input');
                i.type = 'hidden'; i.name = k; i.value = v; f.append(i);
            }
            document.body.append(f);
            f.submit();
        }""",
        ref,
    )
    expect(page.get_by_role("heading", name="Not allowed")).to_be_visible()
    expect(page.get_by_text("does not have the approve scope")).to_be_visible()
    assert stack.state(ref) is State.AWAITING_APPROVAL


class _Forged(BaseHTTPRequestHandler):
    """Another site's page: a form that posts to the console as soon as it loads."""

    target = ""
    ref = ""

    def do_GET(self) -> None:
        body = f"""<!doctype html><title>cute cats</title>
<form id="f" method="post" action="{self.target}/ui/actions/cancel">
<input type="hidden" name="ref" value="{self.ref}"></form>
<script>document.getElementById('f').submit()</script>""".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def test_a_forged_cross_site_post_is_refused(context: Any, stack: Stack) -> None:
    # Given an operator logged in, and two operations awaiting approval
    target, control = "console/forged-1", "console/forged-2"
    for ref in (target, control):
        stack.tq.submit("publish", {"text": "keep me"}, operation_ref=ref)
    page = login(context, stack, OPERATOR)
    page.goto(op_url(target))
    csrf = page.locator("input[name=csrf]").first.input_value()
    cookie = f"toolq_console={session_cookie(context)['value']}"

    # When a page on another port of the same host (same site: the cookie goes along)
    # posts a cancel form to the console
    handler = type("Forged", (_Forged,), {"target": stack.url, "ref": target})
    evil = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=evil.serve_forever, daemon=True)
    thread.start()
    try:
        forged = context.new_page()
        forged.goto(f"http://localhost:{evil.server_address[1]}/")
        # Then it is refused, and nothing changed
        expect(forged.get_by_role("heading", name="Refused")).to_be_visible()
        # the cookie did go along (same site): the checks behind it refused
        expect(forged.get_by_text("Signed in as")).to_be_visible()
        shot(forged, "forged-post-refused")
    finally:
        evil.shutdown()
        evil.server_close()
        thread.join(timeout=5)
    assert stack.state(target) is State.AWAITING_APPROVAL

    with httpx.Client(base_url=stack.url, headers={"Cookie": cookie}) as client:
        form = {"ref": target, "csrf": csrf}
        # the session cookie and the right token, but from a foreign origin
        r = client.post("/ui/actions/cancel", data=form, headers={"Origin": "http://localhost:1"})
        assert r.status_code == 403 and "another origin" in r.text
        # ... or marked cross-site by the browser
        r = client.post("/ui/actions/cancel", data=form, headers={"Sec-Fetch-Site": "cross-site"})
        assert r.status_code == 403
        # the session cookie, same origin, but no CSRF token or a wrong one
        for data in ({"ref": target}, {"ref": target, "csrf": csrf[:-2] + "xx"}):
            r = client.post("/ui/actions/cancel", data=data, headers={"Origin": stack.url})
            assert r.status_code == 403 and "out of date" in r.text
        assert stack.state(target) is State.AWAITING_APPROVAL
        # the same request with everything right does cancel (the control)
        r = client.post(
            "/ui/actions/cancel",
            data={"ref": control, "csrf": csrf},
            headers={"Origin": stack.url, "Sec-Fetch-Site": "same-origin"},
        )
        assert r.status_code == 303, r.text
    assert stack.state(control) is State.CANCELLED
    rec = stack.tq.get(control)
    assert rec is not None and rec.history[-1].by.startswith("console:token-")


def test_unknown_ref_and_unknown_page_answer_404_pages(context: Any, stack: Stack) -> None:
    page = login(context, stack, OPERATOR)
    response = page.goto(op_url("console/no-such-op"))
    assert response is not None and response.status == 404
    expect(page.get_by_text("There is no operation with that ref.")).to_be_visible()
    shot(page, "not-found")
    response = page.goto("/ui/no/such/page")
    assert response is not None and response.status == 404
    response = page.goto("/ui/operations?state=nonsense&limit=0")
    assert response is not None and response.status == 422
    expect(page.get_by_role("alert")).to_contain_text("limit")
    assert "Traceback" not in page.content()


def _seed_series(stack: Stack, hours: float = 3.0) -> int:
    """Three hours of the scheduler's samples, for the chart (as its Sampler writes them)."""
    now_ms = int(stack.tq.clock() * 1000)
    every = EVERY_S * 1000
    key = stack.tq.ledger.keys.series
    totals = {"submitted": 0, "succeeded": 0, "failed": 0, "escalated": 0}
    n = int(hours * 3600 / EVERY_S)
    fields: dict[str, str] = {}
    for k in range(n, -1, -1):
        at = (now_ms // every - k) * every
        wave = 1 + math.sin(k / 17)
        totals["submitted"] += int(30 + 25 * wave)
        totals["succeeded"] += int(28 + 24 * wave)
        totals["failed"] += k % 7 == 0
        totals["escalated"] += k % 23 == 0
        stats = {f"any|{name}": v for name, v in totals.items()}
        sizes = {"waiting_retry": int(6 * wave), "verifying": k % 4, "needs_input": 1}
        fields[str(at)] = json.dumps(sample_of(stats, sizes, at))
    stack.provider.hset(key, mapping=fields)
    return n


def test_overview_counts_pending_recovery_and_draws_the_chart(context: Any, stack: Stack) -> None:
    # Given operations in several states (earlier tests left some) and samples to chart
    stack.tq.submit("publish", {"text": "waits"}, operation_ref="console/overview-approval")
    stack.tq.submit("charge", {"amount": 0}, operation_ref="console/overview-input")
    stack.tq.submit("ping", {"host": "overview"}, operation_ref="console/overview-retry")
    stack.until_state("console/overview-input", State.NEEDS_INPUT)
    stack.until_state("console/overview-retry", State.WAITING_RETRY)
    _seed_series(stack)
    page = login(context, stack, OPERATOR)

    pending = page.locator("ul.cards").first
    approval = pending.locator("li", has_text="awaiting_approval")
    expect(approval.locator(".n")).to_have_text(str(_count(stack, State.AWAITING_APPROVAL)))
    expect(approval).to_contain_text("Oldest:")
    expect(page.get_by_text("Schedulers alive")).to_be_visible()
    workers = page.locator("li.card", has_text="Workers alive")
    expect(workers.locator(".n")).to_have_text("1")
    # Per tool and state: every state written out, a link to each non-empty list
    table = page.locator("table", has=page.get_by_role("columnheader", name="needs_input"))
    expect(table.get_by_role("link", name="1 charge needs_input")).to_be_visible()
    # The chart draws a line per series from the scheduler's samples
    expect(page.locator("figure.chart polyline")).to_have_count(9)
    expect(page.locator("figure.chart").first).to_contain_text("submitted: now")

    # Live: a new operation shows up without a reload
    before = _count(stack, State.AWAITING_APPROVAL)
    stack.tq.submit("publish", {"text": "one more"}, operation_ref="console/overview-approval-2")
    expect(approval.locator(".n")).to_have_text(str(before + 1))
    shot(page, "overview")
    if os.environ.get("TOOLQ_UPDATE_SCREENSHOTS"):
        DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(DOCS_SCREENSHOT), full_page=False)


def _count(stack: Stack, state: State) -> int:
    page = stack.tq.list_operations(str(state), limit=500)
    return len(page.items)


def test_pages_recover_when_the_server_restarts(context: Any, stack: Stack) -> None:
    # Given an operation page and the overview open, the operation awaiting approval
    ref = "console/restart-1"
    stack.tq.submit("publish", {"text": "after the restart"}, operation_ref=ref)
    page = login(context, stack, OPERATOR)
    overview = page
    op_page = context.new_page()
    op_page.goto(op_url(ref))
    expect(op_page.locator("#op-state")).to_have_text("awaiting_approval")
    op_page.evaluate("window.__sameDocument = true")

    # When the API process dies, both pages say they are reconnecting
    stack.kill_api()
    for p in (overview, op_page):
        expect(p.locator("#connection")).to_be_visible()
    shot(op_page, "reconnecting")

    # And once it is back, both carry on by themselves (the session still holds)
    stack.start_api()
    for p in (overview, op_page):
        expect(p.locator("#connection")).to_be_hidden()
    stack.tq.approve(ref, by="operator:test")
    expect(op_page.locator("#op-state")).to_have_text("succeeded")
    assert op_page.evaluate("window.__sameDocument") is True


def test_without_tokens_the_console_serves_loopback_without_a_login(
    browser: Any, stack: Stack, tmp_path: Path
) -> None:
    # Given an API started without tokens (so on loopback only)
    port = free_port()
    api = start_api(stack.redis_url, port, tmp_path / "api.log", {})
    ctx = browser.new_context(base_url=f"http://127.0.0.1:{port}")
    try:
        page = ctx.new_page()
        page.goto("/ui/")
        # Then there is no login, and nothing to log out of
        expect(page.get_by_role("heading", name="Overview", exact=True)).to_be_visible()
        expect(page.get_by_text("Signed in as")).to_contain_text("local")
        expect(page.get_by_role("button", name="Log out")).to_have_count(0)

        # And actions are CSRF-checked all the same, and recorded as the console's
        ref = "console/local-1"
        stack.tq.submit("publish", {"text": "local"}, operation_ref=ref)
        page.goto(op_url(ref))
        page.get_by_role("button", name="Approve").click()
        expect(page.locator("#op-state")).to_have_text("succeeded")
        rec = stack.tq.get(ref)
        assert rec is not None and rec.history[1].by == "console:local"
        r = httpx.post(f"http://127.0.0.1:{port}/ui/actions/cancel", data={"ref": ref})
        assert r.status_code == 403
    finally:
        ctx.close()
        stop_process(api, timeout=5)
