"""The embedded server's pure parts: URLs, the config it writes, what it prints."""

from __future__ import annotations

from pathlib import Path

import fakeredis
import pytest

from toolq.adapters.embedded import EmbeddedServer, EmbeddedServerError, render_config, url_for_db


@pytest.mark.parametrize(
    ("url", "db", "expected"),
    [
        ("redis://127.0.0.1:6379", 3, "redis://127.0.0.1:6379/3"),
        ("redis://127.0.0.1:6379/0", 4095, "redis://127.0.0.1:6379/4095"),
        ("redis://:s3cret@host:1/2", 7, "redis://:s3cret@host:1/7"),
        (
            "rediss://user:pw@host/0?ssl_cert_reqs=none",
            1,
            "rediss://user:pw@host/1?ssl_cert_reqs=none",
        ),
        ("unix:///tmp/valkey.sock", 5, "unix:///tmp/valkey.sock?db=5"),
        ("unix:///tmp/valkey.sock?db=2&password=x", 9, "unix:///tmp/valkey.sock?password=x&db=9"),
    ],
)
def test_url_for_db(url: str, db: int, expected: str) -> None:
    assert url_for_db(url, db) == expected


def test_urls_hide_their_password_in_reprs_only() -> None:
    url = url_for_db("redis://:s3cret@host:1/0", 2)

    assert str(url) == "redis://:s3cret@host:1/2"
    assert "s3cret" not in repr(url)
    assert "s3cret" not in repr({"url": url})
    assert "s3cret" not in repr(EmbeddedServer(port=1, password="s3cret").url)


def test_url_for_db_refuses_negative_numbers() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        url_for_db("redis://h/0", -1)


def _directives(text: str) -> dict[str, str]:
    pairs = (line.split(" ", 1) for line in text.splitlines() if line and not line.startswith("#"))
    return {key: value for key, value in pairs}


def test_config_with_aof_is_durable_loopback_and_never_evicts(tmp_path: Path) -> None:
    conf = _directives(render_config(port=7000, data_dir=tmp_path, databases=32))

    assert conf["port"] == "7000"
    assert conf["bind"] == "127.0.0.1"
    assert conf["protected-mode"] == "yes"
    assert conf["daemonize"] == "no"
    assert conf["dir"] == f'"{tmp_path}"'
    assert conf["databases"] == "32"
    assert conf["maxmemory-policy"] == "noeviction"
    assert conf["appendonly"] == "yes"
    assert conf["appendfsync"] == "always"  # durability="fsync" needs it
    assert conf["save"] == '""'
    assert "requirepass" not in conf


def test_config_without_aof_writes_nothing_to_disk(tmp_path: Path) -> None:
    conf = _directives(render_config(port=1, data_dir=tmp_path, appendonly=False))

    assert conf["appendonly"] == "no"
    assert conf["save"] == '""'
    assert "appendfsync" not in conf


def test_config_quotes_paths_and_passwords(tmp_path: Path) -> None:
    odd_dir = tmp_path / 'a "b" \\c'
    conf = _directives(render_config(port=1, data_dir=odd_dir, password='p"w\\'))

    assert conf["dir"] == '"' + str(odd_dir).replace("\\", "\\\\").replace('"', '\\"') + '"'
    assert conf["requirepass"] == '"p\\"w\\\\"'


def test_extra_config_is_appended_last_so_it_wins(tmp_path: Path) -> None:
    text = render_config(port=1, data_dir=tmp_path, extra={"appendfsync": "always"})

    assert text.splitlines()[-1] == "appendfsync always"


@pytest.mark.parametrize("extra", [{"save": "1 1\nrequirepass x"}, {"a\nb": "c"}])
def test_extra_config_cannot_inject_lines(tmp_path: Path, extra: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="spans lines"):
        render_config(port=1, data_dir=tmp_path, extra=extra)


def test_bad_settings_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="databases"):
        EmbeddedServer(databases=0)


def test_an_unstarted_server_has_no_pid_port_or_dir() -> None:
    server = EmbeddedServer()

    assert not server.running
    assert repr(server) == "<EmbeddedServer unstarted stopped>"
    for attribute in ("pid", "port", "url", "data_dir"):
        with pytest.raises(EmbeddedServerError):
            getattr(server, attribute)
    server.stop()  # stopping what never started is harmless


def test_the_password_is_in_the_url_but_never_in_the_repr() -> None:
    server = EmbeddedServer(port=6390, password="hunter2:/@")

    assert server.url == "redis://:hunter2%3A%2F%40@127.0.0.1:6390/0"
    assert "hunter2" not in repr(server)
    assert "127.0.0.1:6390" in repr(server)


def test_fake_redis_fixture_runs_lua(fake_redis: fakeredis.FakeRedis) -> None:
    script = "redis.call('SET', KEYS[1], ARGV[1]); return redis.call('GET', KEYS[1])"

    assert fake_redis.eval(script, 1, "k", "v") == b"v"


def test_fake_redis_fixture_starts_empty(fake_redis: fakeredis.FakeRedis) -> None:
    assert fake_redis.dbsize() == 0
    fake_redis.set("left-behind", 1)  # the next test's server must not see this
