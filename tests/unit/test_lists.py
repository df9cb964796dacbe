"""Lists of operations per state: the checks and the cursor as tables, the walk
(a Lua script) on fakeredis's Lua; a real server runs it in
tests/integration/test_operator_actions.py and bench/lists_bench.py.
"""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime
from typing import Any

import fakeredis
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolq.adapters.ledger import lists
from toolq.adapters.ledger.lists import ListQuery, Position, decode_cursor, encode_cursor
from toolq.core import errors
from toolq.core.keys import Keys
from toolq.core.record import OperationPage
from toolq.core.states import State

NOW = 1_800_000_000_000
KEYS = Keys()


# --------------------------------------------------------------------------- checks (tables)


def _fields(**kwargs: Any) -> set[str]:
    with pytest.raises(errors.InvalidArguments) as info:
        lists.parse_query(kwargs.pop("state", "queued"), now_ms=NOW, **kwargs)
    return {fe.field for fe in info.value.field_errors}


@pytest.mark.parametrize(
    ("kwargs", "bad"),
    [
        ({"state": "sleeping"}, {"state"}),
        ({"state": 5}, {"state"}),
        ({"search": ""}, {"q"}),
        ({"search": "x" * 201}, {"q"}),
        ({"search": "run\x00"}, {"q"}),
        ({"search": "a\tb"}, {"q"}),
        ({"search": 7}, {"q"}),
        ({"tool": "no spaces"}, {"tool"}),
        ({"tool": "9starts_with_a_digit"}, {"tool"}),
        ({"tool": 5}, {"tool"}),
        ({"code": "lower_case"}, {"code"}),
        ({"ref_contains": ""}, {"ref_contains"}),
        ({"ref_contains": "x" * 201}, {"ref_contains"}),
        ({"ref_contains": "a\nb"}, {"ref_contains"}),
        ({"older_than_s": -1}, {"older_than"}),
        ({"older_than_s": float("nan")}, {"older_than"}),
        ({"older_than_s": "soon"}, {"older_than"}),
        ({"older_than_s": True}, {"older_than"}),
        ({"limit": 0}, {"limit"}),
        ({"limit": 501}, {"limit"}),
        ({"limit": 2.5}, {"limit"}),
        ({"cursor": "not-a-cursor"}, {"cursor"}),
        ({"cursor": encode_cursor(Position(1, "r"), True)}, {"cursor"}),  # other order
        ({"state": "x", "tool": "?", "limit": -1}, {"state", "tool", "limit"}),
    ],
)
def test_a_bad_request_names_every_bad_field(kwargs: dict[str, Any], bad: set[str]) -> None:
    assert _fields(**kwargs) == bad


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({}, ListQuery(State.QUEUED)),
        ({"older_than_s": 90}, ListQuery(State.QUEUED, max_score=NOW - 90_000)),
        ({"older_than_s": "1.5"}, ListQuery(State.QUEUED, max_score=NOW - 1_500)),
        ({"limit": "7", "tool": "a.b-c"}, ListQuery(State.QUEUED, tool="a.b-c", limit=7)),
        (
            {"cursor": encode_cursor(Position(5, "r/1"))},
            ListQuery(State.QUEUED, after=Position(5, "r/1")),
        ),
        (
            {"cursor": encode_cursor(Position(5, "r"), True), "newest_first": True},
            ListQuery(State.QUEUED, after=Position(5, "r"), newest_first=True),
        ),
        (
            {"cursor": encode_cursor(Position(5, "r"), backward=True)},
            ListQuery(State.QUEUED, after=Position(5, "r"), backward=True),
        ),
        ({"search": "run_8"}, ListQuery(State.QUEUED, search="run_8")),
    ],
)
def test_a_good_request(kwargs: dict[str, Any], expected: ListQuery) -> None:
    assert lists.parse_query("queued", now_ms=NOW, **kwargs) == expected


