"""toolq's pre-built Celery messages are what Celery and kombu would have sent."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from toolq import ToolQueue
from toolq.adapters.broker.messages import RUN_TASK, VERIFY_TASK, message_ref


@pytest.mark.parametrize(
    ("task", "args", "queue"),
    [(RUN_TASK, ["run_81/step_4", 2], "toolq.calls"), (VERIFY_TASK, ["r#1", 3, 7], "toolq.verify")],
)
def test_a_templated_message_equals_celerys_own(task: str, args: list[object], queue: str) -> None:
    m = ToolQueue(redis_url="redis://127.0.0.1:1/0").app.messages
    built = json.loads(m.raw(task, args, queue))
    task_id = built["headers"]["id"]
    ref = m.reference(task, args, queue, task_id)
    ref.pop("embed")

    assert json.loads(base64.b64decode(built.pop("body"))) == json.loads(
        base64.b64decode(ref.pop("body"))
    )
    tag = built["properties"].pop("delivery_tag")
    assert len(tag) == 32 and built == ref
    assert built["headers"]["task"] == task and built["properties"]["correlation_id"] == task_id
    assert message_ref(m.raw(task, args, queue)) == args[0]


def test_every_message_has_its_own_ids() -> None:
    m = ToolQueue(redis_url="redis://127.0.0.1:1/0").app.messages
    a, b = (json.loads(m.run("r", 1)[1]) for _ in range(2))
    assert a["headers"]["id"] != b["headers"]["id"]
    assert a["properties"]["delivery_tag"] != b["properties"]["delivery_tag"]


@pytest.mark.parametrize("raw", [None, b"", b"{}", b'{"body": "!!"}', b"not json"])
def test_message_ref_of_anything_else_is_none(raw: bytes | None) -> None:
    assert message_ref(raw) is None


def test_message_ids_are_version_4_uuids_and_distinct() -> None:
    import uuid

    from toolq.core.ids import uuid4_hex

    ids = [uuid4_hex() for _ in range(2000)]
    assert len(set(ids)) == len(ids)
    for h in ids:
        u = uuid.UUID(h)
        assert (u.version, u.variant, u.hex) == (4, uuid.RFC_4122, h)


@pytest.mark.parametrize("args", [["op/1", 2], ['q"uo\\te é', 1, 3], [], [7], ["a", 1.5]])
def test_message_arguments_are_written_as_json_dumps_writes_them(args: list[Any]) -> None:
    from toolq.adapters.broker.messages import _json_list

    assert _json_list(args) == json.dumps(args)


def test_a_new_operation_ref_is_op_and_a_version_4_uuid() -> None:
    import uuid

    from toolq.core.settings import LimitSettings
    from toolq.decisions.operations import operation_ref

    refs = [operation_ref(None, None, None, LimitSettings()) for _ in range(200)]
    assert len(set(refs)) == len(refs)
    for ref in refs:
        u = uuid.UUID(ref.removeprefix("op_"))
        assert ref == f"op_{u.hex}" and (u.version, u.variant) == (4, uuid.RFC_4122)
