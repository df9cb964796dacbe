"""What every framework adapter shares: the ref, the kind of outcome, the bounded
wait, and the text the model sees. Imports toolq only, never a framework.

    ref = stable_ref(tool_call_id, scope=run_id, limits=tq.settings.limits)
    env = await run(tq, "create_invoice", args, ref=ref, call_id=tool_call_id, wait=20.0)
    match kind_of(env):
        case Kind.RESULT: ...     # env.result to the model
        case Kind.FIX_INPUT: ...  # the framework's "fix your input" signal, model_text(env)
        case Kind.APPROVAL: ...   # the framework's pause; then resolve_approval(...)
        case Kind.PENDING: ...    # model_text(env): not done yet, never call again
        case Kind.FAILED: ...     # a terminal error, model_text(env)

- **The ref** of a framework's tool call is its tool-call id, prefixed by the
  run, conversation or thread id where the framework has one
  (:func:`stable_ref`): a resumed or replayed step sends the same call id, so
  it reaches the same operation (the same arguments return it; other
  arguments are refused), never a second write under a fresh key.
- **The wait** (:func:`run`) is bounded: past it, the model gets a PENDING
  envelope carrying the ref, from the operation's record (never the stale
  envelope of an earlier attempt). Rate limits and outages are retried by
  toolq's scheduler meanwhile, unknown outcomes verified; the framework
  retries nothing. The model follows the ref with the :data:`FOLLOW_TOOL`
  tool (:func:`follow`).
- **The text** (:func:`model_text`) is the envelope's ``agent_message`` and its
  JSON, as :mod:`toolq.core.render` writes it: the envelope is redacted when it is
  built, and nothing here adds exception or upstream text. A framework whose
  tools answer with text gives a committed call's result as its JSON
  (:func:`output_text`).
- **The envelopes** an adapter writes itself (a refusal, a wait that ended
  first, its own failure) come from :mod:`toolq.core.edge_envelopes`, as the MCP
  server's do, naming :data:`FOLLOW_TOOL`.

Each part lives in its own module, every name importable from here:
:mod:`~toolq.integrations.refs` (the ref), :mod:`~toolq.integrations.answers`
(kinds, text, the follow tool, the adapters' own envelopes: pure) and
:mod:`~toolq.integrations.calling` (the bounded wait, following, approvals).
"""

from toolq.integrations.answers import (
    FOLLOW_DESCRIPTION,
    FOLLOW_TOOL,
    KINDS,
    Kind,
    field_names,
    follow_schema,
    kind_of,
    model_text,
    output_text,
    pending_envelope,
    refused_envelope,
    unavailable_envelope,
    unexpected_envelope,
)
from toolq.integrations.answers import POLL_S as POLL_S  # not in __all__, as before
from toolq.integrations.calling import (
    DEFAULT_WAIT,
    abandon,
    describe,
    follow,
    resolve_approval,
    run,
    tool_names,
    writes,
)
from toolq.integrations.refs import call_id_of, stable_ref

__all__ = [
    "DEFAULT_WAIT",
    "FOLLOW_DESCRIPTION",
    "FOLLOW_TOOL",
    "KINDS",
    "Kind",
    "abandon",
    "call_id_of",
    "describe",
    "field_names",
    "follow",
    "follow_schema",
    "kind_of",
    "model_text",
    "output_text",
    "pending_envelope",
    "refused_envelope",
    "resolve_approval",
    "run",
    "stable_ref",
    "tool_names",
    "unavailable_envelope",
    "unexpected_envelope",
    "writes",
]
