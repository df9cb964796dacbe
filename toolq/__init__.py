"""toolq: run AI-agent tool calls through queues so that failures are safe to recover from.

Names are imported lazily: ``import toolq.envelope`` (the contract) loads
neither Celery nor Redis.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from toolq import errors
    from toolq.app import App
    from toolq.envelope import ToolError, ToolSuccess, parse_envelope
    from toolq.queue import Submission, ToolQueue
    from toolq.record import OperationRecord
    from toolq.states import State
    from toolq.tools import CallContext, Jitter, Tool, ToolOptions

#: public name -> the module that defines it
_EXPORTS = {
    "App": "toolq.app",
    "CallContext": "toolq.tools",
    "Jitter": "toolq.tools",
    "OperationRecord": "toolq.record",
    "State": "toolq.states",
    "Submission": "toolq.queue",
    "Tool": "toolq.tools",
    "ToolError": "toolq.envelope",
    "ToolOptions": "toolq.tools",
    "ToolQueue": "toolq.queue",
    "ToolSuccess": "toolq.envelope",
    "parse_envelope": "toolq.envelope",
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
        return importlib.import_module("toolq.errors")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'toolq' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
