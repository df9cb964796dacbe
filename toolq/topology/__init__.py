"""The deployment's topology: chosen once, where the App is built, and asked by the rest.

Three axes, each a small strategy object (one class per mode, never an ``if``):

* **layout** (:mod:`toolq.core.layout`): where an operation's keys live, one tag or cells;
* **nodes** (:mod:`toolq.topology.nodes`): how a client reaches the server, one
  server or a Cluster;
* **publish** (:mod:`toolq.topology.publish`): where a Celery message goes, pushed
  by the script (inline) or through the outbox and a relay.

:func:`toolq.topology.choose.topology_for` is the only code that reads the settings'
mode fields. Layers: above the adapters (ledger, notify, broker), whose classes it
picks, and below the services, the App and the edges, which ask it.
"""

from toolq.topology.choose import topology_for
from toolq.topology.model import Topology

__all__ = ["Topology", "topology_for"]
