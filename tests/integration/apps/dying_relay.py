"""A relay that SIGKILLs itself in the middle of its first batch, as a crash would:

    python -m tests.integration.apps.dying_relay read       # after XREADGROUP, before publishing
    python -m tests.integration.apps.dying_relay published  # after publishing, before XACK
    python -m tests.integration.apps.dying_relay read MODULE:ATTR  # another app's relay

The ledger and the broker come from TOOLQ_REDIS_URL and TOOLQ_BROKER_URL (and
TOOLQ_CELLS, TOOLQ_CLUSTER); the app is the outbox tests' unless one is named.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from toolq.edges.loader import load_app
from toolq.services.relay.outgoing import Outgoing
from toolq.services.relay.service import Relay

OUTBOX_APP = "tests.integration.apps.outbox_app:tq"


def die(batch: Sequence[Outgoing]) -> None:
    if batch:
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    when = sys.argv[1]
    tq = load_app(sys.argv[2] if len(sys.argv) > 2 else OUTBOX_APP)
    relay = Relay(
        tq.app,
        on_read=die if when == "read" else None,
        on_published=die if when == "published" else None,
    )
    relay.run()
