"""``TOOLQ_<GROUP>__<NAME>`` variables no setting reads are said, once a process:
pydantic passes over them (``extra="ignore"``), so a typo kept the default silently."""

from __future__ import annotations

import logging

import pytest

from toolq.core import settings
from toolq.core.settings import ToolqSettings, stray_nested


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


def test_a_stray_variable_is_said_once_a_process_however_many_settings_are_read(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(settings, "_stray_said", set())
    monkeypatch.setenv("TOOLQ_LEASE__SECONDZ", "3")
    with caplog.at_level(logging.WARNING, logger="toolq.settings"):
        first = ToolqSettings()
        ToolqSettings()
    lines = [r.getMessage() for r in caplog.records if r.name == "toolq.settings"]
    assert lines == ["TOOLQ_LEASE__SECONDZ is not a setting toolq reads: lease has seconds"]
    assert first.lease.seconds == ToolqSettings.model_fields["lease"].default.seconds
