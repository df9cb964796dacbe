"""The broker URL (issue 18): checked and redacted as the ledger's is; set, it puts
the deployment in outbox mode (a relay, quorum queues on RabbitMQ); unset, nothing
changes."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError

from toolq import ToolQueue
from toolq.adapters.broker.app import celery_config
from toolq.adapters.broker.transport import SENTINEL_TRANSPORT, TRANSPORT
from toolq.core import errors
from toolq.core.settings import ToolqSettings
from toolq.edges.stack import Stack, StackConfig

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
    assert c["broker_transport_options"]["fetch_batch"] == 64  # many messages per fetch


def test_rabbitmq_gets_quorum_queues_and_confirms_and_kombus_own_transport() -> None:
    s = ToolqSettings(broker_url=SecretStr("amqp://rabbit//"))
    c = celery_config(s, LEDGER)
    assert c["broker_url"] == "amqp://rabbit//"
    assert c["broker_transport"] is None  # toolq's Redis transport is for redis:// only
    assert all(q.queue_arguments == {"x-queue-type": "quorum"} for q in c["task_queues"])
    assert c["broker_transport_options"]["confirm_publish"] is True
    assert "fetch_batch" not in c["broker_transport_options"]  # kombu's AMQP has none


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


# --------------------------------------------------------------------------- Sentinel

SENTINELS = "sentinel://:pw@s1:26379;sentinel://:pw@s2:26380;sentinel://:pw@s3"
TWO = (("s1", 26379), ("s2", 26379))


@pytest.mark.parametrize(
    ("url", "sentinels", "password", "db"),
    [
        ("sentinel://s1", (("s1", 26379),), None, 0),
        ("sentinel://s1:5000/2", (("s1", 5000),), None, 2),
        (SENTINELS, (("s1", 26379), ("s2", 26380), ("s3", 26379)), "pw", 0),
        ("sentinel://u:p%40w@s1/1;sentinel://u:p%40w@s2/1", TWO, "p@w", 1),
        ("sentinel://s1;sentinel://s2;", TWO, None, 0),  # a trailing ;
    ],
)
def test_a_sentinel_url_with_its_master_name_is_accepted(
    url: str, sentinels: tuple[tuple[str, int], ...], password: str | None, db: int
) -> None:
    s = ToolqSettings(broker_url=SecretStr(url), broker_master_name="mymaster")
    assert s.outbox and s.sentinel is not None
    assert (s.sentinel.sentinels, s.sentinel.password, s.sentinel.db) == (sentinels, password, db)
    assert "pw" not in s.safe_broker_url and "p%40w" not in s.safe_broker_url


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        # kombu would switch to the second address and lose the first's password
        ("sentinel://:pw@s1;sentinel://s2", "same password and database"),
        ("sentinel://:pw@s1/1;sentinel://:pw@s2/2", "same password and database"),
        ("sentinel://:pw@s1;redis://:pw@s2", "address 2 of 2 .* does not start with"),
        # a ';' in the password splits it: neither half is echoed
        ("sentinel://:pw;pw@s1:26379", "address 1 of 2 .* is not sentinel://"),
        ("sentinel://:pw;sentinel://pw@s1", "address 1 of 2 .* is not sentinel://"),
        ("sentinel://:pw@s1:notaport", "is not sentinel://"),
        ("sentinel://:pw@s1/db", "is not sentinel://"),
        ("sentinel://:pw@/0", "is not sentinel://"),
        ("sentinel://:pw@s1?password=pw", "is not sentinel://"),
        (";", "must start with"),
    ],
)
def test_a_malformed_sentinel_url_is_refused_with_the_password_redacted(
    url: str, problem: str
) -> None:
    with pytest.raises(ValidationError, match=problem) as info:
        ToolqSettings(broker_url=SecretStr(url), broker_master_name="mymaster")
    text = str(info.value)
    assert ":pw" not in text and "pw@" not in text and "password=pw" not in text


def test_a_sentinel_url_without_a_master_name_is_refused_at_settings_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ValidationError, match="needs broker_master_name") as info:
        ToolqSettings(broker_url=SecretStr(SENTINELS))
    assert "pw" not in str(info.value)
    monkeypatch.setenv("TOOLQ_BROKER_URL", SENTINELS)
    monkeypatch.setenv("TOOLQ_BROKER_MASTER_NAME", "")  # empty means unset, as the URL's
    with pytest.raises(ValidationError, match="TOOLQ_BROKER_MASTER_NAME"):
        ToolqSettings()
    monkeypatch.setenv("TOOLQ_BROKER_MASTER_NAME", "mymaster")
    assert ToolqSettings().broker_master_name == "mymaster"
    monkeypatch.setenv("TOOLQ_BROKER_MASTER_NAME", "my master")  # not a name Sentinel takes
    with pytest.raises(ValidationError):
        ToolqSettings()


def test_a_master_name_beside_another_broker_is_ignored() -> None:
    s = ToolqSettings(broker_url=SecretStr("redis://broker:6379/1"), broker_master_name="m")
    assert s.sentinel is None
    assert "master_name" not in celery_config(s, LEDGER)["broker_transport_options"]


def test_a_sentinel_broker_gets_toolqs_sentinel_transport_and_its_master_name() -> None:
    s = ToolqSettings(broker_url=SecretStr(SENTINELS), broker_master_name="mymaster")
    c = celery_config(s, LEDGER)
    assert c["broker_url"] == SENTINELS and c["broker_transport"] == SENTINEL_TRANSPORT
    # kombu's master_name, beside toolq's own options (one visibility timeout everywhere)
    assert c["broker_transport_options"] == {
        "visibility_timeout": s.queues.visibility_timeout,
        "fetch_batch": s.worker.fetch_batch,
        "master_name": "mymaster",
    }
    assert all(q.queue_arguments is None for q in c["task_queues"])  # Redis lists
    assert c["toolq_acks_in_ledger"] is False


def test_configure_broker_takes_the_master_name_with_the_url() -> None:
    tq = ToolQueue(redis_url=LEDGER)
    with pytest.raises(errors.RequestRefused, match="needs broker_master_name") as refused:
        tq.app.configure_broker(SENTINELS)
    assert "pw" not in str(refused.value) and not tq.settings.outbox
    tq.app.configure_broker(SENTINELS, master_name="mymaster")
    assert tq.settings.broker_master_name == "mymaster"
    assert tq.celery.conf.broker_transport_options["master_name"] == "mymaster"
    assert "pw" not in tq.settings.safe_broker_url
