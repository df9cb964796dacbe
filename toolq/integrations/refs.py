"""The operation_ref of a framework's tool call (pure): the same call always maps to
the same ref, so a resumed or replayed step reaches the same operation."""

from __future__ import annotations

import hashlib
import json
import re

from toolq.core.settings import LimitSettings

#: The digest a too-long or odd call id is replaced by: ``#`` and 32 hex digits.
_DIGEST_LEN = 32
_NOT_REF = re.compile(r"[^A-Za-z0-9_.:@+=-]")  # "/" and "#" are the digest form's own


def stable_ref(
    call_id: str | None, *, scope: str | None = None, limits: LimitSettings | None = None
) -> str | None:
    """The operation_ref of a framework's tool call: ``scope/call_id``, or ``call_id``.

    ``scope`` is the run, conversation or thread id where the framework has a
    stable one. A result that would not be a valid ref (too long for
    ``limits.max_ref_length``, or characters outside the ref alphabet), and
    one whose scope or call id holds a ``/`` (``a/b`` + ``c`` and ``a`` +
    ``b/c`` would read alike), becomes ``<readable prefix>#<32 hex digits>``,
    the SHA-256 of the pair: the same call always maps to the same ref, two
    different calls never to one. None when there is no call id: the caller
    must then pass a ref of its own (a fresh one per call would make every
    replay a new write).
    """
    if not call_id:
        return None
    limits = limits or LimitSettings()
    scope = scope or None
    raw = f"{scope}/{call_id}" if scope else call_id
    if limits.is_ref(raw) and "/" not in call_id and "/" not in (scope or ""):
        return raw
    pair = json.dumps([scope, call_id], ensure_ascii=True)  # one encoding per pair
    digest = hashlib.sha256(pair.encode()).hexdigest()[:_DIGEST_LEN]
    room = limits.max_ref_length - _DIGEST_LEN - 1
    prefix = _NOT_REF.sub("_", raw)[:room]
    return f"{prefix}#{digest}"


def call_id_of(value: object, limits: LimitSettings | None = None) -> str | None:
    """``value`` as the call_id toolq records (the framework's id), when it is a
    ref-shaped string; None otherwise (the ref still carries it, digested)."""
    limits = limits or LimitSettings()
    if isinstance(value, str) and limits.is_ref(value):
        return value
    return None
