"""The docs site builds strictly from ``docs/`` (a broken link or an API reference
that does not resolve fails it), the README is its front page, and no page loads
anything from another origin (it must work offline)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tools.mkdocs_hooks import front_page

ROOT = Path(__file__).resolve().parents[2]

#: What a page would fetch from elsewhere: a script, a stylesheet, an image, a font.
_LOADS = re.compile(
    r"<script[^>]+src=\"https?://|<link[^>]+rel=\"stylesheet\"[^>]+href=\"https?://"
    r"|<img[^>]+src=\"https?://|url\(['\"]?https?://|@import\s+['\"]?https?://"
)


@pytest.mark.parametrize(
    ("readme", "page"),
    [
        ("see [brokers](docs/brokers.md#outages)", "see [brokers](brokers.md#outages)"),
        ("![overview](docs/console-overview.png)", "![overview](console-overview.png)"),
        ("the [example](examples/shop.py)", "the example (`examples/shop.py`)"),
        ("[Celery](https://docs.celeryq.dev/)", "[Celery](https://docs.celeryq.dev/)"),
        ("[below](#run-it)", "[below](#run-it)"),
    ],
)
def test_the_front_page_is_the_readme_with_links_for_the_site(readme: str, page: str) -> None:
    assert front_page(readme) == page


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    venv = Path(sys.executable).parent.parent
    if not (venv / "bin" / "mkdocs").exists():
        pytest.fail("mkdocs is not installed: `make` installs the docs extra")
    # The README's command, as it shows it (`make docs`), into a directory of the test's.
    proc = subprocess.run(
        ["make", "-s", "docs", f"SITE={out}", f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


def test_the_site_builds_strictly_with_the_readme_as_front_page(site: Path) -> None:
    index = re.sub(r"<[^>]+>", "", (site / "index.html").read_text(encoding="utf-8"))
    assert "make demo" in index and "make test" in index
    for page in ("architecture.html", "brokers.html", "cells.html", "integrations.html"):
        assert (site / page).is_file(), page
    decisions = sorted(p.stem for p in (ROOT / "docs" / "decisions").glob("[0-9]*.md"))
    assert decisions
    for name in decisions:
        assert (site / "decisions" / f"{name}.html").is_file(), name


def test_the_python_reference_comes_from_the_docstrings(site: Path) -> None:
    ref = (site / "reference" / "python.html").read_text(encoding="utf-8")
    for name in ("ToolQueue", "Tool", "CallContext", "ToolError", "OperationRecord"):
        assert f'id="toolq.{name}"' in ref, name


def test_no_page_loads_anything_from_another_origin(site: Path) -> None:
    found = []
    for path in site.rglob("*"):
        if path.suffix in (".html", ".css", ".js"):
            text = path.read_text(encoding="utf-8", errors="replace")
            found += [f"{path.relative_to(site)}: {m.group(0)}" for m in _LOADS.finditer(text)]
    assert found == []
