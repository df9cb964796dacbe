"""The trust figures per tool (issue 27) equal what a test caused on a real stack
(6 unknown outcomes: 3 found, 2 not found and run again once each, 1 escalated with its
verifier down; a second delivery refused; a submit repeated):
workers and a scheduler (serving its metrics) on the embedded Valkey, the provider
stub dropping replies. The same numbers through the API (what the console shows),
and through Prometheus; the Grafana dashboard names only series that stack serves.
"""

from __future__ import annotations

import json
import re
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import (
    free_port,
    start_scheduler,
    start_worker,
    stop_processes,
    wait_until,
)
from tests.integration.conftest import APP
from toolq import State, ToolQueue
from toolq.core.stats import INF, RECOVERY_BUCKETS_MS, RECOVERY_STATES, cumulative
from toolq.edges.api import ApiSettings, create_app
from toolq.services.scheduler.trust import WINDOWS, quantile_le_s

DASHBOARD = Path(__file__).parents[2] / "docs" / "grafana" / "toolq.json"
READER = "reader-token-0123456789"
FOUND = [f"trust/found/{i}" for i in range(3)]
RERUN = [f"trust/rerun/{i}" for i in range(2)]
ESCALATED = "trust/escalated"


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module", autouse=True)
def processes(rt: ToolQueue, module_redis_url: str, metrics_port: int) -> Iterator[None]:
    procs = [
        start_worker(APP, module_redis_url, queues="toolq.calls", concurrency=2),
        start_worker(APP, module_redis_url, queues="toolq.verify", concurrency=2),
        start_scheduler(APP, module_redis_url, extra_args=["--metrics-port", str(metrics_port)]),
    ]
    yield
    stop_processes(procs)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        body: bytes = response.read()
    return body.decode()


def samples_of(text: str) -> list[Any]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def value(text: str, name: str, **labels: str) -> float:
    return next(s.value for s in samples_of(text) if s.name == name and s.labels == labels)


def verifying_buckets(rt: ToolQueue, refs: list[str]) -> dict[str, int]:
    """What the ledger should have counted for verifying, from the operations' own
    histories: each stay from the entry into verifying to the one out of it."""
    out: dict[str, int] = {}
    for ref in refs:
        rec = rt.get(ref)
        assert rec is not None
        entered = None
        for h in rec.history:
            if h.to is State.VERIFYING and h.from_ is not State.VERIFYING:
                entered = h.at
            elif h.from_ is State.VERIFYING and h.to is not State.VERIFYING:
                assert entered is not None
                spent = h.at - entered
                le = next((str(e) for e in RECOVERY_BUCKETS_MS if spent <= e), INF)
                out[le] = out.get(le, 0) + 1
                out["sum"] = out.get("sum", 0) + spent
    return out


@pytest.fixture(scope="module")
def caused(rt: ToolQueue, metrics_port: int) -> dict[str, int]:
    # Given a scheduler that has taken its first sample (the windows' baseline)
    assert wait_until(lambda: rt.redis.hlen(rt.ledger.keys.series) >= 1, 20)
    assert wait_until(lambda: "toolq_ledger_up 1.0" in scrape(metrics_port), 20)
    # When 5 writes' outcomes are lost: 3 committed (found), 2 not (not found, run again)
    for ref in FOUND:
        rt.submit("pay", {"mode": "lost_reply"}, operation_ref=ref)
    for ref in RERUN:
        rt.submit("pay", {"mode": "timeout_before_commit"}, operation_ref=ref)
    for ref in FOUND + RERUN:
        env = rt.wait(ref, timeout=30)
        assert env.ok, (ref, env)
    # and one whose verifier stays down: escalated after its checks
    rt.redis.set("provider:verifier_down", "1")
    try:
        rt.submit("pay", {"mode": "verifier_down"}, operation_ref=ESCALATED)
        env = rt.wait(ESCALATED, timeout=30)
        assert not env.ok and env.code == "VERIFICATION_UNAVAILABLE"
    finally:
        rt.redis.delete("provider:verifier_down")
    # and a second delivery of a finished attempt, and the same submit again
    queue, message = rt.app.messages.run(FOUND[0], 1)
    rt.redis.lpush(queue, message)
    assert wait_until(lambda: rt.ledger.stats().get("pay|duplicates_prevented") == 1, 20)
    again = rt.submit("pay", {"mode": "lost_reply"}, operation_ref=FOUND[0])
    assert again.created is False
    for ref in RERUN:  # each ran twice, under its one ref
        rec = rt.get(ref)
        assert rec is not None and rec.attempt == 2
    return verifying_buckets(rt, [*FOUND, *RERUN, ESCALATED])


EXPECTED = {
    "unknown": 6,
    "found": 3,
    "not_found": 2,
    "unknown_escalated": 1,
    "deliveries_refused": 1,
    "submits_deduplicated": 1,
    "duplicates_prevented": 2,
    "escalated": 1,
    "resolved_committed": 0,
    "resolved_not_committed": 0,
    "resolved_retry": 0,
}


