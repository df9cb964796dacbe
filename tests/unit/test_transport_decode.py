"""The transport reads a message as kombu's ``loads`` would, with one decoder for all."""

from __future__ import annotations

import datetime
import json
import uuid
from typing import Any

import pytest
from kombu.utils.json import dumps
from kombu.utils.json import loads as kombu_loads

from toolq.adapters.broker import transport


@pytest.mark.parametrize(
    "value",
    [
        {"body": "e30=", "headers": {"id": "x", "argsrepr": "noop('op_1', attempt=1)"}},
        {"when": datetime.datetime(2026, 12, 2, 22, 0, tzinfo=datetime.UTC), "id": uuid.uuid4()},
        [1, "é", None, {"a": [True, 1.5]}],
    ],
)
def test_a_message_reads_as_kombu_reads_it(value: Any) -> None:
    text = dumps(value)
    assert transport.loads(text) == kombu_loads(text) == value


def test_no_decoder_is_built_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    built = []
    init = json.JSONDecoder.__init__

    def counting(self: json.JSONDecoder, *a: Any, **k: Any) -> None:
        built.append(1)
        init(self, *a, **k)

    monkeypatch.setattr(json.JSONDecoder, "__init__", counting)
    for _ in range(5):
        transport.loads(dumps({"properties": {"delivery_tag": "t"}}))
    assert built == []
