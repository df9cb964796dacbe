"""The corrected-input form, generated from a tool's input JSON Schema (pure).

:func:`form_fields` turns the schema pydantic makes for a tool's arguments
(``registry.get(tool).input_schema()``) and the operation's current arguments
into one :class:`FormField` per top-level property; :func:`parse_form` turns
what the browser posts back into arguments, with a message per field it could
not read. The tool's own model then validates them (``tq.aio.provide_input``),
and its field errors are shown by the field they name.

Kinds of field: ``text``, ``integer``, ``number``, ``boolean`` (a yes/no
select, so "not set" stays possible), ``select`` (an ``enum`` or ``Literal``),
``secret`` (``SecretStr``: shown empty; left empty keeps the current value) and
``json`` (anything nested: objects, lists, unions, as JSON in a text area).
A current value the redactor would hide, or one of a property whose name says
it holds a secret (:data:`SECRET_NAME`, as the page's redacted arguments hide
it), is never written into the page and is kept when left empty; its field
keeps its kind, so that a new value is read as the schema says.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from toolq.core.redact import SECRET_NAME, looks_secret, unwrap_schema

Kind = Literal["text", "integer", "number", "boolean", "select", "secret", "json"]

#: Field names are form names: kept to what a schema property name usually is.
_MAX_FIELDS = 100


@dataclass(frozen=True)
class Choice:
    label: str
    #: The choice as JSON text (an enum may hold strings, numbers, booleans).
    value: str


@dataclass(frozen=True)
class FormField:
    name: str
    label: str
    kind: Kind
    required: bool
    nullable: bool
    description: str = ""
    choices: tuple[Choice, ...] = ()
    #: What the input shows: the current value as text ("" for a secret).
    value: str = ""
    #: A current value exists that is not shown: an empty input keeps it.
    keeps_current: bool = False
    #: HTML attributes from the schema's bounds (``maxlength``, ``min``, ...), as hints.
    attrs: dict[str, str] = field(default_factory=dict)

    @property
    def input_name(self) -> str:
        """The form's name for it: prefixed, so no property clashes with ``ref`` or ``csrf``."""
        return f"arg.{self.name}"


def form_fields(schema: Mapping[str, Any], current: Mapping[str, Any]) -> list[FormField]:
    """One field per top-level property of ``schema``, filled from ``current``."""
    defs = schema.get("$defs") or {}
    required = set(schema.get("required") or ())
    out: list[FormField] = []
    for name, given in list((schema.get("properties") or {}).items())[:_MAX_FIELDS]:
        raw: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
        prop, nullable = unwrap_schema(raw, defs)
        kind, choices = _kind(prop)
        has = name in current
        value, hidden = _shown(kind, current.get(name)) if has else (_default(prop, kind), False)
        if has and SECRET_NAME.search(str(name)):
            value, hidden = "", True
        out.append(
            FormField(
                name=str(name),
                # The property's name, as the tool's field errors and the agent's
                # arguments spell it (pydantic's titles are made from it anyway).
                label=str(name),
                kind=kind,
                required=name in required,
                nullable=nullable,
                description=str(prop.get("description") or raw.get("description") or "")[:300],
                choices=choices,
                value=value,
                keeps_current=hidden or (kind == "secret" and has),
                attrs=_attrs(prop, kind),
            )
        )
    return out


def parse_form(
    fields: list[FormField], form: Mapping[str, str], current: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The arguments a posted form means, and a message per field it could not read.

    Properties of ``current`` the form does not show are kept as they are.
    """
    shown = {f.name for f in fields}
    args: dict[str, Any] = {k: v for k, v in current.items() if k not in shown}
    problems: dict[str, str] = {}
    for f in fields:
        raw = form.get(f.input_name, "")
        if f.keeps_current and raw == "" and f.name in current:
            args[f.name] = current[f.name]
            continue
        if raw.strip() == "" and f.kind != "text":
            if f.nullable:
                args[f.name] = None
            elif f.required:
                problems[f.name] = "a value is required"
            continue
        if raw == "" and f.kind == "text" and f.nullable:
            args[f.name] = None  # an empty box means "none"; the model says if "" is valid
            continue
        try:
            args[f.name] = _read(f, raw)
        except ValueError as exc:
            problems[f.name] = str(exc)
    return args, problems


# --------------------------------------------------------------------------- reading


def _read(f: FormField, raw: str) -> Any:
    if f.kind in ("text", "secret"):
        return raw
    text = raw.strip()
    if f.kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise ValueError("must be a whole number") from None
    if f.kind == "number":
        try:
            number = float(text)
        except ValueError:
            raise ValueError("must be a number") from None
        if not math.isfinite(number):
            raise ValueError("must be a finite number")
        # "3" stays an int, as JSON would have it; "3.0" and "3e0" are floats.
        return int(text) if text.lstrip("+-").isdigit() else number
    if f.kind == "boolean":
        if text not in ("true", "false"):
            raise ValueError("must be yes or no")
        return text == "true"
    if f.kind == "select":
        if text not in {c.value for c in f.choices}:
            raise ValueError("must be one of the choices")
        return json.loads(text)
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError("is not valid JSON") from None
    except RecursionError:  # was a 500
        raise ValueError("is nested too deep") from None


# --------------------------------------------------------------------------- the schema


def _kind(prop: Mapping[str, Any]) -> tuple[Kind, tuple[Choice, ...]]:
    enum = prop.get("enum")
    if "const" in prop:
        enum = [prop["const"]]
    if (
        isinstance(enum, list)
        and enum
        and all(isinstance(e, str | int | float | bool) for e in enum)
    ):
        return "select", tuple(Choice(str(e), json.dumps(e)) for e in enum)
    kind = prop.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if kind == "string":
        secret = prop.get("format") == "password" or prop.get("writeOnly") is True
        return ("secret" if secret else "text"), ()
    if kind in ("integer", "number", "boolean"):
        return kind, ()
    return "json", ()


def _shown(kind: Kind, value: Any) -> tuple[str, bool]:
    """The current value as the input shows it, and whether it is withheld instead."""
    if kind == "secret":
        return "", True
    if value is None:
        return "", False
    if kind == "boolean" and isinstance(value, bool):
        return ("true" if value else "false"), False
    if kind == "select":
        return json.dumps(value), False
    text = value if kind == "text" and isinstance(value, str) else None
    if text is None:
        text = str(value) if kind in ("integer", "number") else json.dumps(value, indent=2)
    if looks_secret(text):
        return "", True
    return text, False


def _default(prop: Mapping[str, Any], kind: Kind) -> str:
    if "default" not in prop or kind == "secret":
        return ""
    text, hidden = _shown(kind, prop["default"])
    return "" if hidden else text


def _attrs(prop: Mapping[str, Any], kind: Kind) -> dict[str, str]:
    names = {
        "text": (("maxLength", "maxlength"), ("minLength", "minlength"), ("pattern", "pattern")),
        "secret": (("maxLength", "maxlength"),),
        "integer": (("minimum", "min"), ("maximum", "max")),
        "number": (("minimum", "min"), ("maximum", "max")),
    }.get(kind, ())
    out = {html: str(prop[key]) for key, html in names if key in prop}
    if kind == "integer":
        out["step"] = "1"
    elif kind == "number":
        out["step"] = "any"
    return out
