"""toolq: run AI-agent tool calls through queues so that failures are safe to recover from.

Names are imported lazily: ``import toolq.core.envelope`` (the contract) loads
neither Celery nor Redis.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from toolq.client.app import App
    from toolq.client.queue import Submission, ToolQueue
    from toolq.core import errors
    from toolq.core.envelope import ToolError, ToolSuccess, parse_envelope
    from toolq.core.record import OperationRecord
    from toolq.core.states import State
    from toolq.core.tools import CallContext, Jitter, Tool, ToolOptions

#: public name -> the module that defines it
_EXPORTS = {
    "App": "toolq.client.app",
    "CallContext": "toolq.core.tools",
    "Jitter": "toolq.core.tools",
    "OperationRecord": "toolq.core.record",
    "State": "toolq.core.states",
    "Submission": "toolq.client.queue",
    "Tool": "toolq.core.tools",
    "ToolError": "toolq.core.envelope",
    "ToolOptions": "toolq.core.tools",
    "ToolQueue": "toolq.client.queue",
    "ToolSuccess": "toolq.core.envelope",
    "parse_envelope": "toolq.core.envelope",
}

__all__ = [
    "App",
    "CallContext",
    "Jitter",
    "OperationRecord",
    "State",
    "Submission",
    "Tool",
    "ToolError",
    "ToolOptions",
    "ToolQueue",
    "ToolSuccess",
    "errors",
    "parse_envelope",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "errors":
        return importlib.import_module("toolq.core.errors")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
