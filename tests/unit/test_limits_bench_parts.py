"""The judging parts of ``python -m bench limits`` (issue 28): the provider that counts,
and the pure functions that read its counts. The scenarios themselves run with real
workers in tests/e2e/test_limits_bench.py."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

from bench.limits import claimed_before
from bench.limits_provider import SlidingWindow, max_in_window, rejection_bursts, serve


@pytest.mark.parametrize(
    ("times", "window", "most"),
    [
        ([], 1.0, 0),
        ([0.0], 1.0, 1),
        ([0.0, 0.5, 0.999], 1.0, 3),
        ([0.0, 0.5, 1.0], 1.0, 2),  # half-open: 1.0 is the next window's
        ([0.0, 0.9, 1.1, 1.2, 1.8, 3.0], 1.0, 4),  # [0.9, 1.9) holds 0.9 1.1 1.2 1.8
        ([2.0, 0.0, 1.5, 0.2], 1.0, 2),  # unsorted input
        ([0.0] * 5, 1.0, 5),
    ],
)
def test_max_in_window(times: list[float], window: float, most: int) -> None:
    assert max_in_window(times, window) == most


@pytest.mark.parametrize(
    ("claims", "at", "opened_at", "before"),
    [
        ([], 5.0, None, True),  # the breaker never opened: everything was on its way
        ([1.00], 1.01, 1.00 + 0.005, True),  # claimed before, reached it after the open
        ([1.00], 1.20, 1.10, True),  # a loaded machine: 200 ms from claim to call
        ([1.20], 1.21, 1.10, False),  # claimed after the open: a probe
        ([1.00, 3.20], 3.21, 1.10, False),  # the retry's claim is the call's, not the first
        ([1.00, 3.20], 1.02, 1.10, True),  # the first attempt's call
        ([1.13], 1.12, 1.10, False),  # a claim stamped just after its call (clocks)
        ([], 1.20, 1.10, False),  # no claim seen: judged by the call's own time
    ],
)
def test_a_call_is_on_its_way_if_its_attempt_was_claimed_before_the_breaker_opened(
    claims: list[float], at: float, opened_at: float | None, before: bool
) -> None:
    assert claimed_before(claims, at, opened_at) is before


@pytest.mark.parametrize(
    ("statuses", "bursts"),
    [
        ([], []),
        ([200, 200], []),
        ([429], [1]),
        ([200, 429, 429, 200, 429, 200], [2, 1]),
        ([429, 429, 429], [3]),
        ([429, 503, 429], [1, 1]),  # only the status asked for counts
    ],
)
def test_rejection_bursts(statuses: list[int], bursts: list[int]) -> None:
    assert rejection_bursts(statuses) == bursts


def test_sliding_window_admits_rate_per_window_and_says_when() -> None:
    w = SlidingWindow(rate=2, window=1.0)
    assert w.admit(0.0) is None and w.admit(0.1) is None
    assert w.admit(0.5) == pytest.approx(0.5)  # the first leaves the window at 1.0
    assert w.admit(1.0) is None  # it has
    assert w.admit(1.05) == pytest.approx(0.05)
    assert SlidingWindow(rate=0, window=1.0).admit(0.0) is None  # no limit


@pytest.fixture
def provider() -> Iterator[str]:
    srv, _ = serve(0)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()
    t.join(timeout=5)


def _call(url: str, path: str, body: object = None, method: str = "POST") -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("X-Caller-Pid", "7")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, {"body": json.loads(resp.read()), **dict(resp.headers)}
    except urllib.error.HTTPError as err:
        return err.code, {"body": json.loads(err.read()), **dict(err.headers)}


def test_provider_refuses_beyond_its_rate_goes_down_and_counts_writes(provider: str) -> None:
    # Given a provider that accepts 2 calls a second (a window long enough not to pass here)
    _call(provider, "/_config", {"rate": 2, "window": 60})
    # When three calls arrive, two of them writes
    answers = [_call(provider, f"/call?ref=r{i}&write=1")[0] for i in range(2)]
    status, third = _call(provider, "/call?ref=r2")
    # Then the third is refused with a Retry-After, and the two writes are counted
    assert answers == [200, 200] and status == 429 and int(third["Retry-After"]) >= 1
    assert _call(provider, "/committed?ref=r0", method="GET")[1]["body"] == {"count": 1}
    # When it goes down: 503 without Retry-After, and the period is recorded
    _call(provider, "/_config", {"rate": 0})
    _call(provider, "/_down", {"down": True})
    status, down = _call(provider, "/call?ref=r3&write=1")
    assert status == 503 and "Retry-After" not in down
    _call(provider, "/_down", {"down": False})
    assert _call(provider, "/call?ref=r3&write=1")[0] == 200
    stats = _call(provider, "/_stats", method="GET")[1]["body"]
    assert [r[1] for r in stats["requests"]] == [503, 200]  # /_config cleared the counts
    assert stats["committed"] == {"r3": 1}
    assert len(stats["down_periods"]) == 1 and None not in stats["down_periods"][0]
    assert stats["max_in_flight"] == 1 and stats["in_flight_by_pid"] == {}


def test_provider_counts_calls_in_flight_per_caller(provider: str) -> None:
    # Given two calls the provider holds at once
    threads = [
        threading.Thread(target=_call, args=(provider, f"/call?ref=h{i}&hold=0.5"))
        for i in range(2)
    ]
    for t in threads:
        t.start()
    # Then while they are held it sees both, from caller 7 ...
    seen: dict[str, int] = {}
    for _ in range(100):
        seen = _call(provider, "/_stats", method="GET")[1]["body"]["in_flight_by_pid"]
        if seen.get("7") == 2:
            break
        threading.Event().wait(0.01)
    for t in threads:
        t.join()
    stats = _call(provider, "/_stats", method="GET")[1]["body"]
    assert seen == {"7": 2}
    # ... and at most two at once, none after
    assert stats["max_in_flight"] == 2 and stats["in_flight"] == 0
    assert [n for _, n in stats["curve"]][-1] == 0
