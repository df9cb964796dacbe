"""The console's pure parts: the input form from a tool's schema, and what pages show."""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field, SecretStr

from toolq.core.record import HistoryEntry, OperationRecord
from toolq.core.redact import REDACTED, shown_args
from toolq.core.states import State
from toolq.edges.api.console import forms, present


class Color(StrEnum):
    RED = "red"
    BLUE = "blue"


class Address(BaseModel):
    city: str


class Order(BaseModel):
    amount: int = Field(le=1000, ge=-1000, description="In cents.")
    price: float = 1.5
    currency: Literal["EUR", "USD"] = "EUR"
    color: Color | None = None
    express: bool = False
    memo: str | None = Field(default=None, max_length=40)
    password: SecretStr | None = None
    tags: list[str] = []
    address: Address | None = None
    note: str = ""


SCHEMA = Order.model_json_schema()
CURRENT: dict[str, Any] = {
    "amount": -5,
    "price": 1.5,
    "currency": "USD",
    "color": "blue",
    "express": True,
    "memo": "Authorization: Bearer abcdefghijklmnop",
    "password": "**********",
    "tags": ["a", "b"],
    "address": {"city": "Oslo"},
    "note": "",
}


def _fields() -> dict[str, forms.FormField]:
    return {f.name: f for f in forms.form_fields(SCHEMA, CURRENT)}


def test_a_field_per_property_of_the_kind_its_schema_says() -> None:
    f = _fields()
    kinds = {name: field.kind for name, field in f.items()}
    assert kinds == {
        "amount": "integer",
        "price": "number",
        "currency": "select",
        "color": "select",
        "express": "boolean",
        "memo": "text",  # a value the redactor would hide: not shown, but still text
        "password": "secret",
        "tags": "json",
        "address": "json",
        "note": "text",
    }
    assert f["amount"].required and not f["price"].required
    assert f["amount"].attrs == {"min": "-1000", "max": "1000", "step": "1"}
    assert f["amount"].description == "In cents."
    assert f["amount"].value == "-5"
    assert f["color"].nullable and [c.label for c in f["color"].choices] == ["red", "blue"]
    assert f["currency"].value == '"USD"'
    assert f["express"].value == "true"
    assert json.loads(f["tags"].value) == ["a", "b"]
    assert f["memo"].value == "" and f["memo"].keeps_current
    assert f["password"].value == "" and f["password"].keeps_current
    assert all(f.input_name == f"arg.{f.name}" for f in f.values())


class Login(BaseModel):
    user: str
    api_key: str
    db_password: int
    credentials: dict[str, str] = {}
    extra: dict[str, str] = {}


LOGIN = {
    "user": "ada",
    "api_key": "plain",
    "db_password": 1234,
    "credentials": {"user": "ada", "pass": "swordfish"},
    "extra": {"note": "password: swordfish"},
}


def test_a_property_named_like_a_secret_is_never_written_into_the_form() -> None:
    # The page's arguments hide these by name (toolq.core.redact.shown_args); the form must too,
    # though the values themselves look harmless.
    f = {x.name: x for x in forms.form_fields(Login.model_json_schema(), LOGIN)}
    for name in ("api_key", "db_password", "credentials", "extra"):
        assert f[name].value == "" and f[name].keeps_current, name
    assert f["user"].value == "ada" and not f["user"].keeps_current
    shown = shown_args(LOGIN, Login.model_json_schema())
    assert shown["api_key"] == shown["db_password"] == shown["credentials"] == REDACTED


def test_a_withheld_field_keeps_its_kind_for_a_new_value() -> None:
    fields = forms.form_fields(Login.model_json_schema(), LOGIN)
    kinds = {x.name: x.kind for x in fields}
    assert kinds["extra"] == kinds["credentials"] == "json"
    assert kinds["db_password"] == "integer"
    form = {"arg.user": "ada", "arg.extra": '{"note": "new"}', "arg.db_password": "99"}
    args, problems = forms.parse_form(fields, form, LOGIN)
    assert problems == {}
    assert args["extra"] == {"note": "new"} and args["db_password"] == 99
    # left empty: the current values stay
    assert args["api_key"] == "plain" and args["credentials"] == LOGIN["credentials"]


