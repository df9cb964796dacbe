"""Find a deployment's ``ToolQueue`` by its ``MODULE:ATTR`` path (the CLI's ``--app``)."""

from __future__ import annotations

import importlib
import os
import sys

from toolq.client.queue import ToolQueue
from toolq.core.errors import ToolqError
from toolq.core.redact import cut, scrub
from toolq.core.settings import settings_problem


def load_app(app_path: str, redis_url: str | None = None) -> ToolQueue:
    """Import ``MODULE:ATTR`` and return the ToolQueue, pointed at ``redis_url`` if given.

    Raises :class:`~toolq.core.errors.ToolqError` with one clear line when the path is
    malformed, the module does not import, or the attribute is not a ToolQueue.
    """
    module_name, _, attr = app_path.partition(":")
    if not module_name or not attr:
        raise ToolqError(f"--app must look like MODULE:ATTR, got {app_path!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        problem = settings_problem(exc)  # a bad TOOLQ_* variable: no traceback, no value
        if problem is not None:
            raise ToolqError(problem) from None
        # The module's own words, but as one line and without what looks like a
        # credential (a URL's password, a token): they go to a terminal or a log.
        said = scrub(cut(str(exc), 2000))
        raise ToolqError(f"cannot import {module_name!r}: {type(exc).__name__}: {said}") from None
    obj: object = module
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            raise ToolqError(f"{module_name!r} has no attribute {attr!r}")
    if not isinstance(obj, ToolQueue):
        raise ToolqError(f"{app_path} is a {type(obj).__name__}, not a toolq.ToolQueue")
    if redis_url:
        obj.configure(redis_url=redis_url)
    return obj
