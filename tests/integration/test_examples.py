"""The example tools against the example provider: each misbehaviour maps to the right failure,
and the :class:`toolq.edges.stack.Stack` runs them through real processes on the suite's server."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from typing import Any

import pytest

from tests.helpers import descendants, pid_gone, wait_until
from toolq.core import errors
from toolq.core.states import TERMINAL, State
from toolq.core.tools import CallContext
from toolq.edges.demo import build_report
from toolq.edges.stack import Stack, StackConfig
from toolq.examples import invoices
from toolq.examples.provider import InvoiceProvider, ProviderConfig

TIMEOUT = 0.5


@pytest.fixture
def invoice_provider(monkeypatch: pytest.MonkeyPatch) -> Iterator[InvoiceProvider]:
    with InvoiceProvider(ProviderConfig(precommit_stall=TIMEOUT + 0.5, crash_stall=1.0)) as p:
        monkeypatch.setenv(invoices.PROVIDER_URL_ENV, p.url)
        monkeypatch.setenv(invoices.TIMEOUT_ENV, str(TIMEOUT))
        yield p


def _ctx(ref: str, args: Any, *, approved: bool = False, tool: str = "create_invoice") -> Any:
    return CallContext(
        operation_ref=ref,
        tool=tool,
        call_id=None,
        attempt=1,
        max_attempts=5,
        approved=approved,
        args=args,
    )


def _create(
    ref: str, customer: str, amount: float, *, approved: bool = False, version: int | None = None
) -> invoices.Invoice:
    args = invoices.CreateInvoice(customer=customer, amount=amount, customer_version=version)
    return invoices.create_invoice(args, _ctx(ref, args, approved=approved))


def test_a_plain_write_commits_once_and_is_found_by_its_ref(
    invoice_provider: InvoiceProvider,
) -> None:
    inv = _create("r-ok", "acme", 10)
    assert inv.operation_ref == "r-ok"
    found = invoices.find_invoice_by_operation_ref(_ctx("r-ok", None))
    assert found == inv
    assert invoices.find_invoice_by_operation_ref(_ctx("r-none", None)) is None
    read = invoices.get_invoice(invoices.GetInvoice(invoice_id=inv.id))
    assert read == inv
    # The same key again is a replay, not a second side effect
    assert _create("r-ok", "acme", 10) == inv
    fx = invoice_provider.effects()
    assert [e["operation_ref"] for e in fx["effects"]] == ["r-ok"]
    assert len(fx["replays"]) == 1


@pytest.mark.parametrize(
    ("customer", "amount", "raised", "commits"),
    [
        ("acme", -1, errors.InvalidInput, False),
        ("cust_ratelimit", 5, errors.RateLimited, False),
        ("cust_down", 5, errors.Unavailable, False),
        ("cust_conflict", 5, errors.Conflict, False),
        ("initech", 200_000, errors.NeedsApproval, False),
        ("cust_lostreply", 5, errors.OutcomeUnknown, True),
        ("cust_slow_precommit", 5, errors.OutcomeUnknown, False),
    ],
)
def test_each_misbehaviour_maps_to_its_failure(
    invoice_provider: InvoiceProvider,
    customer: str,
    amount: float,
    raised: type[errors.ToolFailure],
    commits: bool,
) -> None:
    ref = f"r-{customer}"
    with pytest.raises(raised) as info:
        _create(ref, customer, amount)
    if isinstance(info.value, errors.InvalidInput):
        assert (info.value.field, info.value.rule) == ("amount", "must_be_positive")
    if isinstance(info.value, errors.Conflict):
        assert info.value.current_state_ref == "7"
    found = invoices.find_invoice_by_operation_ref(_ctx(ref, None))
    assert (found is not None) is commits
    # What recovery does next succeeds (except for a provider that is down)
    if customer == "cust_down":
        return
    fixed = {"acme": 10.0, "initech": amount}.get(customer, amount)
    version = 7 if customer == "cust_conflict" else None
    if not commits:
        inv = _create(ref, customer, fixed, approved=customer == "initech", version=version)
        assert inv.operation_ref == ref
    assert len(invoice_provider.find(ref)) == 1


def test_an_unreachable_or_unset_provider_is_never_an_unknown_outcome(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with InvoiceProvider() as p:
        url = p.url  # a port that is free once the provider stops
    monkeypatch.setenv(invoices.PROVIDER_URL_ENV, url)
    with pytest.raises(errors.Unavailable):
        _create("r-x", "acme", 1)
    monkeypatch.delenv(invoices.PROVIDER_URL_ENV)
    with pytest.raises(errors.Misconfigured):
        _create("r-x", "acme", 1)


def test_the_stack_runs_the_examples_on_an_external_server(redis_url: str) -> None:
    # Given a stack on the suite's server (no embedded one) and the provider
    with InvoiceProvider(ProviderConfig(precommit_stall=2.0, crash_stall=30.0)) as provider:
        stack = Stack(
            StackConfig(
                app="toolq.examples.invoices:tq",
                redis_url=redis_url,
                calls_workers=1,
                env={
                    invoices.PROVIDER_URL_ENV: provider.url,
                    invoices.TIMEOUT_ENV: "1",
                    "TOOLQ_LEASE__SECONDS": "2",
                },
            )
        )
        tq = invoices.tq  # this process submits and reads; the stack's workers run the tools
        tq.configure(redis_url=redis_url)
        with stack:
            assert not stack.embedded and stack.redis_url == redis_url
            # When a write's worker is SIGKILLed after the provider committed
            crash = tq.submit(
                "create_invoice", {"customer": "cust_crash", "amount": 3}, operation_ref="it-crash"
            ).operation_ref
            assert wait_until(lambda: provider.find(crash), timeout=30)
            holder = tq.ledger.fields(crash, "lease_holder")["lease_holder"]
            index = stack.worker_of(int(holder.split(":")[1]))
            assert index == 0
            killed = stack.kill_worker(0)
            assert pid_gone(killed)
            new_pid = stack.restart_worker(0)
            assert new_pid != killed
            # and others lose their reply or time out before committing
            refs = [crash] + [
                tq.submit(
                    "create_invoice", {"customer": c, "amount": 3}, operation_ref=f"it-{c}"
                ).operation_ref
                for c in ("acme", "cust_lostreply", "cust_slow_precommit")
            ]

            def final() -> bool:
                return all((r := tq.get(ref)) is not None and r.state in TERMINAL for ref in refs)

            assert wait_until(final, timeout=60, interval=0.2)
            pids = {pid for c in stack.children if c.pid for pid in {c.pid, *descendants(c.pid)}}
            records = [r for r in map(tq.get, refs) if r is not None]
            report = build_report(records, provider.effects(), tq.ledger.stats())
        # Then every write succeeded exactly once, and stopping left nothing running
        assert {r.state for r in records} == {State.SUCCEEDED}
        assert report["ok"] and report["side_effects"]["exactly_one"] == 4
        assert report["unknowns"]["found_committed"] >= 2
        assert report["unknowns"]["not_found_redispatched"] >= 1
        assert wait_until(lambda: all(pid_gone(p) for p in pids), timeout=10)
        tq.close()


def test_stack_stop_is_idempotent_and_kills_the_whole_group(tmp_path: Any) -> None:
    stack = Stack(
        StackConfig(
            app="toolq.examples.invoices:tq",
            appendonly=False,
            calls_workers=1,
            verify_workers=0,
            pool="prefork",
            concurrency=2,
            log_dir=tmp_path,
        )
    ).start()
    try:
        worker = stack.workers[0]
        assert worker.pid is not None
        # prefork: the pool children are in the worker's process group
        assert wait_until(lambda: len(descendants(worker.pid or 0)) >= 2, timeout=30)
        pids = {worker.pid, *descendants(worker.pid), stack.server.pid if stack.server else 0}
        stack.kill_worker(0, signal.SIGTERM)
    finally:
        stack.stop()
        stack.stop()
    assert wait_until(lambda: all(pid_gone(p) for p in pids if p), timeout=10)
    assert (tmp_path / "calls-1.log").exists()
