"""The tools ``python -m bench limits`` runs: each calls the bench's provider over HTTP.

The provider (:mod:`bench.limits_provider`) is at ``BENCH_PROVIDER_URL``. A call's
dependency key is in its arguments (``dep``), so one tool serves every scenario;
the limits below are the issue's numbers, and the bench overrides them per run with
``TOOLQ_DEPENDENCIES`` (settings win over code, field by field). The ``noop*`` tools
are the overhead scenario's load: ``noop`` is :func:`bench.apps.noop` again (no key),
``noop_keyed`` names a key with no limits, ``noop_rated`` one with a generous rate.
"""

from __future__ import annotations

import http.client
import json
import os
from typing import Any
from urllib.parse import urlencode, urlsplit

from pydantic import BaseModel

from toolq import CallContext, ToolQueue
from toolq.core.classify import classify_exception, classify_http

tq = ToolQueue(name="benchlimits")
celery_app = tq.celery

#: The issue's numbers (``TOOLQ_DEPENDENCIES`` overrides them in a run).
tq.limit("rated", rate="20/s")
tq.limit("conc", concurrency=5)
tq.limit("down", breaker_failures=5, breaker_window=30, breaker_open=30)
tq.limit("generous", rate="1000000/s", burst=1000)

TIMEOUT_S = 30.0


class Call(BaseModel):
    dep: str
    n: int = 0
    #: How long the provider holds the call (a slow tool), seconds.
    hold: float = 0.0


def _post(path: str, params: dict[str, Any], *, writes: bool) -> None:
    """One request to the provider; its answer, or what went wrong, as a ToolFailure."""
    url = urlsplit(os.environ["BENCH_PROVIDER_URL"])
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=TIMEOUT_S)
    try:
        conn.request(
            "POST", f"{path}?{urlencode(params)}", headers={"X-Caller-Pid": str(os.getpid())}
        )
        resp = conn.getresponse()
        resp.read()
    except Exception as exc:
        raise classify_exception(exc, writes=writes) from exc
    finally:
        conn.close()
    if failure := classify_http(resp.status, dict(resp.getheaders()), writes=writes):
        raise failure


@tq.tool(writes=False, dependency=lambda a: a.dep, max_attempts=20)
def provider_read(args: Call, ctx: CallContext) -> dict[str, Any]:
    _post("/call", {"ref": ctx.operation_ref, "hold": args.hold, "write": 0}, writes=False)
    return {}


@tq.tool(writes=True, dependency=lambda a: a.dep)
def provider_write(args: Call, ctx: CallContext) -> dict[str, Any]:
    _post("/call", {"ref": ctx.operation_ref, "hold": args.hold, "write": 1}, writes=True)
    return {}


@provider_write.verifier
def _written(ctx: CallContext) -> Any:
    url = urlsplit(os.environ["BENCH_PROVIDER_URL"])
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=TIMEOUT_S)
    try:
        conn.request("GET", f"/committed?{urlencode({'ref': ctx.operation_ref})}")
        body = json.loads(conn.getresponse().read())
    finally:
        conn.close()
    return {"found": True} if body["count"] else None


class NoArgs(BaseModel):
    n: int = 0


@tq.tool(writes=True)
def noop(args: NoArgs) -> dict[str, Any]:
    return {}


@tq.tool(writes=True, dependency="free")
def noop_keyed(args: NoArgs) -> dict[str, Any]:
    return {}


@tq.tool(writes=True, dependency="generous")
def noop_rated(args: NoArgs) -> dict[str, Any]:
    return {}


for _t in (noop, noop_keyed, noop_rated):
    _t.verifier(lambda ctx: None)
