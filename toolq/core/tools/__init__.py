"""The tool registry: what a tool is, its options, and the context it is called with.

A tool (or verifier) may be ``def`` or ``async def``. :meth:`Tool.invoke` and
:meth:`Tool.lookup` return the result either way: a coroutine is run to its
end on the calling thread's own event loop (:func:`thread_loop`), so a worker
thread or a prefork child awaits async tools without starting a loop per call.

One module per reason to change: :mod:`~toolq.core.tools.tool` (a tool, its context,
the registry), :mod:`~toolq.core.tools.options` (what ``@tq.tool(...)`` takes),
:mod:`~toolq.core.tools.loop` (running async tools), :mod:`~toolq.core.tools.data` (arguments
and results as JSON). Every name is importable from here.
"""

from __future__ import annotations

from toolq.core.tools.data import canonical_json, field_errors_of, fingerprint, jsonable
from toolq.core.tools.loop import run_sync, thread_loop
from toolq.core.tools.options import Jitter, ToolOptions
from toolq.core.tools.tool import CallContext, Registry, Tool, args_model_for

__all__ = [
    "CallContext",
    "Jitter",
    "Registry",
    "Tool",
    "ToolOptions",
    "args_model_for",
    "canonical_json",
    "field_errors_of",
    "fingerprint",
    "jsonable",
    "run_sync",
    "thread_loop",
]
