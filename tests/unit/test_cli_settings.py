"""A bad TOOLQ_* variable gets one line naming it, never a traceback or its value."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from tests.helpers import toolq_env
from toolq.adapters.embedded import url_for_db
from toolq.edges.cli import main
from toolq.edges.cli.common import server_said


@pytest.mark.parametrize(
    ("env", "args", "expected"),
    [
        ({"TOOLQ_CELLS": "abc"}, ["status"], "TOOLQ_CELLS: Input should be a valid integer"),
        ({"TOOLQ_LEASE__SECONDS": "x"}, ["status"], "TOOLQ_LEASE__SECONDS: Input should be"),
        (
            {"TOOLQ_WORKER__RECORD_PATIENCE_S": "0"},
            ["status"],
            "TOOLQ_WORKER__RECORD_PATIENCE_S: Input should be greater than or equal to 0.1",
        ),
        (
            {"TOOLQ_WORKER__CLAIM_PATIENCE_S": "7200"},
            ["status"],
            "TOOLQ_WORKER__CLAIM_PATIENCE_S: Input should be less than or equal to 3600",
        ),
        (
            {"TOOLQ_CLUSTER": "1", "TOOLQ_REDIS_URL": "redis://u:s3cret@127.0.0.1:1/0"},
            ["status"],
            "cluster=true needs cells",
        ),
        # a structured field's variable that is not JSON: pydantic-settings' SettingsError
        ({"TOOLQ_LEASE": "{s3cret"}, ["status"], "TOOLQ_LEASE: not valid JSON"),
        ({"TOOLQ_LEASE": "{s3cret"}, ["show", "op_1"], "TOOLQ_LEASE: not valid JSON"),
    ],
)
def test_a_bad_setting_is_one_line_without_its_value(
    env: dict[str, str], args: list[str], expected: str
) -> None:
    result = CliRunner().invoke(main, args, env=env)
    assert result.exit_code != 0
    assert expected in result.output
    assert "invalid settings" in result.output
    assert "Traceback" not in result.output and "s3cret" not in result.output
    assert "input_value" not in result.output


def test_the_loader_names_a_bad_setting_not_the_import() -> None:
    from pydantic import ValidationError

    from toolq.core.settings import ToolqSettings, settings_problem

    with pytest.raises(ValidationError) as caught:
        ToolqSettings(redis_url="http://u:s3cret@h/")  # type: ignore[arg-type]
    problem = settings_problem(caught.value)
    assert problem is not None
    assert problem.startswith("invalid settings: TOOLQ_REDIS_URL: redis_url must start with")
    assert "s3cret" not in problem
    assert settings_problem(ValueError("x")) is None


@pytest.mark.parametrize(
    "args",
    [
        ["cells", "balance"],
        ["cells", "adopt", "--node", "127.0.0.1:2"],
        ["cells", "migrate", "--cells", "8"],
    ],
)
def test_a_server_out_of_reach_is_one_line_naming_what_to_check(args: list[str]) -> None:
    # port 1: nothing listens there, the connection is refused at once
    result = CliRunner().invoke(main, [*args, "--redis-url", "redis://u:s3cret@127.0.0.1:1/0"])
    assert result.exit_code != 0
    assert "cannot reach Redis/Valkey (ConnectionError): check --redis-url" in result.output
    assert "Traceback" not in result.output and "s3cret" not in result.output


@pytest.mark.parametrize("command", ["worker", "scheduler", "relay", "up", "api", "mcp"])
def test_a_misspelt_loglevel_is_a_usage_error_before_anything_starts(command: str) -> None:
    # port 1: had the command started, it would wait for or refuse the server
    result = CliRunner().invoke(
        main, [command, "-l", "verbose", "--redis-url", "redis://u:s3cret@127.0.0.1:1/0"]
    )
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--loglevel'" in result.output and "'verbose'" in result.output
    assert "Traceback" not in result.output and "s3cret" not in result.output


@pytest.mark.parametrize("level", ["warning", "WARNING", "Warning"])
def test_a_loglevel_is_taken_in_any_case(level: str) -> None:
    # `up` parses it, then stops at the app it cannot import: not at -l
    result = CliRunner().invoke(main, ["up", "-l", level, "--app", "toolq_no_such_app:tq"])
    assert result.exit_code != 0, result.output
    assert "cannot import" in result.output and "--loglevel" not in result.output


#: URLs redis-py refuses (or, for a path that is not a number, reads as database 0)
#: only when the first connection is made: each with a password that must not show.
MALFORMED_URLS = [
    "redis://u:s3cret@[::1",  # an IPv6 host not closed
    "redis://u:s3cret@127.0.0.1:99999/0",  # a port out of range
    "redis://:s3cret@127.0.0.1:abc/0",  # a port that is not a number
    "redis://u:s3cret@127.0.0.1:6379/abc",  # a database that is not a number
]


@pytest.mark.parametrize("url", MALFORMED_URLS)
def test_a_malformed_redis_url_is_an_invalid_setting_without_its_password(url: str) -> None:
    from pydantic import ValidationError

    from toolq.core.settings import ToolqSettings, settings_problem

    with pytest.raises(ValidationError) as caught:
        ToolqSettings(redis_url=url)  # type: ignore[arg-type]
    problem = settings_problem(caught.value)
    assert problem is not None and problem.startswith("invalid settings: TOOLQ_REDIS_URL: ")
    assert "s3cret" not in problem


@pytest.mark.parametrize(
    "url", ["redis://h:6379", "redis://h:6379/", "redis://h/3", "redis://[::1]:6379/0", "unix:///s"]
)
def test_a_well_formed_redis_url_is_taken(url: str) -> None:
    from toolq.core.settings import ToolqSettings

    assert ToolqSettings(redis_url=url).url == url  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "args",
    [
        ["status"],  # the light path: no app, a plain client
        ["show", "op_1"],
        ["list"],
        ["submit", "create_invoice", "--args", "{}"],
        ["worker"],
        ["scheduler"],
        ["api"],
        ["mcp"],
        ["up"],
        ["migrate"],
        ["cells", "migrate", "--cells", "8"],
        ["cells", "balance"],
        ["deps"],
    ],
    ids=lambda args: "-".join(args[:2]),
)
@pytest.mark.parametrize("url", MALFORMED_URLS[:2])
def test_every_command_answers_a_malformed_url_with_one_line(args: list[str], url: str) -> None:
    result = CliRunner().invoke(main, [*args, "--redis-url", url], env={"TOOLQ_APP": None})
    assert result.exit_code != 0
    assert "invalid settings: TOOLQ_REDIS_URL: redis_url: a host or port cannot be read" in (
        result.output
    ), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "s3cret" not in result.output


def test_flower_answers_a_malformed_url_before_it_becomes_celery() -> None:
    # In a process of its own: a `toolq flower` that went on would exec Celery in place of it
    result = subprocess.run(
        [sys.executable, "-m", "toolq.edges.cli", "flower", "--redis-url", MALFORMED_URLS[1]],
        env=toolq_env(unset=("TOOLQ_APP",)),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "invalid settings: TOOLQ_REDIS_URL" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "s3cret" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--watch", "--interval", "nan"],
        ["status", "--ping", "--worker-timeout", "nan"],
        ["submit", "create_invoice", "--args", "{}", "--wait", "nan"],
        ["mcp", "--wait-seconds", "nan"],
        ["demo", "--timeout", "nan"],
    ],
    ids=lambda args: args[0],
)
def test_nan_seconds_is_a_usage_error(args: list[str]) -> None:
    # click's FloatRange takes nan (it compares false to both bounds): a watch that slept
    # nan seconds ended in a traceback, a --wait of nan returned at once
    result = CliRunner().invoke(main, args, env={"TOOLQ_REDIS_URL": "redis://127.0.0.1:1/0"})
    assert result.exit_code == 2, result.output
    assert "'nan' is not a number of seconds" in result.output


def test_an_app_that_fails_to_import_is_one_line_without_its_credentials(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given an app module whose import fails with a URL and a token in its message
    (tmp_path / "toolq_test_leaky_app.py").write_text(
        'raise ConnectionError("cannot reach redis://:s3cret@db:6379/0\\nretry: token=s3cret")\n'
    )
    monkeypatch.chdir(tmp_path)  # where the loader looks first, as `toolq` run there does
    # When a command loads it
    result = CliRunner().invoke(main, ["list", "--app", "toolq_test_leaky_app:tq"])
    # Then its words are one line, without the password or the token
    assert result.exit_code == 2, result.output
    assert result.output.startswith("Error: cannot import 'toolq_test_leaky_app': ConnectionError")
    assert "s3cret" not in result.output and len(result.output.strip().splitlines()) == 1


def _fresh_app(where: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An app module of its own, imported by the command under test first: the example
    app's ``tq`` is a module global, which a command of an earlier test in this process
    may have pointed at its URL (and built its settings) already."""
    name = f"toolq_test_fresh_{uuid.uuid4().hex[:12]}"
    (where / f"{name}.py").write_text(
        "from pydantic import BaseModel\n"
        "from toolq import ToolQueue\n\n"
        "tq = ToolQueue()\n\n\n"
        "class Args(BaseModel):\n    n: int = 0\n\n\n"
        "@tq.tool()\n"
        "def create_invoice(args: Args) -> dict:\n    return {}\n"
    )
    monkeypatch.chdir(where)  # where the loader looks first, as `toolq` run there does
    return f"{name}:tq"


