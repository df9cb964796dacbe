"""Example tools: create and read invoices at an HTTP provider, safely.

This module is what ``toolq demo`` and ``toolq up`` run by default, and it is
meant to be copied. The pattern for a write tool:

1. Send ``ctx.operation_ref`` as the provider's ``Idempotency-Key`` on every
   attempt (toolq keeps it the same across retries and recovery).
2. Use explicit timeouts, and tell "never sent" (connect failed) apart from
   "maybe sent" (the reply never came): :func:`toolq.core.classify.classify_exception`
   does that for you.
3. Map the provider's statuses to toolq's failures
   (:func:`toolq.core.classify.classify_http`), sharpening the ones you know better
   (a 422 names the field).
4. Register a verifier that looks the write up by ``operation_ref``: it is
   what settles an unknown outcome (a lost reply, a killed worker) before
   anything is sent again.

Run a worker for these tools with::

    toolq worker --app toolq.examples.invoices:tq
    celery -A toolq.examples.invoices:celery_app worker   # the same, plain Celery

The provider's URL comes from ``TOOLQ_EXAMPLE_PROVIDER_URL``; the request
timeout (seconds) from ``TOOLQ_EXAMPLE_PROVIDER_TIMEOUT``.
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any
from urllib.parse import quote, urlsplit

from pydantic import BaseModel, Field

from toolq.client.queue import ToolQueue
from toolq.core.classify import classify_exception, classify_http
from toolq.core.errors import InvalidInput, Misconfigured, NeedsApproval, NotFound, Unavailable
from toolq.core.tools import CallContext

PROVIDER_URL_ENV = "TOOLQ_EXAMPLE_PROVIDER_URL"
TIMEOUT_ENV = "TOOLQ_EXAMPLE_PROVIDER_TIMEOUT"
APPROVAL_THRESHOLD = 100_000
CONNECT_TIMEOUT = 2.0

#: The URL comes from TOOLQ_REDIS_URL, or the state directory `toolq up` writes.
tq = ToolQueue()


class CreateInvoice(BaseModel):
    customer: str = Field(min_length=1, max_length=64)
    #: Not constrained here on purpose: the provider validates, and a 422
    #: becomes ``needs_input`` naming the field.
    amount: float
    currency: str = Field(default="EUR", min_length=3, max_length=3)
    #: Optimistic concurrency: the customer record version the agent last read.
    customer_version: int | None = None


class GetInvoice(BaseModel):
    invoice_id: str = Field(min_length=1, max_length=64)


class Invoice(BaseModel):
    id: str
    customer: str
    amount: float
    currency: str
    operation_ref: str
    created_at: float


def _timeout() -> float:
    try:
        return float(os.environ.get(TIMEOUT_ENV, "5"))
    except ValueError:
        return 5.0


def _request(
    method: str, path: str, *, writes: bool, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    """One HTTP request with separate connect and read timeouts; JSON in and out."""
    base = os.environ.get(PROVIDER_URL_ENV)
    if not base:
        raise Misconfigured(f"{PROVIDER_URL_ENV} is not set", reason="no_provider_url")
    url = urlsplit(base)
    if url.scheme != "http" or not url.hostname:
        raise Misconfigured("the provider URL must be http://host:port", reason="invalid_url")
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=CONNECT_TIMEOUT)
    try:
        try:
            conn.connect()
        except OSError as exc:  # nothing left this machine: safe to retry later
            raise Unavailable(
                f"connect failed: {type(exc).__name__}", reason="connect_failed"
            ) from exc
        if conn.sock is not None:
            conn.sock.settimeout(_timeout())
        raw = json.dumps(body).encode() if body is not None else None
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        try:
            conn.request(method, path, body=raw, headers=hdrs)
            resp = conn.getresponse()
            data = resp.read()
        except Exception as exc:
            # The request may have reached the provider: for a write the outcome
            # is unknown (verification settles it); a read is simply retried.
            raise classify_exception(exc, writes=writes) from exc
        try:
            payload = json.loads(data) if data else None
        except ValueError:
            payload = None
        return resp.status, dict(resp.headers.items()), payload
    finally:
        conn.close()


@tq.tool(writes=True, consistency_window=2.0, max_attempts=5, deadline=600.0)
def create_invoice(args: CreateInvoice, ctx: CallContext) -> Invoice:
    """Create an invoice for a customer (a write: verified by operation_ref if uncertain)."""
    if args.amount > APPROVAL_THRESHOLD and not ctx.approved:
        raise NeedsApproval(f"amounts above {APPROVAL_THRESHOLD} need an operator")
    headers = {"Idempotency-Key": ctx.operation_ref}
    if ctx.approved:
        headers["X-Approved"] = "true"
    status, resp_headers, payload = _request(
        "POST", "/invoices", writes=True, body=args.model_dump(exclude_none=True), headers=headers
    )
    if status == 422 and isinstance(payload, dict) and payload.get("field"):
        raise InvalidInput(field=str(payload["field"]), rule=str(payload.get("rule", "invalid")))
    failure = classify_http(status, resp_headers, writes=True)
    if failure is not None:
        raise failure
    return Invoice.model_validate(payload)


@create_invoice.verifier
def find_invoice_by_operation_ref(ctx: CallContext) -> Invoice | None:
    """The invoice this operation created, or None if the provider has none."""
    path = f"/invoices?operation_ref={quote(ctx.operation_ref, safe='')}"
    status, headers, payload = _request("GET", path, writes=False)
    failure = classify_http(status, headers, writes=False)
    if failure is not None:
        raise failure  # a failing lookup is re-checked, never read as "not found"
    found = payload.get("invoices") if isinstance(payload, dict) else None
    if not isinstance(found, list):
        raise Unavailable("unexpected verifier reply", reason="bad_reply")
    return Invoice.model_validate(found[0]) if found else None


@tq.tool(writes=False, max_attempts=3, deadline=120.0)
def get_invoice(args: GetInvoice) -> Invoice:
    """Read an invoice by id (a read: safe to repeat)."""
    status, headers, payload = _request(
        "GET", f"/invoices/{quote(args.invoice_id, safe='')}", writes=False
    )
    if status == 404:
        raise NotFound(code="INVOICE_NOT_FOUND")
    failure = classify_http(status, headers, writes=False)
    if failure is not None:
        raise failure
    return Invoice.model_validate(payload)


#: ``celery -A toolq.examples.invoices:celery_app worker`` serves these tools too.
celery_app = tq.celery
