"""`celery -A` on the Celery app a ToolQueue exposes, with no queue flags, serves
every toolq queue (calls and verification)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from click.testing import CliRunner

from tests.helpers import REPO_ROOT, stop_process, toolq_env
from tests.integration.conftest import effects
from toolq import State, ToolQueue
from toolq.edges.cli import main
from toolq.process.procs import pdeathsig_preexec


@pytest.fixture(scope="module")
def celery_worker(rt: ToolQueue, module_redis_url: str) -> Iterator[None]:
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.apps.runtime_app:celery_app",
            "worker",
            "--pool",
            "threads",
            "-c",
            "2",
            "--loglevel",
            "WARNING",
        ],
        env=toolq_env({"TOOLQ_REDIS_URL": module_redis_url}),
        cwd=str(REPO_ROOT),
        start_new_session=True,
        preexec_fn=pdeathsig_preexec(),
    )
    yield
    stop_process(p)


def test_celery_a_serves_calls_and_verification(rt: ToolQueue, celery_worker: None) -> None:
    ok = rt.submit("pay", {}).operation_ref
    unknown = rt.submit("pay", {"mode": "lost_reply"}).operation_ref
    assert rt.wait(ok, timeout=30).ok
    env = rt.wait(unknown, timeout=30)
    assert env.ok and env.verification.evidence_ref == "verification:find_payment"
    rec = rt.get(unknown)
    assert rec is not None and State.VERIFYING in [h.to for h in rec.history]
    assert effects(rt.redis, unknown) == 1


@pytest.mark.parametrize("queues", ["toolq.nope", "toolq.calls,", "toolq.calls,other"])
def test_toolq_worker_refuses_a_queue_that_is_not_toolqs(redis_url: str, queues: str) -> None:
    # Celery refused it too, after the server answered, with its traceback
    result = CliRunner().invoke(main, ["worker", "--queues", queues, "--redis-url", redis_url])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--queues'" in result.output
    assert "is not one of this app's queues (toolq.calls, toolq.verify)" in result.output
