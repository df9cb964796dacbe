"""What the framework examples share: the invoice provider and a local toolq stack.

:func:`invoice_stack` starts the example invoice provider
(:mod:`toolq.examples.provider`, with its own deduplication off, so only toolq
stands between a retry and a second invoice) and a local stack (an embedded
Valkey, or the server in ``TOOLQ_REDIS_URL``; a calls worker, a verify worker
and the scheduler), points :data:`toolq.examples.invoices.tq` at it, and stops
everything after. Not an example itself: each ``*_example.py`` imports it.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from toolq.examples import invoices
from toolq.examples.provider import InvoiceProvider, ProviderConfig
from toolq.stack import Stack, StackConfig


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


def new_scope() -> str:
    """A fresh run, thread or conversation id to scope the refs by."""
    return f"example-{uuid.uuid4().hex[:8]}"


def side_effects(provider: InvoiceProvider, scope: str) -> Counter[str]:
    """The invoices the provider created under ``scope``, counted by call id."""
    prefix = f"{scope}/"
    refs = (e["operation_ref"] for e in provider.effects()["effects"])
    return Counter(ref.removeprefix(prefix) for ref in refs if ref.startswith(prefix))