def _form(**values: str) -> dict[str, str]:
    base = {f.input_name: f.value for f in _fields().values()}
    return base | {f"arg.{k}": v for k, v in values.items()}


def test_the_form_posted_back_unchanged_is_the_current_arguments() -> None:
    args, problems = forms.parse_form(list(_fields().values()), _form(), CURRENT)
    assert problems == {}
    assert args == CURRENT


@pytest.mark.parametrize(
    ("values", "expected", "problems"),
    [
        ({"amount": "25"}, {"amount": 25}, {}),
        ({"amount": " 25 "}, {"amount": 25}, {}),
        ({"amount": "2.5"}, {}, {"amount": "must be a whole number"}),
        ({"amount": ""}, {}, {"amount": "a value is required"}),
        ({"price": "3"}, {"price": 3}, {}),
        ({"price": "3.25"}, {"price": 3.25}, {}),
        ({"price": "nan"}, {}, {"price": "must be a finite number"}),
        ({"price": "abc"}, {}, {"price": "must be a number"}),
        ({"price": ""}, {"price": None}, {}),  # left out: the model's default applies
        ({"currency": '"EUR"'}, {"currency": "EUR"}, {}),
        ({"currency": '"GBP"'}, {}, {"currency": "must be one of the choices"}),
        ({"color": ""}, {"color": None}, {}),
        ({"express": "false"}, {"express": False}, {}),
        ({"express": "maybe"}, {}, {"express": "must be yes or no"}),
        ({"memo": "new memo"}, {"memo": "new memo"}, {}),
        ({"password": "hunter2-new"}, {"password": "hunter2-new"}, {}),
        ({"tags": '["x"]'}, {"tags": ["x"]}, {}),
        ({"tags": "[x"}, {}, {"tags": "is not valid JSON"}),
        ({"tags": "[" * 5000 + "]" * 5000}, {}, {"tags": "is nested too deep"}),  # was a 500
        ({"address": ""}, {"address": None}, {}),
        ({"note": ""}, {"note": ""}, {}),
        ({"memo": ""}, {"memo": CURRENT["memo"]}, {}),  # withheld: empty keeps it
    ],
)
def test_reading_a_posted_field(
    values: dict[str, str], expected: dict[str, Any], problems: dict[str, str]
) -> None:
    args, found = forms.parse_form(list(_fields().values()), _form(**values), CURRENT)
    assert found == problems
    for name, value in expected.items():
        if value is None and name == "price":
            assert name not in args
        else:
            assert args[name] == value


def test_properties_the_form_does_not_show_are_kept() -> None:
    schema = {"properties": {"a": {"type": "string"}}, "required": ["a"]}
    fields = forms.form_fields(schema, {"a": "x", "extra": 1})
    args, problems = forms.parse_form(fields, {"arg.a": "y"}, {"a": "x", "extra": 1})
    assert (args, problems) == ({"a": "y", "extra": 1}, {})


# --------------------------------------------------------------------------- what pages show


def test_arguments_are_shown_redacted() -> None:
    shown = shown_args(
        {
            "api_key": "plain-looking",
            "password": "**********",
            "memo": "call me, Authorization: Bearer abcdefghijklmnop",
            "nested": {"client_secret": "x", "items": [{"token": "y", "n": 1}]},
            "n": 3,
        },
        SCHEMA,
    )
    assert shown["api_key"] == REDACTED
    assert shown["password"] == REDACTED
    assert "abcdefghijklmnop" not in shown["memo"] and REDACTED in shown["memo"]
    assert shown["nested"] == {"client_secret": REDACTED, "items": [{"token": REDACTED, "n": 1}]}
    assert shown["n"] == 3


def test_a_property_the_schema_marks_secret_is_redacted_whatever_its_name() -> None:
    class Login(BaseModel):
        user: str
        passphrase: SecretStr

    shown = shown_args({"user": "ann", "passphrase": "x"}, Login.model_json_schema())
    assert shown == {"user": "ann", "passphrase": REDACTED}


