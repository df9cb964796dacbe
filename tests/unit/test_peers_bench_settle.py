"""When a smoke run of ``python -m bench crash`` stops settling (bench.peers_bench)."""

from __future__ import annotations

import pytest

from bench.peers_bench import SMOKE_COMPLETE_S, smoke_quiet_s, smoke_settled
from toolq.core.settings import LeaseSettings, RecoverySettings, ToolqSettings

QUIET = 30.0


@pytest.mark.parametrize(
    ("now", "complete_since", "unchanged_since", "settled"),
    [
        # a write still lost, the counters moving: wait
        (100.0, None, 99.0, False),
        # every write done, not yet for SMOKE_COMPLETE_S: wait
        (100.0, 100.0 - SMOKE_COMPLETE_S + 1, 100.0, False),
        # every write done for SMOKE_COMPLETE_S: stop
        (100.0, 100.0 - SMOKE_COMPLETE_S, 90.0, True),
        # a write lost, the counters still for less than the quiet bound (a lease
        # running out, a message about to be published again): wait
        (100.0, None, 100.0 - QUIET + 1, False),
        # a write lost and the counters still for the quiet bound (lost for good): stop
        (100.0, None, 100.0 - QUIET, True),
    ],
)
def test_smoke_settled(
    now: float, complete_since: float | None, unchanged_since: float, settled: bool
) -> None:
    assert smoke_settled(now, complete_since, unchanged_since, QUIET) is settled


@pytest.mark.parametrize(
    ("lease", "unclaimed_after", "quiet"),
    [
        (15.0, 60.0, 15 + 60 + 5 + SMOKE_COMPLETE_S),  # the defaults: 90 s
        (5.0, 10.0, 5 + 10 + 5 + SMOKE_COMPLETE_S),  # tests/e2e/test_peers_bench.py: 30 s
    ],
)
def test_the_quiet_bound_outlasts_toolqs_recovery(
    lease: float, unclaimed_after: float, quiet: float
) -> None:
    settings = ToolqSettings(
        lease=LeaseSettings(seconds=lease),
        recovery=RecoverySettings(unclaimed_after=unclaimed_after),
    )
    assert smoke_quiet_s(settings) == quiet
