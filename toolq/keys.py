"""Every Redis key and channel toolq uses, in one place.

The ledger's keys start with the settings prefix. Celery's own keys (queue
lists, ``unacked``) are kombu's and are named by the queue settings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keys:
    prefix: str = "toolq"

    def op(self, ref: str) -> str:
        return f"{self.prefix}:op:{ref}"

    def history(self, ref: str) -> str:
        return f"{self.prefix}:hist:{ref}"

    @property
    def due(self) -> str:
        """Sorted set: operation ref -> the next time the scheduler must look at it (ms)."""
        return f"{self.prefix}:due"

    @property
    def wake(self) -> str:
        """List the scheduler blocks on; pushed when an earlier due item is added."""
        return f"{self.prefix}:wake"

    @property
    def sleep_until(self) -> str:
        """When a sleeping scheduler plans to wake (ms); earlier due items wake it."""
        return f"{self.prefix}:sleep_until"

    @property
    def notify(self) -> str:
        """Pub/Sub channel: ``<state> <ref>`` when an operation settles (``tq.wait``)."""
        return f"{self.prefix}:notify"

    @property
    def tools(self) -> str:
        return f"{self.prefix}:tools"

    @property
    def stats(self) -> str:
        """Hash of counters: ``<tool>|<counter>``."""
        return f"{self.prefix}:stats"

    def index(self, tool: str, state: str) -> str:
        """Sorted set: refs of ``tool`` in ``state``, scored by when they entered it (ms)."""
        return f"{self.prefix}:idx:{tool}:{state}"

    @property
    def schedulers(self) -> str:
        """Hash: scheduler id -> last heartbeat (ms)."""
        return f"{self.prefix}:schedulers"