@pytest.mark.parametrize("ref", ["r", "run_81/step_4", "a:b|c=d", "é/x"])
@pytest.mark.parametrize("newest", [False, True])
def test_a_cursor_round_trips(ref: str, newest: bool) -> None:
    token = encode_cursor(Position(NOW, ref), newest)
    assert token.isascii() and "=" not in token and "/" not in token and "+" not in token
    assert decode_cursor(token) == (Position(NOW, ref), newest)
    assert lists.read_cursor(encode_cursor(Position(NOW, ref), newest, True)) == (
        Position(NOW, ref),
        newest,
        True,
    )


def test_every_state_is_a_search_without_a_state() -> None:
    q = lists.parse_query(None, now_ms=NOW, search="x")
    assert (q.state, q.search, q.filtered) == (None, "x", True)
    assert lists.parse_query(None, now_ms=NOW).state is None


@pytest.mark.parametrize(
    "token",
    [
        "",
        "x",
        "%%%",
        "W10",  # []
        encode_cursor(Position(1, "r")).replace("W", "X"),
        "WzIsMCwxLCJyIl0",  # version 2
        "WzEsMCwxLjUsInIiXQ",  # a float score
        "WzEsMCwxLCIiXQ",  # an empty ref
        "WzEsMCwxLCJyIiwyXQ",  # [1,0,1,"r",2]: a direction that is not backward
        "a" * 1025,
    ],
)
def test_anything_but_a_cursor_is_refused(token: str) -> None:
    with pytest.raises(ValueError, match="not a cursor"):
        decode_cursor(token)


# --------------------------------------------------------------------------- the walk


class Ledger:
    """Operations written straight into fakeredis, as the scripts would leave them."""

    def __init__(self) -> None:
        self.r = fakeredis.FakeRedis(server=fakeredis.FakeServer())

    def add(
        self,
        ref: str,
        entered: int,
        *,
        tool: str = "t",
        state: str = "waiting_retry",
        code: str | None = "RATE_LIMITED",
        due: int | None = None,
    ) -> None:
        env: dict[str, Any] = {"ok": False, "code": code} if code else {"ok": True}
        if code == "RATE_LIMITED":
            env["retry"] = {"directive": "after_delay", "not_before": "2027-01-15T08:00:00+00:00"}
        self.r.sadd(KEYS.tools, tool)
        self.r.zadd(KEYS.index(tool, state), {ref: entered})
        fields: dict[Any, Any] = {"state": state, "tool": tool, "attempt": 2, "created": 10}
        fields["max_attempts"] = 5
        self.r.hset(KEYS.op(ref), mapping={**fields, "envelope": json.dumps(env)})
        if due is not None:
            self.r.zadd(KEYS.due, {ref: due})

    def page(self, state: str | None = "waiting_retry", **kwargs: Any) -> OperationPage:
        q = lists.parse_query(state, now_ms=NOW, **kwargs)
        return lists.read_page(self.r, q, KEYS)

    def walk(self, **kwargs: Any) -> tuple[list[str], list[OperationPage]]:
        """Every page, following ``next_cursor``."""
        refs: list[str] = []
        pages: list[OperationPage] = []
        cursor = None
        while True:
            p = self.page(cursor=cursor, **kwargs)
            pages.append(p)
            refs += [i.operation_ref for i in p.items]
            cursor = p.next_cursor
            if cursor is None:
                return refs, pages
            assert len(pages) < 10_000


def test_a_row_says_what_the_console_shows() -> None:
    led = Ledger()
    led.add("r/1", 1000, due=NOW + 5000)

    page = led.page()

    row = page.items[0]
    assert (row.operation_ref, row.tool, row.state, row.entered_ms) == (
        "r/1",
        "t",
        State.WAITING_RETRY,
        1000,
    )
    assert (row.attempt, row.max_attempts, row.code, row.due_ms) == (
        2,
        5,
        "RATE_LIMITED",
        NOW + 5000,
    )
    assert row.not_before_ms == int(datetime(2027, 1, 15, 8, tzinfo=UTC).timestamp() * 1000)
    assert (page.total, page.next_cursor, page.partial) == (1, None, False)


