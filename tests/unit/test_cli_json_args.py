"""What ``--args`` and ``--result`` take: JSON, and only JSON; a malformed one is one line
and exit 2, read before the app is loaded or the server asked (none listens here)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from toolq.edges.cli import main

DEEP = "[" * 50_000 + "]" * 50_000  # json's C decoder recurses once per level

NOWHERE = {"TOOLQ_REDIS_URL": "redis://127.0.0.1:1/0"}


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["submit", "t", "--args", DEEP], "--args is nested too deeply to be read"),
        (["input", "r", "--args", DEEP], "--args is nested too deeply to be read"),
        (
            ["resolve", "r", "--committed", "--reason", "x", "--result", DEEP],
            "--result is nested too deeply to be read",
        ),
        (["submit", "t", "--args", '{"a": NaN}'], "--args is not valid JSON: NaN is not"),
        (["submit", "t", "--args", '{"a": Infinity}'], "Infinity is not a JSON number"),
        (
            ["resolve", "r", "--committed", "--reason", "x", "--result", "-Infinity"],
            "--result is not valid JSON: -Infinity is not a JSON number",
        ),
    ],
    ids=["deep-args", "deep-input", "deep-result", "nan", "infinity", "minus-infinity"],
)
def test_json_that_is_not_json_or_too_deep_is_one_line(args: list[str], said: str) -> None:
    result = CliRunner().invoke(main, args, env=NOWHERE)
    assert result.exit_code == 2, result.output
    assert said in result.output
    assert isinstance(result.exception, SystemExit), result.exception
