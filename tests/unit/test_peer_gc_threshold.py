"""The asyncio-pool bench's configured variant for the peers' workers
(:func:`bench.peers.gc_threshold_from_env`): the collector's first threshold from
``BENCH_PEER_GC_THRESHOLD``, CPython's left alone without it."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from bench.peers import GC_THRESHOLD_ENV, gc_threshold_from_env


@pytest.fixture
def threshold() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.set_threshold(*before)


@pytest.mark.usefixtures("threshold")
def test_the_variant_sets_the_first_threshold_only(monkeypatch: pytest.MonkeyPatch) -> None:
    # Given the variant asked for in the worker's environment
    gc.set_threshold(700, 10, 10)
    monkeypatch.setenv(GC_THRESHOLD_ENV, "10000")
    # When the peer's worker module sets it up
    gc_threshold_from_env()
    # Then the first threshold is the one asked for, the others as they were
    assert gc.get_threshold() == (10000, 10, 10)


@pytest.mark.usefixtures("threshold")
def test_without_it_the_collector_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    gc.set_threshold(700, 10, 10)
    monkeypatch.delenv(GC_THRESHOLD_ENV, raising=False)
    gc_threshold_from_env()
    assert gc.get_threshold() == (700, 10, 10)