def test_tools_are_merged_oldest_first_and_counted() -> None:
    led = Ledger()
    for i, tool in enumerate(["b", "a", "c", "a", "b", "c"]):
        led.add(f"{tool}/{i}", 100 + i, tool=tool)
    led.add("other/state", 50, state="verifying")

    refs, pages = led.walk(limit=4)

    assert refs == ["b/0", "a/1", "c/2", "a/3", "b/4", "c/5"]
    assert [p.total for p in pages] == [6, 6]
    only_a, _ = led.walk(tool="a", limit=1)
    assert only_a == ["a/1", "a/3"]


def test_newest_first() -> None:
    led = Ledger()
    for i in range(5):
        led.add(f"r/{i}", 100 + i // 2)  # ties: r/0 r/1 at 100, r/2 r/3 at 101

    refs, _ = led.walk(limit=2, newest_first=True)

    assert refs == ["r/4", "r/3", "r/2", "r/1", "r/0"]


def test_older_than_bounds_the_list_and_its_total() -> None:
    led = Ledger()
    led.add("old", NOW - 120_000)
    led.add("new", NOW - 10_000)

    page = led.page(older_than_s=60)

    assert [i.operation_ref for i in page.items] == ["old"] and page.total == 1
    newest = led.page(older_than_s=60, newest_first=True)
    assert [i.operation_ref for i in newest.items] == ["old"]


def test_entries_that_moved_on_are_left_out() -> None:
    led = Ledger()
    led.add("stays", 1)
    led.add("moved", 2)
    led.r.hset(KEYS.op("moved"), "state", "queued")  # the index entry not yet removed
    led.add("gone", 3)
    led.r.delete(KEYS.op("gone"))  # the record expired

    assert [i.operation_ref for i in led.page().items] == ["stays"]


def test_more_ties_than_a_chunk_are_walked_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lists, "CHUNK", 3)
    led = Ledger()
    for i in range(10):
        led.add(f"r/{i:02d}", 7)  # one score: the index orders them by ref

    refs, _ = led.walk(limit=2, ref_contains="r/")

    assert refs == [f"r/{i:02d}" for i in range(10)]


def test_a_ref_filter_stops_at_its_budget_with_a_cursor(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lists, "SCAN_BUDGET", 4)
    monkeypatch.setattr(lists, "CHUNK", 3)
    led = Ledger()
    for i in range(10):
        led.add(f"{'hit' if i in (1, 8) else 'miss'}/{i}", i)

    first = led.page(ref_contains="hit", limit=5)

    assert [i.operation_ref for i in first.items] == ["hit/1"]
    assert (first.partial, first.scanned, first.total) == (True, 4, None)
    refs, pages = led.walk(ref_contains="hit", limit=5)
    assert refs == ["hit/1", "hit/8"]
    assert all(p.scanned <= 4 for p in pages)


def test_a_code_filter_reads_records_and_resumes_where_the_page_filled() -> None:
    led = Ledger()
    codes = ["RATE_LIMITED", "UNAVAILABLE", "RATE_LIMITED", "RATE_LIMITED", "UNAVAILABLE"]
    for i, code in enumerate(codes):
        led.add(f"r/{i}", i, code=code)

    refs, pages = led.walk(code="UNAVAILABLE", limit=1)

    assert refs == ["r/1", "r/4"]
    rate, _ = led.walk(code="RATE_LIMITED", limit=2)
    assert rate == ["r/0", "r/2", "r/3"]
    assert all(p.total is None for p in pages)


def test_a_code_filter_stops_at_its_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lists, "CODE_BUDGET", 150)
    led = Ledger()
    for i in range(400):
        led.add(f"r/{i:03d}", i, code="UNAVAILABLE" if i == 399 else "RATE_LIMITED")

    first = led.page(code="UNAVAILABLE")

    assert first.items == [] and first.partial and first.scanned < 400
    assert decode_cursor(first.next_cursor) == (Position(149, "r/149"), False)  # 150 read
    refs, pages = led.walk(code="UNAVAILABLE")
    assert refs == ["r/399"] and len(pages) == 3


