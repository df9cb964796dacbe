"""The broker URL (issue 18): checked and redacted as the ledger's is; set, it puts
the deployment in outbox mode (a relay, quorum queues on RabbitMQ); unset, nothing
changes."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from toolq import ToolQueue, errors
from toolq.broker.app import celery_config
from toolq.broker.transport import TRANSPORT
from toolq.settings import ToolqSettings
from toolq.stack import Stack, StackConfig

LEDGER = "redis://h:6379/0"


@pytest.mark.parametrize(
    "url",
    [
        "amqp://u:pw@rabbit:5672//",
        "amqps://rabbit//",
        "pyamqp://guest:guest@127.0.0.1//",
        "redis://broker:6379/1",
        "rediss://:pw@broker:6380/0",
    ],
)
def test_a_broker_url_of_a_kombu_broker_is_accepted(url: str) -> None:
    s = ToolqSettings(broker_url=SecretStr(url))
    assert s.outbox and s.broker == url
    assert "pw" not in s.safe_broker_url and "pw" not in repr(s)


@pytest.mark.parametrize("url", ["http://u:secret@h/", "memory://", "sqs://k:secret@", "rabbit"])
def test_any_other_broker_url_is_refused_with_the_url_redacted(url: str) -> None:
    with pytest.raises(ValidationError, match="broker_url must start with") as info:
        ToolqSettings(broker_url=SecretStr(url))
    assert "secret" not in str(info.value)
    tq = ToolQueue(redis_url=LEDGER)
    with pytest.raises(errors.RequestRefused, match="broker_url must start with") as refused:
        tq.app.configure_broker(url)
    assert "secret" not in str(refused.value) and not tq.settings.outbox


def test_the_env_sets_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLQ_BROKER_URL", "amqp://rabbit//")
    assert ToolqSettings().outbox
    monkeypatch.setenv("TOOLQ_BROKER_URL", "ftp://x")
    with pytest.raises(ValidationError):
        ToolqSettings()


def test_unset_the_ledger_is_the_broker_as_before() -> None:
    s = ToolqSettings()
    assert not s.outbox and s.safe_broker_url == "(ledger)"
    c = celery_config(s, LEDGER)
    assert c["broker_url"] == LEDGER and c["broker_transport"] == TRANSPORT
    assert all(q.queue_arguments is None for q in c["task_queues"])
    assert "confirm_publish" not in c["broker_transport_options"]


def test_rabbitmq_gets_quorum_queues_and_confirms_and_kombus_own_transport() -> None:
    s = ToolqSettings(broker_url=SecretStr("amqp://rabbit//"))
    c = celery_config(s, LEDGER)
    assert c["broker_url"] == "amqp://rabbit//"
    assert c["broker_transport"] is None  # toolq's Redis transport is for redis:// only
    assert all(q.queue_arguments == {"x-queue-type": "quorum"} for q in c["task_queues"])
    assert c["broker_transport_options"]["confirm_publish"] is True


def test_a_redis_broker_of_its_own_keeps_classic_lists() -> None:
    c = celery_config(ToolqSettings(broker_url=SecretStr("redis://broker:6379/1")), LEDGER)
    assert c["broker_url"] == "redis://broker:6379/1" and c["broker_transport"] == TRANSPORT
    assert all(q.queue_arguments is None for q in c["task_queues"])
    # its deliveries are acknowledged through it: the ledger's calls are on another server
    assert c["toolq_acks_in_ledger"] is False
    assert celery_config(ToolqSettings(), LEDGER)["toolq_acks_in_ledger"] is True


def test_the_ledger_and_the_celery_app_follow_configure_broker() -> None:
    tq = ToolQueue(redis_url=LEDGER)
    assert not tq.app.ledger.calls.outbox
    tq.app.configure_broker("amqp://rabbit//")
    assert tq.app.ledger.calls.outbox
    assert tq.celery.conf.broker_url == "amqp://rabbit//"
    # pointing the ledger elsewhere leaves the broker where it is
    tq.configure(redis_url="redis://other:6379/0")
    assert tq.celery.conf.broker_url == "amqp://rabbit//"


def test_toolq_up_starts_a_relay_only_with_a_broker_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TOOLQ_BROKER_URL", raising=False)

    def roles(env: dict[str, str]) -> list[str]:
        plan = Stack(StackConfig(app="m:tq", redis_url=LEDGER, env=env))._plan()
        return [c.role for c in plan]

    assert "relay" not in roles({})
    assert roles({"TOOLQ_BROKER_URL": "amqp://rabbit//"}).count("relay") == 1
