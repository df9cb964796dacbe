"""toolq: run AI-agent tool calls through queues so that failures are safe to recover from."""

from toolq import errors
from toolq.envelope import ToolError, ToolSuccess, parse_envelope
from toolq.ledger import OperationRecord, State
from toolq.queue import Submission, ToolQueue
from toolq.scheduler.policy import Jitter
from toolq.tasks.registry import CallContext, Tool

__all__ = [
    "CallContext",
    "Jitter",
    "OperationRecord",
    "State",
    "Submission",
    "Tool",
    "ToolError",
    "ToolQueue",
    "ToolSuccess",
    "errors",
    "parse_envelope",
]
__version__ = "0.1.0"