@pytest.mark.parametrize(
    ("envelope", "shown"),
    [
        ({"ok": False, "code": "RATE_LIMITED"}, "RATE_LIMITED"),
        ({"ok": True, "result": {"code": "RATE_LIMITED"}}, None),  # a success has no code
        ({"ok": False, "code": "X", "safe_details": {"field": "RATE_LIMITED"}}, "X"),
    ],
)
def test_a_code_filter_matches_the_envelopes_own_code(
    envelope: dict[str, Any], shown: str | None
) -> None:
    led = Ledger()
    led.add("r", 1)
    led.r.hset(KEYS.op("r"), "envelope", json.dumps(envelope, separators=(",", ":")))

    assert [i.code for i in led.page().items] == [shown]
    found = [i.operation_ref for i in led.page(code="RATE_LIMITED").items]
    assert found == (["r"] if shown == "RATE_LIMITED" else [])


def test_refs_at_one_score_are_walked_in_the_sets_byte_order() -> None:
    led = Ledger()
    refs = ["b", "B", "a/1", "a-1", "é", "z", "A", "_"]
    for ref in refs:
        led.add(ref, 5)
    led.add("later", 6)

    walked, _ = led.walk(limit=1)
    backwards, _ = led.walk(limit=3, newest_first=True)

    ordered = sorted(refs, key=lambda r: r.encode())
    assert walked == [*ordered, "later"]
    assert backwards == ["later", *reversed(ordered)]


def test_no_tools_no_rows() -> None:
    page = Ledger().page()
    assert (page.items, page.next_cursor, page.total) == ([], None, 0)


@settings(max_examples=60, deadline=None)
@given(
    scores=st.lists(st.integers(0, 6), min_size=0, max_size=40),
    tools=st.integers(1, 3),
    limit=st.integers(1, 7),
    newest=st.booleans(),
    seed=st.integers(0, 1000),
)
def test_paging_visits_every_entry_once_in_order(
    scores: list[int], tools: int, limit: int, newest: bool, seed: int
) -> None:
    rng = random.Random(seed)
    led = Ledger()
    expected = []
    for i, score in enumerate(scores):
        ref = f"r{rng.randrange(10**6)}-{i}"
        led.add(ref, score, tool=f"t{rng.randrange(tools)}")
        expected.append((score, ref))
    expected.sort(reverse=newest)

    refs, pages = led.walk(limit=limit, newest_first=newest)

    assert refs == [ref for _, ref in expected]
    assert all(len(p.items) <= limit for p in pages)


@settings(max_examples=80, deadline=None)
@given(
    entries=st.lists(
        st.tuples(st.integers(0, 6), st.sampled_from(["queued", "failed", "escalated"])),
        max_size=40,
    ),
    tools=st.integers(1, 3),
    limit=st.integers(1, 7),
    newest=st.booleans(),
    budget=st.integers(1, 30),
    chunk=st.integers(1, 5),
    seed=st.integers(0, 1000),
)
def test_a_search_in_every_state_visits_every_match_once_in_order_whatever_the_budget(
    entries: list[tuple[int, str]],
    tools: int,
    limit: int,
    newest: bool,
    budget: int,
    chunk: int,
    seed: int,
) -> None:
    rng = random.Random(seed)
    led = Ledger()
    expected = []
    for i, (score, state) in enumerate(entries):
        ref = f"{rng.choice(['hit', 'miss'])}{rng.randrange(10**6)}-{i}"
        tool = f"t{rng.randrange(tools)}"
        led.add(ref, score, tool=tool, state=state)
        if "hit" in ref:
            expected.append((score, ref))
    expected.sort(reverse=newest)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lists, "SCAN_BUDGET", budget)
        mp.setattr(lists, "CHUNK", chunk)
        refs, pages = led.walk(state=None, search="hit", limit=limit, newest_first=newest)

    assert refs == [ref for _, ref in expected]
    assert all(len(p.items) <= limit for p in pages)
    if budget > len(entries):  # the walk never stopped short: no page is an empty last one
        assert all(p.items for p in pages[1:]) and not any(p.partial for p in pages)


