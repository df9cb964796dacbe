"""The asyncio-pool bench's ``http`` tool body (issue 29, :mod:`bench.aio_pool_bench`),
one for every system: a GET to the local provider that answers after ``seconds``,
through an ``httpx.AsyncClient`` made for the call (one shared by 2,000 calls holds the
loop for minutes: :mod:`bench.aio_pool_app`), the SSL context made once per process.

Imported by toolq's tool (:mod:`bench.aio_pool_app`), saq's worker (toolq's venv) and
arq's (``.venv-arq``): the standard library, httpx and redis-py only.
"""

from __future__ import annotations

import ssl

import httpx

from bench.peers.inflight import InFlight

#: Made once: a client's own would load the CA bundle at each call.
_ssl = ssl.create_default_context()


async def get_after(url: str, seconds: float, inflight: InFlight) -> None:
    """GET ``url?s=seconds`` on a client of its own, the request counted in flight."""
    async with httpx.AsyncClient(timeout=120, verify=_ssl) as http:
        await inflight.counted(http.get(f"{url}?s={seconds}"))
