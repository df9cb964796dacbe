"""The agent-framework adapters' app (:mod:`~tests.integration.apps.agents_app`) in a
process that writes every span it ends to ``TOOLQ_TEST_SPANS``'s file, as
:mod:`~tests.integration.apps.traced_app`'s processes do (importing it installs that
exporter): the adapters' tracing tests read their workers' attempt spans there."""

from __future__ import annotations

from tests.integration.apps import traced_app  # noqa: F401  (the file exporter, if asked)
from tests.integration.apps.agents_app import celery_app, tq

APP = "tests.integration.apps.traced_agents_app:tq"

__all__ = ["APP", "celery_app", "tq"]
