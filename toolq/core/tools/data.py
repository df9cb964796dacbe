"""A tool's arguments and result as data: the canonical JSON its fingerprint is taken
of, the field errors of arguments that do not validate, a result as plain JSON."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import to_jsonable_python

from toolq.core.envelope import FieldError


def field_errors_of(exc: ValidationError) -> list[FieldError]:
    out: list[FieldError] = []
    for err in exc.errors()[:20]:
        loc = ".".join(str(p) for p in err.get("loc", ())) or "args"
        out.append(FieldError(field=loc[:200], rule=str(err.get("type", "invalid"))[:200]))
    return out


def canonical_json(model: BaseModel) -> str:
    """The canonical JSON of validated arguments: what fingerprints and comparisons use.

    ValueError for NaN or an infinity (a float field given ``1e400``): ``json.dumps``
    would write ``NaN``/``Infinity``, which is not JSON, into the ledger and the message."""
    return json.dumps(
        model.model_dump(mode="json"),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )


def fingerprint(canonical: str) -> str:
    return hashlib.sha256(canonical.encode()).hexdigest()


def jsonable(value: Any) -> Any:
    """A tool's result as plain JSON data."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return to_jsonable_python(value)
