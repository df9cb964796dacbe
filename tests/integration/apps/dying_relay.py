"""A relay that SIGKILLs itself in the middle of its first batch, as a crash would:

    python -m tests.integration.apps.dying_relay read       # after XREADGROUP, before publishing
    python -m tests.integration.apps.dying_relay published  # after publishing, before XACK

The ledger and the broker come from TOOLQ_REDIS_URL and TOOLQ_BROKER_URL.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from tests.integration.apps.outbox_app import tq
from toolq.relay.outgoing import Outgoing
from toolq.relay.service import Relay


def die(batch: Sequence[Outgoing]) -> None:
    if batch:
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    when = sys.argv[1]
    relay = Relay(
        tq.app,
        on_read=die if when == "read" else None,
        on_published=die if when == "published" else None,
    )
    relay.run()
