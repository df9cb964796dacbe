"""The asyncio pool's lean success (:mod:`toolq.services.workers.lean`): when a call's
success goes to Celery's request without Celery's tracer, as a table, row by row in the
module's order; what makes a task plain; what the request's callback gets. With real
workers: tests/integration/test_aio_lean_path.py."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery, Task
from celery.loaders.app import AppLoader

from toolq.adapters.broker.app import LEAN_KEY, celery_config
from toolq.core.settings import ToolqSettings, WorkerSettings
from toolq.services.workers import lean

COMMON = {
    "returned": True,
    "inline": True,
    "plain": True,
    "ignore_result": None,
    "linked": False,
    "logs_success": False,
}


@pytest.mark.parametrize(
    ("change", "lean_path"),
    [
        ({}, True),  # the common case: a returned body, nothing watching the tracer
        ({"returned": False}, False),  # raised: the tracer logs, rejects or requeues
        ({"inline": False}, False),  # a signal receiver, no hub, more calls than threads
        ({"plain": False}, False),  # hooks, STARTED, results, dedup, cleanups
        ({"ignore_result": False}, False),  # the message asks for its result
        ({"ignore_result": True}, True),
        ({"linked": True}, False),  # callbacks, chain, chord, group
        ({"logs_success": True}, False),  # "Task ... succeeded" at INFO
        ({"returned": False, "inline": False, "plain": False, "linked": True}, False),
    ],
)
def test_the_lean_success_decision(change: dict[str, Any], lean_path: bool) -> None:
    assert lean.lean_success(**{**COMMON, **change}) is lean_path


def _app(**conf: Any) -> Celery:
    app = Celery("lean-t", set_as_current=False)
    app.conf.update(task_ignore_result=True, result_backend=None, **conf)
    return app


def test_a_plain_task_has_celerys_defaults_everywhere() -> None:
    app = _app()

    @app.task(name="t.plain", bind=True, shared=False)
    def plain(self: Task[Any, Any]) -> str:
        return "x"

    assert lean.plain_task(app.tasks["t.plain"])


def test_a_workers_stack_protection_is_not_a_custom_call(monkeypatch: Any) -> None:
    # A worker replaces Task.__call__ (celery.app.trace._install_stack_protection), which
    # Celery's own task_has_custom() then reports as custom for every task.
    def protected(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.run(*args, **kwargs)

    monkeypatch.setattr(Task, "__call__", protected)
    app = _app()

    @app.task(name="t.protected", shared=False)
    def plain() -> str:
        return "x"

    assert lean.plain_task(app.tasks["t.protected"])


class Custom(Task):  # type: ignore[type-arg]
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return super().__call__(*args, **kwargs)


class Hooked(Task):  # type: ignore[type-arg]
    def on_success(self, retval: Any, task_id: str, args: Any, kwargs: Any) -> None:
        pass


class CleaningLoader(AppLoader):
    def on_process_cleanup(self) -> None:
        pass


@pytest.mark.parametrize(
    ("conf", "task_options", "why"),
    [
        ({}, {"base": Hooked}, "a custom on_success hook"),
        ({}, {"base": Custom}, "a custom __call__"),
        ({}, {"track_started": True}, "STARTED stored"),
        ({}, {"ignore_result": False}, "a result stored"),
        ({"worker_deduplicate_successful_tasks": True}, {}, "redeliveries deduplicated"),
    ],
)
def test_a_task_the_tracer_does_more_for_is_not_plain(
    conf: dict[str, Any], task_options: dict[str, Any], why: str
) -> None:
    app = _app(**conf)

    @app.task(name="t.odd", shared=False, **task_options)
    def odd() -> str:
        return "x"

    assert not lean.plain_task(app.tasks["t.odd"]), why


def test_a_loader_with_a_cleanup_makes_no_task_plain() -> None:
    app = Celery("lean-loader", loader=CleaningLoader, set_as_current=False)
    app.conf.update(task_ignore_result=True)

    @app.task(name="t.clean", shared=False)
    def clean() -> str:
        return "x"

    assert not lean.plain_task(app.tasks["t.clean"])


@pytest.mark.parametrize(
    ("request_", "embed", "is_linked"),
    [
        ({}, {"callbacks": None, "errbacks": None, "chain": None, "chord": None}, False),
        (None, None, False),
        ({}, {"callbacks": [{"task": "x"}]}, True),
        ({}, {"errbacks": [{"task": "x"}]}, True),
        ({}, {"chain": [{"task": "x"}]}, True),
        ({}, {"chord": {"task": "x"}}, True),
        ({"group": "g-1"}, {}, True),
    ],
)
def test_a_message_that_links_others_is_linked(
    request_: dict[str, Any] | None, embed: dict[str, Any] | None, is_linked: bool
) -> None:
    assert lean.linked(request_, embed) is is_linked


@pytest.mark.parametrize(
    ("request_", "value"),
    [({}, None), (None, None), ({"ignore_result": None}, None), ({"ignore_result": False}, False)],
)
def test_the_messages_own_ignore_result(request_: dict[str, Any] | None, value: Any) -> None:
    assert lean.ignore_result_of(request_) is value


def test_the_request_callback_gets_what_celerys_tracer_hands_it() -> None:
    app = _app()

    @app.task(name="t.cb", shared=False)
    def cb() -> str:
        return "x"

    got: list[Any] = []
    lean.succeed(got.append, "succeeded", 0.25, app.tasks["t.cb"])
    # fast_trace_task's (0, saferepr(result), runtime)
    assert got == [(0, "'succeeded'", 0.25)]


def test_the_setting_reaches_the_pool_through_celerys_conf() -> None:
    on = celery_config(ToolqSettings(), "redis://h:6379/0")
    off = celery_config(ToolqSettings(worker=WorkerSettings(lean_success=False)), "redis://h:6")
    assert on[LEAN_KEY] is True and off[LEAN_KEY] is False
