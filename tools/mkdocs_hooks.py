"""MkDocs hooks for the docs site (``mkdocs.yml``).

- The README is the site's front page (``index.md``), generated from it at build time
  so that it is written once; its links into ``docs/`` are made relative to the site.
- The "Decisions" section lists every ``docs/decisions/*.md`` in order, so that a new
  decision record needs no edit here (the strict build fails on a page left out).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent.parent
#: A Markdown link or image whose target is a path in the repository, not a URL.
_LINK = re.compile(r"(!?\[[^\]]*\])\((?!https?:|#|mailto:)([^)\s]+)\)")


def front_page(readme: str) -> str:
    """The README as the site's index: ``docs/x.md`` becomes ``x.md``; a link to a
    file outside ``docs/`` (source, examples) becomes its path as code."""

    def fix(m: re.Match[str]) -> str:
        text, target = m.group(1), m.group(2)
        if target.startswith("docs/"):
            return f"{text}({target[len('docs/') :]})"
        if text.startswith("!"):
            return m.group(0)
        return f"{text[1:-1]} (`{target}`)"

    return _LINK.sub(fix, readme)


def on_config(config: MkDocsConfig, **_: Any) -> MkDocsConfig:
    decisions = sorted((ROOT / "docs" / "decisions").glob("[0-9]*.md"))
    section = ["decisions/README.md", *(f"decisions/{p.name}" for p in decisions)]
    nav = config.nav or []
    if not any(isinstance(item, dict) and "Decisions" in item for item in nav):
        nav.append({"Decisions": section})
    config.nav = nav
    return config


def on_files(files: Files, config: MkDocsConfig, **_: Any) -> Files:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    files.append(File.generated(config, "index.md", content=front_page(readme)))
    return files
