"""The README's "Use it from Python" example, run as written: extracted from the README
(not copied), its tools served by a real ``toolq worker`` that imports it, its main part
run as a script, against the example invoice provider it points to."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from tests.helpers import REPO_ROOT, start_worker, stop_process, toolq_env
from toolq.examples.provider import InvoiceProvider

README = REPO_ROOT / "README.md"


def python_example() -> str:
    """The first ```python block under "## Use it from Python"."""
    text = README.read_text()
    section = text[text.index("## Use it from Python") :]
    found = re.search(r"```python\n(.*?)```", section, re.S)
    assert found is not None, "no python block under 'Use it from Python'"
    return found.group(1)


def test_the_readmes_python_example_runs_as_written(tmp_path: Path, module_redis_url: str) -> None:
    # Given the example as a module of its own, and the invoice service it talks to
    (tmp_path / "invoicing.py").write_text(python_example())
    provider = InvoiceProvider().start()
    env = {
        "BILLING_URL": provider.url,
        "TOOLQ_REDIS_URL": module_redis_url,
        "PYTHONPATH": f"{tmp_path}:{REPO_ROOT}",
    }
    worker = start_worker("invoicing:tq", module_redis_url, env=env)
    try:
        # When it is run as a script (a worker imported it for its tools: no submit there)
        run = subprocess.run(
            [sys.executable, str(tmp_path / "invoicing.py")],
            env=toolq_env(env),
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=90,
        )
        # Then the call succeeded, with one invoice at the provider for its operation_ref
        assert run.returncode == 0, run.stdout + run.stderr
        envelope = json.loads(run.stdout)
        assert envelope["ok"] is True and envelope["operation_ref"] == "run_81/step_4"
        effects = [
            e for e in provider.effects()["effects"] if e["operation_ref"] == "run_81/step_4"
        ]
        assert len(effects) == 1, provider.effects()
        assert provider.find("run_81/step_4")[0]["amount"] == 5.0
    finally:
        stop_process(worker, timeout=15)
        provider.stop()
