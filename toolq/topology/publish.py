"""Where a Celery message goes: pushed by the ledger's script onto its queue (inline),
or appended to the cell's outbox stream for a relay to publish to ``broker_url``.

One class per mode behind :class:`Publish`, picked by the topology.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from pydantic import SecretStr

from toolq.core.redact import redact_url


class Publish(ABC):
    """Where the ledger's scripts put the messages they make."""

    #: The scripts append to the outbox (the ledger's calls name its stream).
    via_outbox: bool = False

    @abstractmethod
    def broker(self, ledger_url: str | None) -> str | None:
        """The Celery broker's URL, given the ledger's (None: not known yet)."""

    @property
    def needs_relay(self) -> bool:
        """A stack starts relays; status and the monitor read the outbox."""
        return self.via_outbox

    @property
    @abstractmethod
    def safe_broker(self) -> str:
        """The broker, for a log line (credentials redacted)."""


class Inline(Publish):
    """The ledger's server is the broker: the script pushes each message to its queue
    list in the same atomic call as the transition."""

    def broker(self, ledger_url: str | None) -> str | None:
        return ledger_url

    @property
    def safe_broker(self) -> str:
        return "(ledger)"


@dataclass(frozen=True)
class Outbox(Publish):
    """The broker is elsewhere (RabbitMQ, a Redis of its own, Sentinel): the script
    appends to the cell's outbox stream and ``toolq relay`` publishes it to ``url``."""

    url: SecretStr = field(repr=False)
    via_outbox = True

    def broker(self, ledger_url: str | None) -> str:
        return self.url.get_secret_value()

    @property
    def safe_broker(self) -> str:
        return redact_url(self.url.get_secret_value())


def publish_for(broker_url: SecretStr | str | None) -> Publish:
    """Where messages go, given the broker's URL (``TOOLQ_BROKER_URL``; unset: the
    ledger's server is the broker)."""
    if not broker_url:
        return Inline()
    return Outbox(broker_url if isinstance(broker_url, SecretStr) else SecretStr(broker_url))
