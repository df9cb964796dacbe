"""Every import the README, docs/ and examples/ show still works, and gives the
same objects as before: modules may move, a user's imports do not change.

Two sources: the import lines (and ``MODULE:ATTR`` app paths) found in the
documents, so that a new one is checked as soon as it is written; and the names
pinned below, so that one dropped from a document is still checked.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path
from typing import Any

import pytest

import toolq

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

FROM_IMPORT = re.compile(r"^\s*from (toolq[\w.]*) import ([\w, ]+?)\s*(?:#.*)?$", re.M)
IMPORT = re.compile(r"^\s*import (toolq[\w.]*)\s*(?:#.*)?$", re.M)
#: `toolq.celery_app:celery_app`, `--app toolq.examples.invoices:tq`
APP_PATH = re.compile(r"\b(toolq(?:\.\w+)+):(\w+)\b")


def _documented() -> set[tuple[str, str]]:
    """(module, name) pairs; name "" for a plain ``import module``."""
    found: set[tuple[str, str]] = set()
    for path in DOCUMENTS + EXAMPLES:
        text = path.read_text(encoding="utf-8")
        for module, names in FROM_IMPORT.findall(text):
            for part in names.split(","):
                found.add((module, part.split(" as ")[0].strip()))
        found |= {(m, "") for m in IMPORT.findall(text)}
        found |= set(APP_PATH.findall(text))
    return found


DOCUMENTED = sorted(_documented())

#: ``toolq.__all__`` as it is today: a name may be added, not dropped or renamed.
EXPORTS = {
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
}

#: The public names and where users import them from. ``toolq.__all__`` in full, the
#: modules the README names as public (``toolq.errors``, ``toolq.envelope``,
#: ``toolq.render``, ``toolq.integrations.*``) and what the docs run.
PINNED: dict[str, tuple[str, ...]] = {
    "toolq": tuple(sorted(EXPORTS)),
    "toolq.errors": (
        "ToolFailure",
        "InvalidInput",
        "NeedsApproval",
        "ForbiddenScope",
        "NotFound",
        "Conflict",
        "RateLimited",
        "Unavailable",
        "OutcomeUnknown",
        "ServerUnavailable",
        "NotDurable",
        "IdempotencyKeyReused",
    ),
    "toolq.envelope": ("ToolError", "ToolSuccess", "parse_envelope"),
    "toolq.render": ("to_anthropic_tool_result",),
    "toolq.integrations": ("anthropic", "langchain", "openai_agents", "pydantic_ai"),
    "toolq.integrations.common": ("FOLLOW_TOOL",),
    "toolq.celery_app": ("celery_app",),
    "toolq.examples": ("invoices",),
    "toolq.examples.invoices": ("tq",),
}

#: Names reachable by two public paths: one object by both (a re-export, never a copy).
SAME = [
    ("toolq", "ToolError", "toolq.envelope"),
    ("toolq", "ToolSuccess", "toolq.envelope"),
    ("toolq", "parse_envelope", "toolq.envelope"),
]


#: Modules whose import loads an agent framework's SDK (15 s for some on a busy box):
#: found here without importing them; tests/integration/test_integrations_*.py
#: import each by this same statement and run it.
FRAMEWORKS = {f"toolq.integrations.{m}" for m in PINNED["toolq.integrations"]}


def _resolve(module: str, name: str) -> Any:
    """What ``from module import name`` gives (``import module`` when name is "")."""
    dotted = f"{module}.{name}" if name else module
    if dotted in FRAMEWORKS or module in FRAMEWORKS:
        spec = importlib.util.find_spec(dotted if dotted in FRAMEWORKS else module)
        assert spec is not None and spec.origin is not None, dotted
        return spec
    namespace: dict[str, Any] = {}
    exec(f"from {module} import {name}" if name else f"import {module} as it", namespace)
    return namespace[name or "it"]


def test_the_documents_show_imports() -> None:
    assert ("toolq", "ToolQueue") in DOCUMENTED
    assert any(m.startswith("toolq.integrations") for m, _ in DOCUMENTED)


@pytest.mark.parametrize(("module", "name"), DOCUMENTED, ids=lambda v: v or "-")
def test_every_documented_import_works(module: str, name: str) -> None:
    assert _resolve(module, name) is not None


@pytest.mark.parametrize(("module", "name"), [(m, n) for m, names in PINNED.items() for n in names])
def test_every_public_name_imports_from_where_users_import_it(module: str, name: str) -> None:
    obj = _resolve(module, name)
    if isinstance(obj, type) or (callable(obj) and hasattr(obj, "__qualname__")):
        assert obj.__name__ == name, f"{module}.{name} is {obj.__name__} now"


def test_the_package_exports_at_least_todays_names() -> None:
    assert EXPORTS - set(toolq.__all__) == set()


@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_an_exported_name_is_one_object_however_it_is_imported(name: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"from toolq import {name}", namespace)  # the statement a user writes
    assert namespace[name] is getattr(toolq, name)


@pytest.mark.parametrize(("left", "name", "right"), SAME)
def test_a_name_public_in_two_modules_is_one_object(left: str, name: str, right: str) -> None:
    assert _resolve(left, name) is _resolve(right, name)


def test_the_errors_module_is_the_one_the_package_exports() -> None:
    import toolq.errors

    assert toolq.errors is importlib.import_module("toolq.errors")
    assert _resolve("toolq", "errors") is toolq.errors
