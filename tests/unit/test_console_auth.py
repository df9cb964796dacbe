"""The console's sessions, CSRF tokens and cross-site checks (pure), and the login and
refusals of its routes in process (Starlette's TestClient; nothing here reaches Redis)."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from starlette.testclient import TestClient

from toolq import ToolQueue
from toolq.edges.api import ApiSettings, Tokens, create_app
from toolq.edges.api.auth import SCOPES, token_id
from toolq.edges.api.console.session import (
    COOKIE,
    Session,
    Signer,
    actor,
    cross_site_refusal,
    scopes_of,
    signing_key,
)

OPERATOR = "operator-token-0123456789"
READER = "reader-token-0123456789ab"
TOKENS = Tokens.parse(f"{OPERATOR}=approve,input,cancel,read;{READER}=read")
NOW = 1_800_000_000.0


def signer() -> Signer:
    return Signer(signing_key(TOKENS, None))


# --------------------------------------------------------------------------- sessions


def test_a_session_cookie_reads_back_and_holds_no_token() -> None:
    s = signer()
    session, cookie = s.issue(token_id(OPERATOR.encode()), NOW, hours=1)
    assert s.read(cookie, NOW + 10) == session
    assert OPERATOR not in cookie
    assert session.token_id not in OPERATOR
    assert actor(session) == f"console:token-{session.token_id[:8]}"
    assert actor(None) == "console:local"


def test_each_login_gets_a_new_nonce_and_so_a_new_csrf_token() -> None:
    s = signer()
    a, _ = s.issue("x", NOW, 1)
    b, _ = s.issue("x", NOW, 1)
    assert a.nonce != b.nonce
    assert s.csrf(a) != s.csrf(b)


def _flip(text: str, at: int) -> str:
    return text[:at] + ("A" if text[at] != "A" else "B") + text[at + 1 :]


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda c: _flip(c, 5), "payload changed"),
        (lambda c: _flip(c, len(c) - 3), "mac changed"),
        (lambda c: "v2" + c[2:], "another version"),
        (lambda c: c.rsplit(".", 1)[0], "no mac"),
        (lambda c: c + "x" * 2000, "too long"),
        (lambda c: "", "empty"),
        (lambda c: "garbage", "garbage"),
        (lambda c: "v1.%%%.%%%", "not base64"),
    ],
)
def test_a_forged_or_broken_cookie_is_no_session(change: object, why: str) -> None:
    s = signer()
    _session, cookie = s.issue("abc", NOW, 1)
    assert callable(change)
    assert s.read(change(cookie), NOW) is None, why


def test_a_cookie_signed_with_another_key_or_expired_is_no_session() -> None:
    _session, cookie = signer().issue("abc", NOW, 1)
    other = Signer(signing_key(Tokens.parse(f"{OPERATOR}=read"), None))
    assert other.read(cookie, NOW) is None
    assert signer().read(cookie, NOW + 3600) is None
    assert signer().read(cookie, NOW + 3599) is not None


def test_the_key_is_shared_by_replicas_with_the_same_tokens_and_by_no_one_else() -> None:
    same = Tokens.parse(f"{READER}=read;{OPERATOR}=approve,input,cancel,read")
    assert signing_key(same, None) == signing_key(TOKENS, None)  # the order does not matter
    assert signing_key(Tokens.parse(f"{OPERATOR}=*"), None) != signing_key(TOKENS, None)
    assert signing_key(TOKENS, "a-secret") == signing_key(Tokens(), "a-secret")
    assert signing_key(TOKENS, "a-secret") != signing_key(TOKENS, None)
    # without tokens or a secret: a key of the process's own
    assert signing_key(Tokens(), None) != signing_key(Tokens(), None)


def test_scopes_come_from_the_current_token_table_not_the_cookie() -> None:
    reader = Session("n", token_id(READER.encode()), int(NOW) + 60)
    assert scopes_of(TOKENS, reader) == frozenset({"read"})
    assert scopes_of(TOKENS, Session("n", "", int(NOW) + 60)) is None  # anonymous
    assert scopes_of(TOKENS, None) is None
    # the token removed from the table: its sessions end
    assert scopes_of(Tokens.parse(f"{OPERATOR}=*"), reader) is None
    # no tokens at all (loopback only): everything
    assert scopes_of(Tokens(), None) == SCOPES


def test_csrf_token_matches_only_its_session() -> None:
    s = signer()
    a, _ = s.issue("x", NOW, 1)
    b, _ = s.issue("x", NOW, 1)
    assert s.csrf_ok(a, s.csrf(a))
    assert not s.csrf_ok(a, s.csrf(b))
    assert not s.csrf_ok(None, s.csrf(a))
    assert not s.csrf_ok(a, None)
    assert not s.csrf_ok(a, "")
    assert not s.csrf_ok(a, s.csrf(a) + "x" * 200)


def test_flash_messages_are_signed_and_short_lived() -> None:
    s = signer()
    cookie = s.flash([("ok", "done"), ("error", "nope")], NOW)
    assert s.read_flash(cookie, NOW + 30) == [("ok", "done"), ("error", "nope")]
    # A bulk action's refusals, one per ref: they took the cookie past what was read
    # back (1,024) from five on, and the next page showed none of them
    refused = [
        ("error", f"Cancel refused for run_{i:04}/{'x' * 150}: no such ref") for i in range(8)
    ]
    assert s.read_flash(s.flash([("ok", "Cancel: 2 of 10 cancelled."), *refused], NOW), NOW) == [
        ("ok", "Cancel: 2 of 10 cancelled."),
        *refused,
    ]
    # More than a browser keeps: the first ones, then how many more there were
    many = s.flash([("ok", "y" * 400), *[("error", "\u00e9" * 300)] * 30], NOW)
    assert len(many) <= 4000
    shown = s.read_flash(many, NOW)
    assert shown[0] == ("ok", "y" * 400) and 1 < len(shown) < 20
    assert shown[-1] == ("error", f"… and {31 - len(shown) + 1} more not shown.")
    assert s.read_flash(cookie, NOW + 61) == []
    assert s.read_flash(_flip(cookie, 6), NOW) == []
    # a session cookie is not a flash cookie, nor the other way round
    _session, session_cookie = s.issue("x", NOW, 1)
    assert s.read_flash(session_cookie, NOW) == []
    assert s.read(cookie, NOW) is None


# --------------------------------------------------------------------------- cross-site

HOST = "localhost:8000"


@pytest.mark.parametrize(
    ("headers", "host", "refused"),
    [
        ({}, HOST, False),  # not a browser: the CSRF token decides
        ({"sec-fetch-site": "same-origin"}, HOST, False),
        ({"sec-fetch-site": "same-site"}, HOST, True),  # another port: SameSite lets it by
        ({"sec-fetch-site": "cross-site"}, HOST, True),
        ({"sec-fetch-site": "none"}, HOST, True),
        ({"origin": "http://localhost:8000"}, HOST, False),
        ({"origin": "http://LOCALHOST:8000"}, HOST, False),
        ({"origin": "http://localhost:8001"}, HOST, True),
        ({"origin": "http://evil.example"}, HOST, True),
        ({"origin": "null"}, HOST, True),
        ({"origin": "file://"}, HOST, True),
        ({"origin": "http://user@localhost:8000"}, HOST, True),
        ({"origin": "garbage"}, HOST, True),
        ({"origin": "https://toolq.internal"}, "toolq.internal", False),  # behind TLS
        ({"origin": "http://toolq.internal:80"}, "toolq.internal", False),
        ({"origin": "https://toolq.internal:443"}, "toolq.internal:443", False),
        ({"origin": "http://[::1]:8000"}, "[::1]:8000", False),
        ({"origin": "http://[::1]:8001"}, "[::1]:8000", True),
        ({"origin": "http://localhost:8000"}, None, True),
        ({"origin": "http://localhost:8000", "sec-fetch-site": "cross-site"}, HOST, True),
    ],
)
def test_cross_site_refusal(headers: dict[str, str], host: str | None, refused: bool) -> None:
    assert (cross_site_refusal(headers, host) is not None) is refused


# --------------------------------------------------------------------------- the routes, in process


@pytest.fixture
def client() -> Iterator[TestClient]:
    # Never connected: every request below is answered before the ledger is read.
    tq = ToolQueue(redis_url="redis://127.0.0.1:9/0", name="console-unit")
    app = create_app(tq, ApiSettings(tokens=f"{OPERATOR}=*;{READER}=read"))
    with TestClient(
        app, base_url="http://localhost:8000", client=("127.0.0.1", 5000), follow_redirects=False
    ) as c:
        yield c


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match is not None, html
    return match.group(1)


def _login(c: TestClient, token: str) -> str:
    """Log in; the CSRF token of the new session."""
    page = c.get("/ui/login")
    r = c.post("/ui/login", data={"csrf": _csrf(page.text), "token": token, "next": "/ui/x"})
    assert r.status_code == 303 and r.headers["location"] == "/ui/x"
    return _csrf(c.get("/ui/login").text)


def test_pages_need_a_login_and_it_sets_a_strict_http_only_cookie(client: TestClient) -> None:
    r = client.get("/ui/operations?state=queued")
    assert r.status_code == 303
    assert r.headers["location"] == "/ui/login?next=%2Fui%2Foperations%3Fstate%3Dqueued"
    assert client.get("/ui/overview/live").status_code == 401  # the page's script logs in again
    page = client.get("/ui/login")
    assert page.status_code == 200
    assert "default-src 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    bad = client.post("/ui/login", data={"csrf": _csrf(page.text), "token": "wrong-token-000000"})
    assert bad.status_code == 401 and "That token is not valid." in bad.text
    r = client.post("/ui/login", data={"csrf": _csrf(page.text), "token": OPERATOR})
    assert r.status_code == 303 and r.headers["location"] == "/ui/"
    cookie = next(h for h in r.headers.get_list("set-cookie") if h.startswith(f"{COOKIE}="))
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/ui" in cookie
    assert OPERATOR not in cookie


def test_login_refuses_a_missing_csrf_token_and_an_open_redirect(client: TestClient) -> None:
    assert client.post("/ui/login", data={"token": OPERATOR}).status_code == 403
    for target in ("https://evil.example/", "//evil.example/", "/elsewhere"):
        # each login makes a new session: the form's token is the one of the page before it
        form = {"csrf": _csrf(client.get("/ui/login").text), "token": OPERATOR, "next": target}
        r = client.post("/ui/login", data=form)
        assert r.headers["location"] == "/ui/", target


def test_actions_need_csrf_the_same_origin_and_the_scope(client: TestClient) -> None:
    csrf = _login(client, READER)
    same = {"Origin": "http://localhost:8000"}
    form = {"ref": "r1", "csrf": csrf}
    # refused before anything is read: no CSRF token, a wrong one, another origin
    r = client.post("/ui/actions/approve", data={"ref": "r1"}, headers=same)
    assert r.status_code == 403 and "out of date" in r.text
    r = client.post("/ui/actions/approve", data={"ref": "r1", "csrf": "x" * 43}, headers=same)
    assert r.status_code == 403
    r = client.post("/ui/actions/approve", data=form, headers={"Origin": "http://localhost:9"})
    assert r.status_code == 403 and "another origin" in r.text
    # the right token from the right page: but this token may only read
    r = client.post("/ui/actions/approve", data=form, headers=same)
    assert r.status_code == 403 and "does not have the approve scope" in r.text
    r = client.post("/ui/actions/bulk", data={**form, "action": "cancel"}, headers=same)
    assert r.status_code == 403 and "does not have the cancel scope" in r.text
    r = client.post("/ui/actions/input", data=form, headers=same)
    assert r.status_code == 403 and "input scope" in r.text
    # the page's script gets the same refusals as JSON
    r = client.post("/ui/actions/approve", data=form, headers={**same, "X-Requested-With": "fetch"})
    assert r.status_code == 403 and r.json()["ok"] is False


def test_logout_needs_csrf_and_ends_the_session_cookie(client: TestClient) -> None:
    csrf = _login(client, OPERATOR)
    assert client.post("/ui/logout", data={}).status_code == 403
    r = client.post("/ui/logout", data={"csrf": csrf})
    assert r.status_code == 303 and r.headers["location"] == "/ui/login"
    assert any(h.startswith(f'{COOKIE}=""') for h in r.headers.get_list("set-cookie"))


def test_unknown_pages_are_html_404s_and_static_assets_are_served(client: TestClient) -> None:
    r = client.get("/ui/no/such/page")
    assert r.status_code == 404 and "There is no such page." in r.text
    assert client.get("/ui/static/console.js").status_code == 200
    assert client.get("/ui/static/console.css").headers["content-type"].startswith("text/css")
    assert client.get("/ui").status_code == 308
    r = client.delete("/ui/operations")
    assert r.status_code == 405 and "not allowed" in r.text
    assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}  # it had none


def test_without_tokens_only_loopback_clients_are_served() -> None:
    tq = ToolQueue(redis_url="redis://127.0.0.1:9/0", name="console-unit")
    app = create_app(tq, ApiSettings())
    with TestClient(app, base_url="http://localhost:8000", client=("192.0.2.7", 5000)) as c:
        r = c.get("/ui/operations?state=queued")
        assert r.status_code == 403 and "loopback only" in r.text
    with TestClient(app, base_url="http://localhost:8000", client=("127.0.0.1", 5000)) as c:
        assert c.get("/ui/login", follow_redirects=False).headers["location"] == "/ui/"
        # no login, but still no action without the CSRF token of the session
        r = c.post("/ui/actions/cancel", data={"ref": "r1"})
        assert r.status_code == 403


def test_a_non_ascii_cookie_or_csrf_token_is_refused_not_a_crash(client: TestClient) -> None:
    # hmac.compare_digest raises TypeError on a str that is not ASCII: a junk cookie (any
    # page of this host may set one for /ui) must not make every page a 500.
    junk = {"cookie": f"{COOKIE}=v1.abc.\xe9".encode("latin-1")}
    r = client.get("/ui/login", headers=junk)  # type: ignore[arg-type]
    assert r.status_code == 200 and "Log in" in r.text
    assert signer().read("v1.abc.\xe9", NOW) is None
    page = client.get("/ui/login")
    r = client.post("/ui/login", data={"csrf": "\xe9" * 43, "token": OPERATOR})
    assert r.status_code == 403 and "out of date" in r.text
    assert _csrf(page.text)  # the session of the page is still there


def test_a_form_that_cannot_be_parsed_is_a_400_not_an_internal_error(client: TestClient) -> None:
    _login(client, OPERATOR)
    broken = {"content-type": "multipart/form-data"}  # no boundary
    r = client.post("/ui/actions/cancel", content=b"--x\r\n", headers=broken)
    assert r.status_code == 400 and "Something went wrong" not in r.text
    r = client.post(
        "/ui/actions/cancel", content=b"--x\r\n", headers={**broken, "X-Requested-With": "fetch"}
    )
    assert r.status_code == 400 and r.json()["ok"] is False


@pytest.mark.parametrize("limit", ["\u00b2", "\u00b9\u00b2", "9" * 3000])
def test_a_page_size_that_is_not_ascii_digits_is_a_422_not_an_internal_error(
    client: TestClient, limit: str
) -> None:
    # "²".isdigit() is True but int("²") raises: the list page was a 500
    _login(client, OPERATOR)
    r = client.get("/ui/operations", params={"state": "queued", "limit": limit})
    assert r.status_code == 422 and "a whole number from 1 to 500" in r.text
    live = client.get("/ui/operations/live", params={"state": "queued", "limit": limit})
    assert live.status_code == 200 and "Something went wrong" not in live.text


@pytest.mark.parametrize(
    "result",
    ["[" * 5000 + "]" * 5000, "9" * 5000],
    ids=["nested too deep", "a number over 4,300 digits"],
)
def test_a_resolve_result_json_cannot_read_is_refused_not_an_internal_error(
    client: TestClient, result: str
) -> None:
    # Given an operator's resolve form whose result json.loads raises on (not as a
    # JSONDecodeError): RecursionError, ValueError
    csrf = _login(client, OPERATOR)
    form = {"csrf": csrf, "ref": "r1", "outcome": "committed", "reason": "seen", "result": result}

    # Then the form is refused, by a page and by JSON for the page's script (both were 500s)
    r = client.post("/ui/actions/resolve", data=form)
    assert r.status_code == 303 and r.headers["location"] == "/ui/operation?ref=r1"
    r = client.post("/ui/actions/resolve", data=form, headers={"X-Requested-With": "fetch"})
    assert r.status_code == 422 and r.json()["ok"] is False
    assert "BAD_RESULT" in r.json()["message"]