# --------------------------------------------------------------------------- pages, search


def test_the_last_page_offers_no_next_page() -> None:
    """The issue's case: 200 rows at 50 a page are 4 pages, and the 4th has no Next."""
    led = Ledger()
    for i in range(200):
        led.add(f"r/{i:03d}", 1000 + i)

    refs, pages = led.walk(limit=50)

    assert len(pages) == 4 and refs == [f"r/{i:03d}" for i in range(200)]
    assert [len(p.items) for p in pages] == [50, 50, 50, 50]
    assert pages[-1].next_cursor is None
    # a list exactly one page long: no Next either; one more row: a Next
    assert led.page(limit=200).next_cursor is None
    assert led.page(limit=199).next_cursor is not None


@pytest.mark.parametrize("newest", [False, True])
@pytest.mark.parametrize("kwargs", [{}, {"ref_contains": "r/"}, {"search": "r/"}])
def test_previous_pages_walk_back_to_the_first(newest: bool, kwargs: dict[str, Any]) -> None:
    led = Ledger()
    for i in range(23):
        led.add(f"r/{i:02d}", 1000 + i // 3)  # ties of three
    forward, pages = led.walk(limit=5, newest_first=newest, **kwargs)
    assert pages[0].prev_cursor is None and all(p.prev_cursor for p in pages[1:])

    back: list[list[str]] = []
    cursor = pages[-1].prev_cursor
    while cursor is not None:
        p = led.page(limit=5, newest_first=newest, cursor=cursor, **kwargs)
        back.insert(0, [i.operation_ref for i in p.items])
        assert p.next_cursor is not None  # the page it came from is after it
        cursor = p.prev_cursor

    assert back == [[i.operation_ref for i in p.items] for p in pages[:-1]]
    assert [r for rows in back for r in rows] + [i.operation_ref for i in pages[-1].items] == (
        forward
    )


def test_the_search_finds_refs_and_tools_in_every_state() -> None:
    led = Ledger()
    led.add("run_81/step_4", 100, tool="pay", state="succeeded", code=None)
    led.add("run_81/step_5", 101, tool="pay", state="escalated", code="ATTEMPTS_EXHAUSTED")
    led.add("run_82/step_1", 102, tool="pay", state="waiting_retry")
    led.add("job/1", 103, tool="create_invoice", state="queued", code=None)
    led.add("job/2", 104, tool="refund", state="verifying", code="OUTCOME_UNKNOWN")

    by_ref = led.page(None, search="run_81")
    by_tool = led.page(None, search="invoice")
    both = led.page(None, search="re", newest_first=True)  # refund's tool; no ref has "re"
    in_one_state = led.page("escalated", search="run_81")

    assert [(i.operation_ref, i.state) for i in by_ref.items] == [
        ("run_81/step_4", State.SUCCEEDED),
        ("run_81/step_5", State.ESCALATED),
    ]
    assert [i.operation_ref for i in by_tool.items] == ["job/1"]
    assert [i.operation_ref for i in both.items] == ["job/2", "job/1"]  # c-re-ate, refund
    assert [i.operation_ref for i in in_one_state.items] == ["run_81/step_5"]
    assert by_ref.total is None and by_ref.next_cursor is None
    everything = led.page(None, limit=3)
    assert everything.total == 5 and [i.entered_ms for i in everything.items] == [100, 101, 102]


def test_a_row_has_its_duration_and_attempt() -> None:
    led = Ledger()
    led.add("done", 5_010, state="succeeded", code=None)
    led.add("waits", 4_000)

    done = led.page("succeeded").items[0]
    waits = led.page().items[0]

    assert (done.created_ms, done.duration_ms(NOW)) == (10, 5_000)  # created -> settled
    assert waits.duration_ms(NOW) == NOW - 10  # so far
    assert (waits.attempt, waits.max_attempts) == (2, 5)
