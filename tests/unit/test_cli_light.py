"""``toolq status`` and ``toolq show`` answer without importing the app or Celery: the
read-only commands a person types most stay under 0.3 s (issue 31)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import toolq_env

HEAVY = ("celery", "kombu", "fastapi", "toolq.client.app", "toolq.examples.invoices")

# The command runs in this process as `toolq ...` would; then what it imported is printed.
RUN = """
import json, sys
from toolq.edges.cli import main
try:
    main(sys.argv[1:], standalone_mode=False)
except BaseException:
    pass
print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)))
"""


@pytest.mark.parametrize(
    "args",
    [["status"], ["show", "op_1"], ["show", "op_1", "--state-dir", "/nonexistent"]],
    ids=["status", "show", "show-state-dir"],
)
def test_status_and_show_import_neither_celery_nor_the_app(args: list[str]) -> None:
    # Given no server there (the command fails at its first read, after its imports)
    result = subprocess.run(
        [sys.executable, "-c", RUN.format(heavy=HEAVY), *args],
        env=toolq_env({"TOOLQ_REDIS_URL": "redis://127.0.0.1:1/0"}, unset=("TOOLQ_APP",)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    # Then nothing heavy was imported on its way
    assert json.loads(result.stdout.strip().splitlines()[-1]) == [], result.stdout


def test_show_json_still_loads_the_app_for_the_tools_schema() -> None:
    # --json shows the arguments: the tool's schema says which are secret
    result = subprocess.run(
        [sys.executable, "-c", RUN.format(heavy=HEAVY), "show", "op_1", "--json"],
        env=toolq_env({"TOOLQ_REDIS_URL": "redis://127.0.0.1:1/0"}, unset=("TOOLQ_APP",)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "toolq.client.app" in json.loads(result.stdout.strip().splitlines()[-1])