def test_a_structured_setting_that_is_not_json_is_one_line_where_the_app_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = _fresh_app(tmp_path, monkeypatch)
    result = CliRunner().invoke(
        main, ["list", "--app", app], env={"TOOLQ_DEPENDENCIES": "{s3cret", "TOOLQ_REDIS_URL": None}
    )
    assert result.exit_code != 0
    assert "invalid settings: TOOLQ_DEPENDENCIES: not valid JSON" in result.output, result.output
    assert "Traceback" not in result.output and "s3cret" not in result.output


@pytest.mark.parametrize(
    "args",
    [["list"], ["submit", "create_invoice", "--args", "{}"], ["show", "op_1"], ["status"]],
    ids=lambda args: args[0],
)
def test_no_url_anywhere_is_said_in_the_clis_words(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Given no --redis-url, no TOOLQ_REDIS_URL and no `toolq up` recorded here
    app = _fresh_app(tmp_path, monkeypatch)
    result = CliRunner().invoke(
        main, [*args, "--app", app], env={"TOOLQ_REDIS_URL": None, "TOOLQ_APP": None}
    )
    assert result.exit_code != 0
    # the CLI's option, not the library's redis_url=
    assert "no Redis URL: pass --redis-url, set TOOLQ_REDIS_URL" in result.output, result.output


@pytest.mark.parametrize(
    "args", [["api"], ["mcp", "--transport", "http"]], ids=lambda args: args[0]
)
def test_a_port_in_use_is_one_line_before_anything_starts(args: list[str]) -> None:
    # Given a port something listens on
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(
            main,
            [*args, "--port", str(port)],
            env={"TOOLQ_REDIS_URL": "redis://127.0.0.1:1/0", "TOOLQ_APP": None},
        )
    # uvicorn's own was an ERROR line and exit 3, after the app was made
    assert result.exit_code != 0
    assert f"port {port} on 127.0.0.1 is in use" in result.output, result.output


@pytest.mark.parametrize(
    "args",
    [
        ["migrate", "--dry-run", "--prefix", ""],
        ["migrate", "--dry-run", "--prefix", "two\nlines"],
        ["cells", "migrate", "--cells", "4", "--prefix", "a}b"],
        ["cells", "balance", "--prefix", "a:c001"],  # a cell's own tag
    ],
    ids=["empty", "newline", "brace", "colon"],
)
def test_a_prefix_no_ledger_can_have_is_a_usage_error(args: list[str]) -> None:
    result = CliRunner().invoke(main, [*args, "--redis-url", "redis://127.0.0.1:1/0"])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--prefix'" in result.output


def test_a_prefix_no_ledger_can_have_is_an_invalid_setting() -> None:
    # a brace would end every key's hash tag early: a Cluster would scatter an operation
    result = CliRunner().invoke(
        main, ["status", "--redis-url", "redis://127.0.0.1:1/0"], env={"TOOLQ_PREFIX": "a{b"}
    )
    assert result.exit_code != 0
    assert "invalid settings: TOOLQ_PREFIX" in result.output, result.output


@pytest.mark.parametrize(
    ("exc", "said"),
    [
        (
            redis.AuthenticationError("invalid username-password pair"),
            "the server at redis://u:***@db:6379/0 refused the URL's credentials "
            "(AuthenticationError): check the user and password in its URL",
        ),
        (
            redis.ConnectionError("refused"),
            "cannot reach Redis at redis://u:***@db:6379/0: ConnectionError",
        ),
        (
            redis.TimeoutError("Timeout connecting to server"),
            "cannot reach Redis at redis://u:***@db:6379/0: TimeoutError",
        ),
        (
            redis.ResponseError("DB index is out of range"),
            "the server at redis://u:***@db:6379/0 refused toolq's first command: "
            "ResponseError: DB index is out of range",
        ),
    ],
)
def test_a_first_command_that_failed_is_said_with_what_to_check(exc: Exception, said: str) -> None:
    assert server_said("redis://u:s3cret@db:6379/0", exc) == said


def test_a_rediss_url_whose_handshake_timed_out_is_said_with_tls_advice() -> None:
    said = server_said("rediss://db:6380/0", redis.TimeoutError("Timeout connecting to server"))
    assert said == (
        "cannot reach Redis at rediss://db:6380/0: TimeoutError; a rediss:// URL speaks "
        "TLS: if the server does not on that port, use redis://"
    )


def test_status_with_a_rediss_url_to_a_server_without_tls_says_check_tls(tmp_path: Path) -> None:
    # Given a server on loopback that speaks no TLS: it answers a TLS greeting in plain
    # (as Redis answers an inline command it does not know) and hangs up
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        with listener:
            while True:  # each of redis-py's tries; until the test closes it
                try:
                    conn, _ = listener.accept()
                except OSError:
                    return
                with conn:
                    conn.sendall(b"-ERR unknown command\r\n")

    threading.Thread(target=serve, daemon=True).start()
    # When `toolq status` is pointed at it with a rediss:// URL
    result = CliRunner().invoke(
        main,
        ["status", "--redis-url", f"rediss://127.0.0.1:{port}/0", "--state-dir", str(tmp_path)],
    )
    listener.close()
    # Then it fails in one line that says what to check: TLS, not only "cannot reach"
    assert result.exit_code != 0
    assert "cannot reach Redis at rediss://127.0.0.1:" in result.output, result.output
    assert "a rediss:// URL speaks TLS: if the server does not on that port, use redis://" in (
        result.output
    ), result.output
    assert "Traceback" not in result.output


def test_status_with_a_refused_password_says_check_it_not_that_the_server_is_away(
    valkey: str, tmp_path: Path
) -> None:
    # Given the session's server and a URL naming a user it does not have
    assert valkey.startswith("redis://")
    url = "redis://nobody:wrong@" + valkey.removeprefix("redis://")
    # When `toolq status` reads it (other commands said this already; status said
    # "cannot reach Redis: AuthenticationError", as for a server away)
    result = CliRunner().invoke(main, ["status", "--redis-url", url, "--state-dir", str(tmp_path)])
    # Then one line says the credentials were refused, and what to check, password hidden
    assert result.exit_code != 0
    assert "refused the URL's credentials (AuthenticationError)" in result.output, result.output
    assert "check the user and password in its URL" in result.output
    assert "cannot reach" not in result.output and "wrong" not in result.output


def test_up_to_a_server_that_refuses_says_it_in_the_servers_words_and_starts_nothing(
    valkey: str, tmp_path: Path
) -> None:
    # Given the session's server and a database it does not have
    url = url_for_db(valkey, 99999)
    # When `toolq up` is pointed at it
    result = CliRunner().invoke(
        main, ["up", "--redis-url", url, "--state-dir", str(tmp_path / "state")]
    )
    # Then one line says what the server said (it said only "refused: ResponseError"),
    # and nothing was started: no state file
    assert result.exit_code != 0
    assert "refused toolq's first command: ResponseError: DB index is out of range" in (
        result.output
    ), result.output
    assert not (tmp_path / "state").exists() or not any((tmp_path / "state").iterdir())
