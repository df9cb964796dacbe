"""A tool's arguments and result as data: the canonical JSON its fingerprint is taken
of, the field errors of arguments that do not validate, a result as plain JSON."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import to_json, to_jsonable_python

from toolq.core.envelope import FieldError


def field_errors_of(exc: ValidationError) -> list[FieldError]:
    out: list[FieldError] = []
    for err in exc.errors()[:20]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "args"
        out.append(FieldError(field=loc[:200], rule=str(err.get("type", "invalid"))[:200]))
    return out


def canonical_json(model: BaseModel) -> str:
    """The canonical JSON of validated arguments: what fingerprints and comparisons use.

    ``ValueError`` for NaN or an infinity (a float field takes ``"inf"``): JSON has
    neither, and the ledger's copy is read by strict parsers (the HTTP API's clients)."""
    return json.dumps(
        model.model_dump(mode="json"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def fingerprint(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


class ResultTooLarge(ValueError):
    """A result whose JSON is longer than the ledger keeps (``limits.max_result_bytes``).
    Its message says the sizes only, never the result."""

    def __init__(self, size: int, limit: int) -> None:
        self.size, self.limit = size, limit
        super().__init__(
            f"the result's JSON is {size} bytes, over the {limit} the ledger keeps "
            "(TOOLQ_LIMITS__MAX_RESULT_BYTES)"
        )


def jsonable(value: Any, max_bytes: int | None = None) -> Any:
    """A tool's result as plain JSON data.

    ``ValueError`` (``PydanticSerializationError``) for what JSON cannot carry, a lone
    surrogate in a string included: raised here, while the attempt's failure can still
    be recorded, not when the record is written (about 1.5 us for a small result).
    :class:`ResultTooLarge` (a ValueError) for JSON longer than ``max_bytes``."""
    out = (
        value.model_dump(mode="json") if isinstance(value, BaseModel) else to_jsonable_python(value)
    )
    raw = to_json(out)  # a lone surrogate passes to_jsonable_python; UTF-8 refuses it
    if max_bytes is not None and len(raw) > max_bytes:
        raise ResultTooLarge(len(raw), max_bytes)
    return out
