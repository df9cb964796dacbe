"""``TOOLQ_<GROUP>__<NAME>`` variables no setting reads, and top-level ``TOOLQ_<NAME>``
ones near a name toolq reads, are said, once a process: pydantic passes over them
(``extra="ignore"``), so a typo kept the default silently."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from toolq.core import settings
from toolq.core.settings import ToolqSettings, stray_nested, stray_top


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({}, []),
        ({"TOOLQ_LEASE__SECONDS": "30", "TOOLQ_WORKER__RESERVE": "1"}, []),
        ({"toolq_lease__seconds": "30"}, []),  # pydantic reads names in any case
        ({"TOOLQ_REDIS_URL": "redis://x", "TOOLQ_API_TOKENS": "t=read"}, []),  # not nested
        ({"OTHER__LEASE": "1", "TOOLQ_LEASESECONDS": "3"}, []),  # not toolq's nested form
        (
            {"TOOLQ_LEASE__SECONDZ": "3"},
            ["TOOLQ_LEASE__SECONDZ is not a setting toolq reads: lease has seconds"],
        ),
        (
            {"TOOLQ_WORKERS__RESERVE": "1"},
            [
                "TOOLQ_WORKERS__RESERVE is not a setting toolq reads: no settings group "
                "'workers' (the groups: client, lease, limits, queues, recovery, relay, "
                "scheduler, worker)"
            ],
        ),
        (
            {"TOOLQ_API__TOKENS": "t=read"},  # the API's own are TOOLQ_API_<NAME>
            [
                "TOOLQ_API__TOKENS is not a setting toolq reads: no settings group 'api' "
                "(the groups: client, lease, limits, queues, recovery, relay, scheduler, "
                "worker)"
            ],
        ),
    ],
)
def test_what_a_nested_variable_names_that_no_setting_reads(
    environ: dict[str, str], said: list[str]
) -> None:
    assert stray_nested(environ) == said


STRAY = "{} is not a setting toolq reads:"


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("TOOLQ_LEASE__SECONDZ", "3", f"{STRAY.format('TOOLQ_LEASE__SECONDZ')} lease has seconds"),
        ("TOOLQ_PREFX", "billing", f"{STRAY.format('TOOLQ_PREFX')} did you mean TOOLQ_PREFIX?"),
    ],
)
def test_a_stray_variable_is_said_once_a_process_however_many_settings_are_read(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    name: str,
    value: str,
    line: str,
) -> None:
    monkeypatch.setattr(settings, "_stray_said", set())
    monkeypatch.setenv(name, value)
    with caplog.at_level(logging.WARNING, logger="toolq.settings"):
        first = ToolqSettings()
        ToolqSettings()
    lines = [r.getMessage() for r in caplog.records if r.name == "toolq.settings"]
    assert lines == [line]
    # what the warning is for: the default stays
    assert first.lease.seconds == ToolqSettings.model_fields["lease"].default.seconds
    assert first.prefix == "toolq"


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        ({}, []),
        # toolq's own names, in any case, and the API's and the console's
        ({"TOOLQ_PREFIX": "a", "toolq_redis_url": "x", "TOOLQ_APP": "m:tq"}, []),
        ({"TOOLQ_API_TOKENS": "t=read", "TOOLQ_CONSOLE_SESSION_SECRET": "s"}, []),
        # a deployment's own names, far from any of toolq's
        ({"TOOLQ_TEST_REDIS_URL": "x", "TOOLQ_POOL": "threads", "TOOLQ_PREFETCH": "4"}, []),
        ({"TOOLQ_": "x", "TOOLQ_LEASE__SECONDZ": "3"}, []),  # nested: stray_nested's
        # near misses: the name meant
        (
            {"TOOLQ_PREFX": "billing"},
            ["TOOLQ_PREFX is not a setting toolq reads: did you mean TOOLQ_PREFIX?"],
        ),
        (
            {"TOOLQ_REDIS_ULR": "redis://x", "TOOLQ_STATEDIR": "/s"},
            [
                "TOOLQ_REDIS_ULR is not a setting toolq reads: did you mean TOOLQ_REDIS_URL?",
                "TOOLQ_STATEDIR is not a setting toolq reads: did you mean TOOLQ_STATE_DIR?",
            ],
        ),
        (
            {"toolq_durabilty": "none"},
            ["toolq_durabilty is not a setting toolq reads: did you mean TOOLQ_DURABILITY?"],
        ),
    ],
)
def test_what_a_top_level_variable_near_a_known_name_is_said(
    environ: dict[str, str], said: list[str]
) -> None:
    assert stray_top(environ) == said


def test_every_top_level_name_toolq_reads_is_known_to_the_near_miss_check() -> None:
    # Every TOOLQ_<NAME> the source names (no nested ``__``, not a prefix ending in
    # ``_``) is a setting, one of OTHER_NAMES or under OTHER_PREFIXES: a name added
    # elsewhere and not here would be said as a typo of its neighbour.
    root = Path(settings.__file__).resolve().parents[1]
    names = set()
    for path in root.rglob("*.py"):
        if path.name == "settings.py" and path.parent.name == "core":
            continue  # the check's own module: its typos are examples
        names |= set(re.findall(r"\bTOOLQ_([A-Z0-9_]*[A-Z0-9])\b", path.read_text("utf-8")))
    top = {n for n in names if "__" not in n}
    known = {n.upper() for n in ToolqSettings.model_fields} | settings.OTHER_NAMES
    unknown = {n for n in top if n not in known and not n.startswith(settings.OTHER_PREFIXES)}
    assert len(top) > 10  # the scan found the source's names
    assert unknown == set()
    assert stray_top({f"TOOLQ_{n}": "x" for n in top}) == []
