"""toolq.core.text.as_text: a Redis reply's value as text, as a table."""

from __future__ import annotations

from typing import Any

import pytest

from toolq.core.text import as_text


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (b"queued", "queued"),
        ("queued", "queued"),
        (b"caf\xc3\xa9", "café"),
        (12, "12"),
        (1.5, "1.5"),
        (b"", ""),
    ],
)
def test_as_text(value: Any, text: str) -> None:
    assert as_text(value) == text