@pytest.mark.parametrize("window", list(WINDOWS))
def test_the_api_figures_equal_what_the_test_caused(
    rt: ToolQueue, caused: dict[str, int], window: str
) -> None:
    api = create_app(rt, ApiSettings(tokens=f"{READER}=read", allowed_hosts="testserver"))
    client = TestClient(api, headers={"Authorization": f"Bearer {READER}"})

    body = client.get("/v1/trust", params={"window": window}).json()

    pay = body["tools"]["pay"]
    assert {k: pay[k] for k in EXPECTED} == EXPECTED
    assert body["window"] == window and body["since_ms"] is not None
    times = pay["recovery"]
    assert times["verifying"] == {
        "count": 6,
        "p50_s": quantile_le_s(caused, 0.5),
        "p95_s": quantile_le_s(caused, 0.95),
        "mean_s": round(caused["sum"] / 6 / 1000, 3),
    }
    for state in RECOVERY_STATES:
        if state != "verifying":
            assert times[state]["count"] == 0, state
    # the other tool caused nothing
    assert all(v == 0 for k, v in body["all"].items() if k in EXPECTED and EXPECTED[k] == 0)


def test_a_window_that_is_not_offered_is_refused(rt: ToolQueue) -> None:
    api = create_app(rt, ApiSettings(tokens=f"{READER}=read", allowed_hosts="testserver"))
    client = TestClient(api, headers={"Authorization": f"Bearer {READER}"})

    answer = client.get("/v1/trust", params={"window": "2h"})

    assert answer.status_code == 422
    assert answer.json()["code"] == "INVALID_REQUEST"
    assert "window" in json.dumps(answer.json())


def test_prometheus_serves_the_same_figures(
    rt: ToolQueue, caused: dict[str, int], metrics_port: int
) -> None:
    text = scrape(metrics_port)

    pay = {"tool": "pay"}
    assert value(text, "toolq_unknown_outcomes_total", **pay) == 6
    assert value(text, "toolq_verification_verdicts_total", **pay, verdict="found") == 3
    assert value(text, "toolq_verification_verdicts_total", **pay, verdict="not_found") == 2
    assert value(text, "toolq_verification_verdicts_total", **pay, verdict="escalated") == 1
    assert value(text, "toolq_unverifiable_unknowns_total", **pay) == 0
    assert value(text, "toolq_duplicates_prevented_total", **pay) == 1
    assert value(text, "toolq_duplicate_submits_total", **pay) == 1
    assert value(text, "toolq_escalations_total", **pay) == 1
    for resolution in ("committed", "not_committed", "retry"):
        assert value(text, "toolq_operator_resolutions_total", **pay, resolution=resolution) == 0
    verifying = {"tool": "pay", "state": "verifying"}
    assert value(text, "toolq_recovery_seconds_count", **verifying) == 6
    assert value(text, "toolq_recovery_seconds_sum", **verifying) == caused["sum"] / 1000
    for le, n in cumulative(caused):
        assert value(text, "toolq_recovery_seconds_bucket", **verifying, le=le) == n, le
    assert value(text, "toolq_recovery_seconds_count", tool="pay", state="waiting_retry") == 0


# --------------------------------------------------------------------------- the dashboard

_METRIC = re.compile(r"\btoolq_[a-z0-9_]+")
_SELECTOR = re.compile(r"(toolq_[a-z0-9_]+)\{([^}]*)\}")
_MATCHER = re.compile(r'(\w+)\s*(=~|!~|!=|=)\s*"([^"]*)"')
_BY = re.compile(r"\bby\s*\(([^)]*)\)\s*\((?:[a-z_]+\()?(toolq_[a-z0-9_]+)")


def expressions(dashboard: dict[str, Any]) -> list[str]:
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("expr", "definition") and isinstance(v, str):
                    found.append(v)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(dashboard)
    return found


def test_every_series_the_grafana_dashboard_uses_is_served(
    caused: dict[str, int], metrics_port: int
) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = expressions(dashboard)
    served = samples_of(scrape(metrics_port))
    names = {s.name for s in served}
    assert len(exprs) >= 10
    grouped = 0
    for expr in exprs:
        for name in _METRIC.findall(expr):
            assert name in names, (name, expr)
        for name, matchers in _SELECTOR.findall(expr):
            of_name = [s for s in served if s.name == name]
            for label, op, wanted in _MATCHER.findall(matchers):
                values = {s.labels.get(label) for s in of_name}
                assert values - {None}, (label, name, expr)
                if op == "=~" and not wanted.startswith("$"):
                    for alternative in wanted.split("|"):
                        assert alternative in values, (alternative, label, name)
        for by, name in _BY.findall(expr):
            labels = {k for s in served if s.name == name for k in s.labels}
            for label in (x.strip() for x in by.split(",")):
                assert label in labels, (label, name, expr)
            grouped += 1
    assert grouped >= 10  # the aggregations were read, not skipped
