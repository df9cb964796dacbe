"""The Valkey Cluster fixture (tests/cluster.py): one cluster per test module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.cluster import Cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    """Three primaries with a replica each, started once for the module, stopped after it.

    A test that kills a node revives it before it ends, so the next test finds
    three primaries with a replica each again.
    """
    with Cluster(primaries=3, replicas=1) as started:
        yield started
