"""A TCP proxy on loopback that adds a fixed delay to every chunk, both ways.

    python -m bench.delay_proxy --listen 0 --target 127.0.0.1:6379 --delay-ms 1 \
        --port-file /tmp/p --stats-file /tmp/s.json

Each direction of each connection has a reader that stamps every chunk it
reads and a writer that sends it once ``delay`` has passed since the stamp, so
the delay adds latency without limiting throughput, and order is kept. It
also counts the chunks sent client -> server: with a request/reply protocol
that is the number of round trips (a pipeline is one chunk). The counts are
written to ``--stats-file`` on SIGUSR1 and at exit.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from pathlib import Path


class Stats:
    def __init__(self) -> None:
        self.connections = 0
        self.up_chunks = 0
        self.up_bytes = 0
        self.down_chunks = 0
        self.down_bytes = 0

    def dump(self, path: Path | None) -> None:
        if path is not None:
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.__dict__))
            tmp.replace(path)


async def _pipe(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float, up: bool, st: Stats
) -> None:
    q: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await q.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.close()

    sender = asyncio.create_task(send())
    try:
        while True:
            data = await reader.read(65536)
            if up:
                st.up_chunks += bool(data)
                st.up_bytes += len(data)
            else:
                st.down_chunks += bool(data)
                st.down_bytes += len(data)
            q.put_nowait((time.monotonic() + delay, data))
            if not data:
                break
    except (ConnectionError, OSError):
        q.put_nowait((0.0, b""))
    with contextlib.suppress(ConnectionError, OSError):
        await sender


async def serve(
    listen: int, host: str, port: int, delay: float, st: Stats, port_file: Path | None
) -> None:
    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        st.connections += 1
        try:
            sr, sw = await asyncio.open_connection(host, port)
        except OSError:
            cw.close()
            return
        for w in (cw, sw):
            sock = w.get_extra_info("socket")
            if sock is not None:
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(
            _pipe(cr, sw, delay, True, st),
            _pipe(sr, cw, delay, False, st),
            return_exceptions=True,
        )

    server = await asyncio.start_server(handle, "127.0.0.1", listen, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    if port_file is not None:
        port_file.write_text(str(bound))
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--listen", type=int, default=0)
    ap.add_argument("--target", required=True, help="HOST:PORT")
    ap.add_argument("--delay-ms", type=float, default=1.0)
    ap.add_argument("--port-file", type=Path)
    ap.add_argument("--stats-file", type=Path)
    a = ap.parse_args()
    host, _, port = a.target.rpartition(":")
    st = Stats()
    loop = asyncio.new_event_loop()
    loop.add_signal_handler(signal.SIGUSR1, st.dump, a.stats_file)
    loop.add_signal_handler(signal.SIGTERM, loop.stop)
    task = loop.create_task(serve(a.listen, host, int(port), a.delay_ms / 1000, st, a.port_file))
    try:
        loop.run_forever()
    finally:
        task.cancel()
        st.dump(a.stats_file)


if __name__ == "__main__":
    main()
