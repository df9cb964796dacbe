"""A real Redis Sentinel deployment for tests: a primary, a replica and one Sentinel,
each the embedded Valkey binary (:class:`toolq.adapters.embedded.EmbeddedServer`, so each dies
with the test run), the Sentinel run as ``valkey-server <conf> --sentinel``.

Quorum 1 and short timeouts (``down-after-milliseconds`` 500, ``failover-timeout``
2000): a SIGKILLed primary is replaced by its replica in about a second on loopback.
Free ports; :meth:`SentinelGroup.stop` stops every server it started, and nothing else.

:meth:`SentinelGroup.kill_primary` SIGKILLs the primary and returns once the Sentinel
names the replica and the replica answers as a primary. :meth:`SentinelGroup.cut_off`
keeps the replica from the primary's last writes beforehand, so that the
failover loses them, as an asynchronous replica can.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import redis

from tests.cluster import wait_for
from toolq.adapters.embedded import HOST, EmbeddedServer

#: The name the Sentinel monitors the primary under (``broker_master_name``).
MASTER_NAME = "toolq-broker"
DOWN_AFTER_MS = 500
FAILOVER_TIMEOUT_MS = 2000


def _client(server: EmbeddedServer) -> redis.Redis:
    return redis.Redis(host=HOST, port=server.port, socket_timeout=5, decode_responses=True)


class SentinelGroup:
    """A primary, a replica of it, and a Sentinel watching them (see the module)."""

    def __init__(self, master_name: str = MASTER_NAME) -> None:
        self.master_name = master_name
        self.servers: list[EmbeddedServer] = []
        self.sentinel: EmbeddedServer | None = None
        self._root: Path | None = None
        #: Seconds the last :meth:`kill_primary` took to see the replica promoted.
        self.failover_seconds = 0.0

    def start(self) -> Self:
        self._root = Path(tempfile.mkdtemp(prefix="toolq-sentinel-"))
        try:
            primary = self._spawn("primary", {})
            self._spawn("replica", {"replicaof": f"{HOST} {primary.port}"})
            wait_for("the replica to be in sync", self._replica_synced)
            self.sentinel = self._spawn(
                "sentinel",
                {
                    "sentinel monitor": f"{self.master_name} {HOST} {primary.port} 1",
                    "sentinel down-after-milliseconds": f"{self.master_name} {DOWN_AFTER_MS}",
                    "sentinel failover-timeout": f"{self.master_name} {FAILOVER_TIMEOUT_MS}",
                },
                sentinel=True,
            )
            wait_for("the Sentinel to know the replica", self._replica_known)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every server this group started; remove their files."""
        for server in [*self.servers, *([self.sentinel] if self.sentinel else [])]:
            server.stop(timeout=5.0)
        self.servers, self.sentinel = [], None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ----------------------------------------------------------------- what tests use

    @property
    def url(self) -> str:
        """The broker URL: kombu's Sentinel form (``broker_master_name`` is :attr:`master_name`)."""
        assert self.sentinel is not None
        return f"sentinel://{HOST}:{self.sentinel.port}/0"

    def primary(self) -> EmbeddedServer:
        """The server the Sentinel names the primary now."""
        assert self.sentinel is not None
        with _client(self.sentinel) as c:
            _, port = c.sentinel_get_master_addr_by_name(self.master_name)
        return next(s for s in self.servers if s.port == int(port))

    def client(self) -> redis.Redis:
        """A client on the current primary (close it)."""
        return redis.Redis(host=HOST, port=self.primary().port, socket_timeout=5)

    def replica(self) -> EmbeddedServer:
        """The server that is not the primary now."""
        primary = self.primary()
        return next(s for s in self.servers if s is not primary)

    def cut_off(self, replica: EmbeddedServer) -> None:
        """Keep ``replica`` from the primary's writes from now on, until :meth:`thaw`:
        SIGSTOP it (it cannot connect again), then close its link on the primary
        (writes already sent would still reach it from its socket's buffer). What the
        primary takes meanwhile, a failover loses."""
        os.kill(replica.pid, signal.SIGSTOP)
        with _client(self.primary()) as c:
            c.client_kill_filter(_type="replica")

    def thaw(self, server: EmbeddedServer) -> None:
        os.kill(server.pid, signal.SIGCONT)

    def kill_primary(self, timeout: float = 20.0) -> EmbeddedServer:
        """SIGKILL the primary; return it once the Sentinel names the replica, which
        answers as a primary (:attr:`failover_seconds`: how long that took)."""
        victim = self.primary()
        began = time.monotonic()
        victim.kill()
        for server in self.servers:  # a replica cut off takes part from now on
            if server is not victim:
                self.thaw(server)

        def promoted() -> bool:
            now = self.primary()
            if now is victim:
                return False
            with _client(now) as c:
                return c.info("replication").get("role") == "master"

        wait_for("the Sentinel to promote the replica", promoted, timeout)
        self.failover_seconds = time.monotonic() - began
        return victim

    # ----------------------------------------------------------------- internals

    def _spawn(self, name: str, config: dict[str, str], sentinel: bool = False) -> EmbeddedServer:
        assert self._root is not None
        config = {"repl-diskless-sync-delay": "0", **config} if not sentinel else config
        server = EmbeddedServer(
            self._root / name,
            appendonly=False,
            databases=1,
            extra_config=config,
            sentinel=sentinel,
        )
        if not sentinel:
            self.servers.append(server)
        server.start()
        return server

    def _replica_synced(self) -> bool:
        with _client(self.servers[1]) as c:
            return c.info("replication").get("master_link_status") == "up"

    def _replica_known(self) -> bool:
        assert self.sentinel is not None
        with _client(self.sentinel) as c:
            replicas = c.sentinel_slaves(self.master_name)
        return any(r["port"] == self.servers[1].port and not r["is_sdown"] for r in replicas)