def _entry(
    at: int,
    frm: State | None,
    to: State,
    code: str | None = None,
    by: str = "",
    note: dict[str, str] | None = None,
) -> Any:
    return HistoryEntry.model_validate(
        {"at": at, "from": frm, "to": to, "attempt": 1, "by": by, "code": code, "note": note or {}}
    )


UNAVAILABLE_2 = {"check": "2", "result": "unavailable", "detail": "UNAVAILABLE", "next": "9000"}
FOUND_3 = {"check": "3", "result": "found"}


def test_the_timeline_and_the_verification_checks_come_from_the_history() -> None:
    history = [
        _entry(1_000, None, State.QUEUED, by="submit"),
        _entry(1_500, State.QUEUED, State.RUNNING, by="w1"),
        _entry(2_000, State.RUNNING, State.VERIFYING, "OUTCOME_UNKNOWN", by="w1"),
        _entry(3_000, State.VERIFYING, State.VERIFYING, by="w2", note=UNAVAILABLE_2),
        _entry(3_100, State.VERIFYING, State.VERIFYING, "VERIFY_NOW", by="console:local"),
        _entry(
            4_250, State.VERIFYING, State.SUCCEEDED, "VERIFIED_COMMITTED", by="w2", note=FOUND_3
        ),
    ]
    steps = present.timeline(history)
    assert [s.offset for s in steps] == [
        "+0.000 s",
        "+0.500 s",
        "+1.000 s",
        "+2.000 s",
        "+2.100 s",
        "+3.250 s",
    ]
    assert steps[0].from_ == "" and steps[-1].to == "succeeded" and steps[2].by == "w1"
    rec = OperationRecord.from_fields(
        {"ref": "r", "tool": "t", "state": "succeeded", "uncertain_at": "2000"}, history
    )
    v = present.checks(rec)
    assert v is not None
    assert [(c.number, c.outcome, c.detail, c.by) for c in v.checks] == [
        (2, "verifier unavailable: checks again later", "UNAVAILABLE", "w2"),
        (0, "check asked for now by console:local", "", "console:local"),
        (3, "found: the write happened", "", "w2"),
    ]
    assert (v.checks_made, v.failed, v.next_check_ms) == (2, 1, None)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("", None), ("90", 90), ("90s", 90), ("5m", 300), ("5 min", 300), ("2h", 7200),
     ("1.5d", 129600), ("0", 0)],
)  # fmt: skip
def test_older_than_reads(text: str, seconds: float | None) -> None:
    assert present.parse_age(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5", "5 weeks", "1e3", "5m3s", "401d"])
def test_older_than_refuses_with_a_message(text: str) -> None:
    with pytest.raises(ValueError, match=r"number of seconds|at most 400 days"):
        present.parse_age(text)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "-"), (-3, "0 s"), (4.9, "4 s"), (192, "3 min 12 s"), (7500, "2 h 5 min"),
     (273600, "3 d 4 h")],
)  # fmt: skip
def test_durations(seconds: float | None, text: str) -> None:
    assert present.duration(seconds) == text


def test_until_counts_down_then_says_due() -> None:
    assert present.until(10_500, 0) == "in 11 s"
    assert present.until(0, 10) == "due now"


def test_a_chart_scales_to_a_round_top_and_places_its_points() -> None:
    samples = [(0, {"a": 0.0, "b": 3.0}), (30_000, {"a": 7.0}), (60_000, {"a": 4.0, "b": 1.0})]
    c = present.chart("t", samples, ("a", "b"), now_ms=60_000, hours=60_000 / 3_600_000)
    assert c.y_max == 10 and not c.empty
    a, b = c.lines
    assert (a.last, a.peak, b.last, b.peak) == (4.0, 7.0, 1.0, 3.0)
    xs = [float(p.split(",")[0]) for p in a.points.split()]
    assert xs[0] == c.left and xs[-1] == c.width
    assert [label for _y, label in c.grid] == ["0", "5", "10"]
    assert c.rows[0] == ("00:01", [4.0, 1.0])  # latest first
    assert present.chart("t", [], ("a",), now_ms=1, hours=1).empty
