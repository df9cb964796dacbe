"""docs/architecture.md and docs/decisions/ stay true (pure: reads files, imports states).

The architecture page names modules, tests and states; a change that moves or
renames one of them fails here until the page says so too.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from toolq.core.states import ALLOWED, State

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DECISIONS = ROOT / "docs" / "decisions"
TEXT = ARCHITECTURE.read_text(encoding="utf-8")

#: Every backticked span that names a file of the package: `toolq/<path>.py` for a
#: module, `toolq/<path>/` for a package, nothing else (one form a script can rewrite).
SPANS = re.findall(r"`(toolq/[^`]*)`", TEXT)
MODULE_FORM = re.compile(r"toolq/(?:[a-z0-9_]+/)*(?:[a-z0-9_]+\.py)?")
#: `tests/<path>.py` and `tests/<path>.py::test_name`
TESTS = re.findall(r"`(tests/[^`:]+)(?:::(\w+))?`", TEXT)
#: The four headings every decision record has, in this order.
HEADINGS = ("## Context", "## Options", "## Measured", "## Chosen")


def _section(title: str) -> str:
    start = TEXT.index(f"\n## {title}\n")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start : end if end >= 0 else len(TEXT)]


def test_the_page_names_modules_in_one_form() -> None:
    assert SPANS, "the page names no module"
    wrong = [s for s in SPANS if "<" not in s and not MODULE_FORM.fullmatch(s)]
    assert wrong == []


@pytest.mark.parametrize("path", sorted({s for s in SPANS if "<" not in s}))
def test_every_module_the_page_names_exists(path: str) -> None:
    target = ROOT / path
    if path.endswith("/"):
        assert (target / "__init__.py").is_file(), path
    else:  # the module `toolq.x`: a file, or a package split from it along its reasons
        assert target.is_file() or (target.with_suffix("") / "__init__.py").is_file(), path


@pytest.mark.parametrize(("path", "name"), sorted(set(TESTS)))
def test_every_test_the_page_names_exists(path: str, name: str) -> None:
    target = ROOT / path
    assert target.exists(), path
    if name:
        assert re.search(rf"^(?:async )?def {name}\(", target.read_text(), re.M), f"{path}::{name}"


def test_the_states_listed_are_the_state_machines() -> None:
    listed = re.search(r"^States: ([^\n]*(?:\n[^\n]+)*)", TEXT, re.M)
    assert listed is not None
    assert re.findall(r"`(\w+)`", listed.group(1)) == [s.value for s in State]


def test_the_transition_table_is_exactly_allowed() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `(\w+)` \|", _section("The state machine"), re.M)
    table = {(State(a), State(b)) for a, b in rows}
    assert len(rows) == len(table), "a transition is listed twice"
    allowed = {(a, b) for a, targets in ALLOWED.items() for b in targets}
    assert table - allowed == set(), "listed but not in toolq.core.states.ALLOWED"
    assert allowed - table == set(), "in toolq.core.states.ALLOWED but not listed"


RECORDS = sorted(DECISIONS.glob("*.md"))


def test_decisions_are_numbered_from_one_without_gaps() -> None:
    numbers = [int(p.name[:4]) for p in RECORDS if p.name[:4].isdigit()]
    assert numbers == list(range(1, len(numbers) + 1))
    assert all(re.fullmatch(r"\d{4}-[a-z0-9-]+\.md", p.name) for p in RECORDS if p.name[0] != "R")


@pytest.mark.parametrize("record", [p for p in RECORDS if p.name[:4].isdigit()], ids=str)
def test_every_decision_has_its_title_and_four_headings(record: Path) -> None:
    text = record.read_text(encoding="utf-8")
    assert text.startswith(f"# {record.name[:4]}. "), "title: '# NNNN. What was decided'"
    found = [line for line in text.splitlines() if line in HEADINGS]
    assert found == list(HEADINGS)


def test_every_decision_the_docs_cite_exists() -> None:
    numbers = {p.name[:4] for p in RECORDS}
    docs = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    cited = {n for d in docs for n in re.findall(r"decisions?[/ ](\d{4})\b", d.read_text())}
    assert cited, "no document cites a decision"
    assert cited - numbers == set()
