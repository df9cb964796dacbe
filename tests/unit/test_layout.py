"""The layout (toolq.core.layout) and the topology chosen from the settings (toolq.topology):
pure, one row per layout."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from toolq.core.cells import cell_of
from toolq.core.keys import Keys
from toolq.core.layout import Cells, Layout, SingleTag, layout_of
from toolq.core.settings import ToolqSettings
from toolq.topology import Topology, topology_for
from toolq.topology.nodes import ClusterNodes, OneServer
from toolq.topology.publish import Inline, Outbox, publish_for

REFS = ["op-1", "call_7f3a", "é/ref", "op-1"]

# layout,             cells, every cell's keys
LAYOUTS = [
    (SingleTag("t"), None, [Keys("t")]),
    (Cells("t", 1), 1, [Keys("t", 0)]),
    (Cells("t", 3), 3, [Keys("t", 0), Keys("t", 1), Keys("t", 2)]),
]


@pytest.mark.parametrize(("layout", "cells", "every"), LAYOUTS)
def test_a_layout_names_its_cells(layout: Layout, cells: int | None, every: list[Keys]) -> None:
    assert layout.cells == cells
    assert layout.every_cell() == every
    assert layout.root == Keys("t")
    assert layout.channels() == [k.notify for k in every]
    assert layout.channels(steps=True) == [k.notify_steps for k in every]
    assert layout.outbox_streams() == [k.outbox for k in every]
    assert layout_of("t", cells) == layout


@pytest.mark.parametrize(("layout", "cells", "every"), LAYOUTS)
def test_a_ref_lives_in_one_of_every_cell(
    layout: Layout, cells: int | None, every: list[Keys]
) -> None:
    for ref in REFS:
        expected = Keys("t") if cells is None else Keys("t", cell_of(ref, cells))
        assert layout.keys_of(ref) == expected
        assert expected in every


@pytest.mark.parametrize(("layout", "cells", "every"), LAYOUTS)
def test_refs_group_by_cell_in_order(layout: Layout, cells: int | None, every: list[Keys]) -> None:
    groups = layout.group(REFS)
    assert sorted(i for where in groups.values() for i in where) == list(range(len(REFS)))
    for keys, where in groups.items():
        assert where == sorted(where)
        assert all(layout.keys_of(REFS[i]) == keys for i in where)
    assert list(groups) == list(dict.fromkeys(layout.keys_of(r) for r in REFS))


# layout,            recorded, refused
CONFLICTS = [
    (SingleTag("t"), None, False),
    (SingleTag("t"), b"256", True),  # migrated into cells: the single tag reads nothing
    (Cells("t", 256), None, False),
    (Cells("t", 256), "256", False),
    (Cells("t", 256), b"16", True),
]


@pytest.mark.parametrize(("layout", "recorded", "refused"), CONFLICTS)
def test_a_layout_refuses_another_recorded_one(
    layout: Layout, recorded: str | bytes | None, refused: bool
) -> None:
    assert (layout.conflict(recorded) is not None) == refused


@pytest.mark.parametrize("n", [0, -1, 16385, True])
def test_cells_are_checked(n: int) -> None:
    with pytest.raises(ValueError, match="number of cells"):
        Cells("t", n)


BROKER = "amqp://guest:secret@rabbit:5672//"

# settings,                                                 layout,          nodes,        publish
TOPOLOGIES = [
    ({}, SingleTag("t"), OneServer, Inline),
    ({"cells": 4}, Cells("t", 4), OneServer, Inline),
    ({"broker_url": BROKER}, SingleTag("t"), OneServer, Outbox),
    ({"cells": 4, "broker_url": BROKER}, Cells("t", 4), OneServer, Outbox),
    ({"cells": 4, "broker_url": BROKER, "cluster": True}, Cells("t", 4), ClusterNodes, Outbox),
]


@pytest.mark.parametrize(("fields", "layout", "nodes", "publish"), TOPOLOGIES)
def test_the_topology_is_chosen_from_the_settings(
    fields: dict[str, object], layout: Layout, nodes: type, publish: type
) -> None:
    settings = ToolqSettings.model_validate({"prefix": "t", **fields})
    topology = topology_for(settings)
    assert isinstance(topology, Topology)
    assert topology.layout == layout
    assert type(topology.nodes) is nodes
    assert type(topology.publish) is publish
    assert topology.on_cluster == (nodes is ClusterNodes)
    outbox = publish is Outbox
    assert topology.publishes_via_outbox == outbox == topology.needs_relay
    assert topology.broker("redis://ledger:6379") == (BROKER if outbox else "redis://ledger:6379")
    assert "secret" not in topology.safe_broker
    assert "secret" not in repr(topology)


def test_an_outbox_broker_is_its_url() -> None:
    assert Outbox(SecretStr(BROKER)).broker(None) == BROKER
    assert Inline().broker(None) is None


# the broker URL (TOOLQ_BROKER_URL, as `toolq up` reads it), where messages go
PUBLISH = [(None, Inline), ("", Inline), (BROKER, Outbox), (SecretStr(BROKER), Outbox)]


@pytest.mark.parametrize(("url", "publish"), PUBLISH)
def test_a_broker_url_means_the_outbox(url: str | SecretStr | None, publish: type) -> None:
    assert type(publish_for(url)) is publish
    assert publish_for(url).needs_relay == (publish is Outbox)


def test_only_a_cluster_bounds_the_async_commands_in_flight() -> None:
    # A Cluster's node raises when out of connections; one server's pool waits.
    one = OneServer().async_client("redis://127.0.0.1:1/0", {"max_connections": 4})
    assert OneServer().bound(one, 2) is None
    cluster = ClusterNodes()
    many = cluster.async_client("redis://127.0.0.1:1", {"max_connections": 4})
    bound = cluster.bound(many, 2)
    assert bound is not None and many.in_flight is bound  # type: ignore[attr-defined]
