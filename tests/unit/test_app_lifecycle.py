"""The App's lifecycle: what configure(), adopt() and close() stop and rebuild."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from toolq.client.app import App
from toolq.core.layout import Cells, SingleTag
from toolq.core.settings import ToolqSettings
from toolq.topology.publish import Inline, Outbox


def test_configure_stops_the_lease_thread() -> None:
    # Given a runtime whose lease thread runs (started by its first delivery's holder)
    app = App("redis://127.0.0.1:1/0")
    leases = app.runtime.leases
    leases.new_holder()
    thread = leases._thread
    assert thread is not None and thread.is_alive()
    # When the app is pointed at another server
    app.configure(redis_url="redis://127.0.0.1:2/0")
    # Then the old thread ends (it renewed through the old ledger) and a new runtime is made
    thread.join()
    assert not thread.is_alive()
    assert app.runtime is not None and app.runtime.leases is not leases
    app.close()


def test_a_refused_url_leaves_the_app_on_the_one_it_had() -> None:
    app = App("redis://127.0.0.1:1/0")
    for bad in ("http://:s3cret@elsewhere:1/0", "redis://127.0.0.1:99999/0"):
        with pytest.raises(ValidationError) as refused:
            app.configure(redis_url=bad)
        assert "s3cret" not in str(refused.value)
        assert app.redis_url == "redis://127.0.0.1:1/0"  # was the refused one
    app.close()


def test_the_topology_follows_the_settings() -> None:
    app = App("redis://127.0.0.1:1/0", settings=ToolqSettings(prefix="t"))
    assert app.topology.layout == SingleTag("t")
    assert isinstance(app.topology.publish, Inline)
    assert app.topology is app.topology  # chosen once
    app.configure_broker("amqp://rabbit//")
    assert isinstance(app.topology.publish, Outbox)
    app.adopt(app.settings.model_copy(update={"cells": 8}))
    assert app.topology.layout == Cells("t", 8)
    assert app.notify_channels() == [k.notify for k in Cells("t", 8).every_cell()]
