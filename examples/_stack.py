"""What the framework examples share: the invoice provider and a local toolq stack.

:func:`invoice_stack` starts the example invoice provider
(:mod:`toolq.examples.provider`, with its own deduplication off, so only toolq
stands between a retry and a second invoice) and a local stack (an embedded
Valkey, or the server in ``TOOLQ_REDIS_URL``; a calls worker, a verify worker
and the scheduler), points :data:`toolq.examples.invoices.tq` at it, and stops
everything after. Not an example itself: each ``*_example.py`` imports it.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from toolq.edges.stack import Stack, StackConfig
from toolq.examples import invoices
from toolq.examples.provider import InvoiceProvider, ProviderConfig


@contextmanager
def invoice_stack() -> Iterator[InvoiceProvider]:
    """The provider and the stack running, ``invoices.tq`` pointed at the stack."""
    with tempfile.TemporaryDirectory(prefix="toolq-example-") as logs:
        provider = InvoiceProvider(ProviderConfig(dedup=False, precommit_stall=2.0))
        stack = Stack(
            StackConfig(
                app="toolq.examples.invoices:tq",
                redis_url=os.environ.get("TOOLQ_REDIS_URL") or None,
                log_dir=Path(logs),
                env={
                    "TOOLQ_EXAMPLE_PROVIDER_URL": "",  # set once the provider listens
                    "TOOLQ_EXAMPLE_PROVIDER_TIMEOUT": "1",
                    "TOOLQ_LEASE__SECONDS": "3",
                    "TOOLQ_SCHEDULER__MAX_SLEEP": "1",
                },
            )
        )
        try:
            provider.start()
            stack.config.env["TOOLQ_EXAMPLE_PROVIDER_URL"] = provider.url
            stack.start()
            # This process only submits and waits: the stack's workers run the tool.
            invoices.tq.configure(redis_url=stack.redis_url)
            yield provider
        finally:
            invoices.tq.close()
            stack.stop()
            provider.stop()


#: The invoices the examples' scripted models ask for, each meeting one of the
#: provider's failures (see :mod:`toolq.examples.provider`).
LOST_REPLY = {"customer": "cust_lostreply", "amount": 120.0, "currency": "EUR"}  # commits, no reply
BAD_AMOUNT = {"customer": "acme", "amount": -5.0, "currency": "EUR"}  # the model must fix amount
FIXED_AMOUNT = {"customer": "acme", "amount": 5.0, "currency": "EUR"}
RATE_LIMITED = {"customer": "cust_ratelimit", "amount": 30.0, "currency": "EUR"}  # a 429 first
NEEDS_APPROVAL = {"customer": "initech", "amount": 250_000.0, "currency": "EUR"}  # over the limit

#: The whole scenario, as (call id, arguments) per model turn: a lost reply, an
#: amount to fix, a rate limit, an approval, then the first call replayed.
SCENARIO = [
    ("call_lost", LOST_REPLY),
    ("call_bad", BAD_AMOUNT),
    ("call_fixed", FIXED_AMOUNT),
    ("call_limited", RATE_LIMITED),
    ("call_big", NEEDS_APPROVAL),
    ("call_lost", LOST_REPLY),  # a replayed step: the same call id
]
#: The side effects each call id of :data:`SCENARIO` should leave at the provider.
EXPECTED = {"call_lost": 1, "call_bad": 0, "call_fixed": 1, "call_limited": 1, "call_big": 1}


def new_scope() -> str:
    """A fresh run, thread or conversation id to scope the refs by."""
    return f"example-{uuid.uuid4().hex[:8]}"


def side_effects(provider: InvoiceProvider, scope: str) -> Counter[str]:
    """The invoices the provider created under ``scope``, counted by call id."""
    prefix = f"{scope}/"
    refs = (e["operation_ref"] for e in provider.effects()["effects"])
    return Counter(ref.removeprefix(prefix) for ref in refs if ref.startswith(prefix))


def report(provider: InvoiceProvider, scope: str, call_ids: Iterable[str]) -> dict[str, int]:
    """Print and return the invoices the provider created for each call id, once each."""
    effects = side_effects(provider, scope)
    counts = {call_id: effects[call_id] for call_id in dict.fromkeys(call_ids)}
    for call_id, n in counts.items():
        print(f"{call_id}: side effects: {n}")
    return counts


def scenario_verdict(counts: dict[str, int], read: dict[str, str], fix_status: str) -> int:
    """The exit code of a :data:`SCENARIO` run: 0 when each call left the side effects
    :data:`EXPECTED`, the bad amount was answered ``[fix_status]`` naming ``amount``,
    and the replayed call read what the first one did."""
    ok = (
        counts == EXPECTED
        and read["call_bad"].startswith(f"[{fix_status}]")
        and "amount (" in read["call_bad"]
        and read["call_lost (replay)"] == read["call_lost"]
    )
    print("one side effect per invoice: " + ("yes" if ok else "NO"))
    return 0 if ok else 1


def heard(read: dict[str, str], call_id: str, status: str, text: str) -> None:
    """Record and print what the model read for ``call_id`` (a second time: a replay)."""
    key = call_id if call_id not in read else f"{call_id} (replay)"
    read[key] = f"[{status}] {text.splitlines()[0][:160]}"
    print(f"{key}: the model read: {read[key]}")


def run_scenario(main: Callable[[str], Awaitable[dict[str, str]]], fix_status: str) -> int:
    """Run :data:`SCENARIO` through ``main(scope)`` on the stack; the exit code."""
    with invoice_stack() as provider:
        scope = new_scope()
        read = asyncio.run(main(scope))
        counts = report(provider, scope, (i for i, _ in SCENARIO))
    return scenario_verdict(counts, read, fix_status)
