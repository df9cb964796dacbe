"""An example invoice service that misbehaves on purpose.

A small threaded HTTP server on 127.0.0.1 with an in-memory store. It is the
"provider" the example tools in :mod:`toolq.examples.invoices` call, and it
behaves like the real services agents write to: it deduplicates by
``Idempotency-Key`` (the real-world safety net) and it fails in every way a
real one does. Faults are chosen per request by the customer name or the
amount, and (except ``cust_down``) only on the first request carrying a given
key, so a correct recovery then succeeds:

=====================  ================================================================
customer / amount      behaviour
=====================  ================================================================
amount <= 0            422 ``{"error": "validation", "field": "amount", ...}``
amount > 100000        403 unless the request carries ``X-Approved: true``
cust_ratelimit         429 with ``Retry-After: 1``
cust_down              503 with ``Retry-After: 1``, every time
cust_conflict          409 with ``ETag: "7"`` unless ``customer_version`` is 7
cust_lostreply         commits, then closes the connection without replying
cust_slow_precommit    stalls past the client's timeout, then does NOT commit
cust_crash             commits, then stalls its reply (long enough to kill the caller)
=====================  ================================================================

Endpoints: ``POST /invoices``, ``GET /invoices?operation_ref=REF``,
``GET /invoices/ID``, and ``GET /_effects``: every commit (a side effect)
and every request the key deduplicated (a replay), so a report can count
side effects per ``operation_ref`` from the provider's own records.

Run it alone with ``python -m toolq.examples.provider --port 8099``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

APPROVAL_THRESHOLD = 100_000
CONFLICT_VERSION = 7


@dataclass
class ProviderConfig:
    #: Deduplicate by Idempotency-Key. Off, every request that reaches the
    #: commit point is a new side effect: only toolq stands between a retry
    #: and a duplicate.
    dedup: bool = True
    #: How long ``cust_slow_precommit`` stalls before giving up uncommitted.
    precommit_stall: float = 3.0
    #: How long ``cust_crash`` holds its reply after committing.
    crash_stall: float = 60.0
    #: Normal latency, uniform in this range (seconds).
    latency: tuple[float, float] = (0.005, 0.03)


@dataclass
class _Store:
    lock: threading.Lock = field(default_factory=threading.Lock)
    invoices: dict[str, dict[str, Any]] = field(default_factory=dict)
    by_ref: dict[str, list[str]] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)
    effects: list[dict[str, Any]] = field(default_factory=list)
    replays: list[dict[str, Any]] = field(default_factory=list)
    requests: int = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], OSError):
            return  # a caller killed mid-request resets its connection: expected here
        super().handle_error(request, client_address)


class InvoiceProvider:
    """The example invoice service, served from a thread of this process."""

    def __init__(self, config: ProviderConfig | None = None, *, port: int = 0) -> None:
        self.config = config or ProviderConfig()
        self.store = _Store()
        self.stopping = threading.Event()
        self._server = _Server(("127.0.0.1", port), _handler_for(self))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> InvoiceProvider:
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="toolq-example-provider", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()  # wakes every stalled request
        if self._thread is not None:
            self._server.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self._server.server_close()

    def __enter__(self) -> InvoiceProvider:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def effects(self) -> dict[str, Any]:
        """What ``GET /_effects`` returns: commits and deduplicated replays."""
        with self.store.lock:
            return {
                "effects": list(self.store.effects),
                "replays": list(self.store.replays),
                "requests": self.store.requests,
            }

    # ------------------------------------------------------------------ the behaviour

    def create(self, key: str, body: dict[str, Any], approved: bool) -> tuple[int, Any, str]:
        """Decide a POST /invoices. Returns (status, payload, fault); fault drives the edge."""
        s = self.store
        with s.lock:
            s.requests += 1
            s.seen[key] = s.seen.get(key, 0) + 1
            first = s.seen[key] == 1
        customer = str(body.get("customer", ""))
        try:
            amount = float(body.get("amount", 0))
        except (TypeError, ValueError):
            amount = 0.0
        if amount <= 0:
            return 422, {"error": "validation", "field": "amount", "rule": "must_be_positive"}, ""
        if customer == "cust_down":
            return 503, {"error": "maintenance"}, ""
        if customer == "cust_ratelimit" and first:
            return 429, {"error": "rate_limited"}, ""
        if customer == "cust_conflict" and body.get("customer_version") != CONFLICT_VERSION:
            return 409, {"error": "version_conflict", "current_version": CONFLICT_VERSION}, ""
        if amount > APPROVAL_THRESHOLD and not approved:
            return 403, {"error": "approval_required"}, ""
        if customer == "cust_slow_precommit" and first:
            self.stopping.wait(self.config.precommit_stall)
            return 0, None, "drop"  # gave up before committing
        invoice = self._commit(key, customer, amount, body)
        fault = ""
        if first and customer == "cust_lostreply":
            fault = "drop"
        elif first and customer == "cust_crash":
            fault = "stall"
        return 201, invoice, fault

    def _commit(
        self, key: str, customer: str, amount: float, body: dict[str, Any]
    ) -> dict[str, Any]:
        s = self.store
        with s.lock:
            existing = s.by_ref.get(key)
            if existing and self.config.dedup:
                s.replays.append(
                    {"operation_ref": key, "invoice_id": existing[0], "at": time.time()}
                )
                return s.invoices[existing[0]]
            invoice_id = f"inv_{len(s.invoices) + 1:05d}"
            now = time.time()
            invoice: dict[str, Any] = {
                "id": invoice_id,
                "customer": customer,
                "amount": amount,
                "currency": str(body.get("currency", "EUR")),
                "operation_ref": key,
                "created_at": now,
            }
            s.invoices[invoice_id] = invoice
            s.by_ref.setdefault(key, []).append(invoice_id)
            s.effects.append({"operation_ref": key, "invoice_id": invoice_id, "at": now})
            return invoice

    def find(self, ref: str) -> list[dict[str, Any]]:
        with self.store.lock:
            return [self.store.invoices[i] for i in self.store.by_ref.get(ref, [])]

    def get(self, invoice_id: str) -> dict[str, Any] | None:
        with self.store.lock:
            return self.store.invoices.get(invoice_id)


def _handler_for(provider: InvoiceProvider) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet: the demo prints its own progress

        def _reply(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
            raw = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(raw)

        def _drop(self) -> None:
            """Close the connection without a reply: the client cannot know what happened."""
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            if url.path == "/_effects":
                self._reply(200, provider.effects())
            elif url.path == "/invoices":
                ref = (parse_qs(url.query).get("operation_ref") or [""])[0]
                self._reply(200, {"invoices": provider.find(ref)})
            elif url.path.startswith("/invoices/"):
                found = provider.get(url.path.removeprefix("/invoices/"))
                if found is None:
                    self._reply(404, {"error": "not_found"})
                else:
                    self._reply(200, found)
            else:
                self._reply(404, {"error": "not_found"})

        def do_POST(self) -> None:
            if urlsplit(self.path).path != "/invoices":
                self._reply(404, {"error": "not_found"})
                return
            key = self.headers.get("Idempotency-Key", "")
            try:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
            except ValueError:
                body = None
            if not key or not isinstance(body, dict):
                self._reply(400, {"error": "bad_request"})
                return
            time.sleep(random.uniform(*provider.config.latency))
            approved = self.headers.get("X-Approved", "").lower() == "true"
            status, payload, fault = provider.create(key, body, approved)
            if fault == "drop":
                self._drop()
                return
            if fault == "stall":
                provider.stopping.wait(provider.config.crash_stall)
            headers = {}
            if status in (429, 503):
                headers["Retry-After"] = "1"
            if status == 409:
                headers["ETag"] = f'"{CONFLICT_VERSION}"'
            try:
                self._reply(status, payload, headers)
            except OSError:  # the caller is gone (killed mid-call)
                self.close_connection = True

    return Handler


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=8099)
    parser.add_argument("--no-dedup", action="store_true")
    opts = parser.parse_args(argv)
    provider = InvoiceProvider(ProviderConfig(dedup=not opts.no_dedup), port=opts.port).start()
    print(f"example invoice provider on {provider.url} (Ctrl-C to stop)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        provider.stop()


if __name__ == "__main__":
    main()
