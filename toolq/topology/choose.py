"""The one place that reads the settings' mode fields (``cells``, ``cluster``,
``broker_url``) and picks the layout, nodes and publishing that serve them.

Adding a deployment mode: a class per axis that changes (a :class:`~toolq.core.layout.Layout`,
a :class:`~toolq.topology.nodes.Nodes`, a :class:`~toolq.topology.publish.Publish`,
or an adapter class they pick), and a branch here.
"""

from __future__ import annotations

from toolq.core.layout import layout_of
from toolq.core.settings import ToolqSettings
from toolq.topology.model import Topology
from toolq.topology.nodes import ClusterNodes, Nodes, OneServer
from toolq.topology.publish import publish_for


def topology_for(settings: ToolqSettings) -> Topology:
    """The topology ``settings`` describe (already validated: a Cluster has cells and
    an outbox, :meth:`ToolqSettings._cluster_needs`)."""
    nodes: Nodes = ClusterNodes() if settings.cluster else OneServer()
    publish = publish_for(settings.broker_url)
    return Topology(layout_of(settings.prefix, settings.cells), nodes, publish)
