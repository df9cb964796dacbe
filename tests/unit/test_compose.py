"""docker-compose.yml, Dockerfile and .dockerignore, read as data (Docker does not run here).

Every command a service runs must exist in the CLI with the options it passes,
every toolq service builds this repository's image, and no secret is written
into any of the three files.
"""

from __future__ import annotations

import itertools
import re
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from toolq.edges.cli import main

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
DATASTORE = "redis"
#: The broker of the outbox mode (``--profile rabbitmq``): an image, like the datastore.
BROKER = "rabbitmq"
CELERY_APP = "toolq.celery_app:celery_app"
RESTART_POLICIES = {"always", "unless-stopped", "on-failure"}

COMPOSE: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
TOOLQ_SERVICES = sorted(name for name in SERVICES if name not in (DATASTORE, BROKER))
# Processes that may run as several containers at once.
SCALABLE = ["worker", "verifier", "scheduler"]

_SECRET_KEY = re.compile(r"(?i)pass|secret|token|api[_-]?key|credential|private[_-]?key|auth")
# ${VAR}, ${VAR:?message}, ${VAR?message}, ${VAR:-} : references that inline nothing.
_BARE_REFERENCE = re.compile(
    r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?\?[^}]*|:?-)?\}|\$[A-Za-z_][A-Za-z0-9_]*"
)
_INTERPOLATION = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}")
_URL_PASSWORD = re.compile(r"://[^/\s:@]*:([^/\s@]+)@")


def _argv(service: dict[str, Any]) -> list[str]:
    command = service.get("command")
    assert command, "every service names its command explicitly"
    return list(command) if isinstance(command, list) else shlex.split(command)


def _resolved(value: str) -> str | None:
    """``value`` as compose would run it with no variable set, or None if it needs one."""
    if re.search(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?\?[^}]*)?\}", value):
        return None
    return _INTERPOLATION.sub(lambda m: m.group(2) or "", value)


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _strings(node: Any, path: str = "") -> list[tuple[str, str]]:
    """Every (path, string) in a parsed YAML tree, keys included in the path."""
    if isinstance(node, list) and path.endswith((".environment", ".args")):
        node = dict(str(item).partition("=")[::2] for item in node)  # the KEY=VALUE form
    if isinstance(node, dict):
        return [pair for k, v in node.items() for pair in _strings(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [pair for i, v in enumerate(node) for pair in _strings(v, f"{path}[{i}]")]
    return [(path, str(node))] if node is not None else []


def inlined_secrets(tree: Any) -> list[str]:
    """Where a compose tree writes a secret literally rather than referencing a variable."""
    found = []
    for path, value in _strings(tree):
        key = path.rsplit(".", 1)[-1]
        literal = _BARE_REFERENCE.sub("", value)
        if _SECRET_KEY.search(key) and literal.strip():
            found.append(f"{path} has a literal value")
        for password in _URL_PASSWORD.findall(value):
            if _BARE_REFERENCE.fullmatch(password) is None:
                found.append(f"{path} has a password in a URL")
    for service, spec in tree.get("services", {}).items():
        argv = spec.get("command") or []
        argv = argv if isinstance(argv, list) else shlex.split(argv)
        for flag, value in itertools.pairwise(argv):
            if flag in {"--requirepass", "--masterauth"} and not _BARE_REFERENCE.fullmatch(value):
                found.append(f"services.{service}.command passes {flag} literally")
    return found


# --------------------------------------------------------------------------- the scanner itself


@pytest.mark.parametrize(
    ("tree", "flagged"),
    [
        ({"services": {"a": {"environment": {"REDIS_PASSWORD": "hunter2"}}}}, True),
        ({"services": {"a": {"environment": ["API_TOKEN=abc"]}}}, True),
        ({"services": {"a": {"environment": {"U": "redis://:hunter2@redis:6379/0"}}}}, True),
        ({"services": {"a": {"environment": {"REDIS_PASSWORD": "${PW:-hunter2}"}}}}, True),
        ({"services": {"a": {"command": ["valkey-server", "--requirepass", "x"]}}}, True),
        ({"services": {"a": {"environment": {"REDIS_PASSWORD": "${REDIS_PASSWORD}"}}}}, False),
        ({"services": {"a": {"environment": {"U": "redis://:${REDIS_PASSWORD}@redis/0"}}}}, False),
        (
            {"services": {"a": {"environment": {"REDIS_PASSWORD": "${REDIS_PASSWORD:?set it}"}}}},
            False,
        ),
        ({"services": {"a": {"command": ["valkey-server", "--requirepass", "${PW}"]}}}, False),
        ({"services": {"a": {"environment": {"TOOLQ_REDIS_URL": "redis://redis:6379/0"}}}}, False),
    ],
)
def test_the_secret_scanner(tree: dict[str, Any], flagged: bool) -> None:
    assert bool(inlined_secrets(tree)) is flagged


# --------------------------------------------------------------------------- docker-compose.yml


def test_no_secret_is_inlined() -> None:
    assert inlined_secrets(COMPOSE) == []


def test_the_datastore_persists_and_never_evicts() -> None:
    redis = SERVICES[DATASTORE]
    argv = _argv(redis)
    pairs = {flag: value for flag, value in itertools.pairwise(argv) if flag[:2] == "--"}

    assert redis["image"].split(":")[0] in {"valkey/valkey", "redis"}
    assert argv[0] in {"valkey-server", "redis-server"}
    assert pairs.get("--appendonly") == "yes"
    # what TOOLQ_DURABILITY=fsync (the default) needs: a power loss undoes no claim
    assert pairs.get("--appendfsync") == "always"
    assert pairs.get("--maxmemory-policy") == "noeviction"
    assert any(":/data" in volume for volume in redis.get("volumes", [])), "the AOF needs a volume"
    assert "ports" not in redis, "the datastore is reached on the compose network only"


def test_the_rabbitmq_profile_runs_a_persistent_broker_and_a_relay() -> None:
    broker, relay = SERVICES[BROKER], SERVICES["relay"]
    assert broker["profiles"] == relay["profiles"] == ["rabbitmq"]
    assert broker["image"].split(":")[0] == "rabbitmq"
    # quorum queues keep their data in the node's directory, named by its host name
    assert any(v.endswith(":/var/lib/rabbitmq") for v in broker["volumes"]) and broker["hostname"]
    assert "ports" not in broker, "the broker is reached on the compose network only"
    assert "rabbitmq-diagnostics" in broker["healthcheck"]["test"]
    assert relay["depends_on"][BROKER]["condition"] == "service_healthy"
    assert _argv(relay)[:2] == ["toolq", "relay"]


@pytest.mark.parametrize("name", TOOLQ_SERVICES)
def test_the_broker_url_is_unset_unless_given(name: str) -> None:
    # Empty (no .env line): Valkey is the broker, and no relay is needed
    from toolq.core.settings import ToolqSettings

    value = _resolved(_environment(SERVICES[name]).get("TOOLQ_BROKER_URL", "missing"))
    assert value == ""
    assert not ToolqSettings.model_validate({"broker_url": value}).outbox


def test_every_service_has_a_healthcheck() -> None:
    redis_check = " ".join(SERVICES[DATASTORE]["healthcheck"]["test"])
    assert re.search(r"(valkey|redis)-cli\b.*\bping\b", redis_check)
    for name, service in SERVICES.items():
        assert service.get("healthcheck", {}).get("test"), f"{name} has no healthcheck"


@pytest.mark.parametrize("name", sorted(SERVICES))
def test_every_service_restarts(name: str) -> None:
    assert SERVICES[name].get("restart") in RESTART_POLICIES


@pytest.mark.parametrize("name", TOOLQ_SERVICES)
def test_toolq_services_build_the_repository_image(name: str) -> None:
    build = SERVICES[name].get("build")
    assert build, f"{name} must build this repository"
    context, dockerfile = (
        (build, "Dockerfile")
        if isinstance(build, str)
        else (
            build["context"],
            build.get("dockerfile", "Dockerfile"),
        )
    )
    path = (COMPOSE_FILE.parent / context / dockerfile).resolve()

    assert path == DOCKERFILE, f"{name} builds {path}"
    assert path.is_file()


@pytest.mark.parametrize("name", TOOLQ_SERVICES)
def test_toolq_services_wait_for_a_healthy_datastore(name: str) -> None:
    depends = SERVICES[name].get("depends_on")
    assert isinstance(depends, dict), "long form: a condition is needed"
    assert depends[DATASTORE]["condition"] == "service_healthy"


@pytest.mark.parametrize("name", TOOLQ_SERVICES)
def test_toolq_services_find_the_compose_datastore(name: str) -> None:
    url = _environment(SERVICES[name]).get("TOOLQ_REDIS_URL", "")

    assert _resolved(url) == f"redis://{DATASTORE}:6379/0"


@pytest.mark.parametrize("name", TOOLQ_SERVICES)
def test_task_events_are_off_unless_asked_for(name: str) -> None:
    # Flower (the profile) needs them; everyone else pays for them in throughput.
    from toolq.core.settings import ToolqSettings

    value = _resolved(_environment(SERVICES[name]).get("TOOLQ_WORKER__TASK_EVENTS", ""))
    assert value == "0"
    assert not ToolqSettings.model_validate({"worker": {"task_events": value}}).worker.task_events


@pytest.mark.parametrize("name", SCALABLE)
def test_scalable_services_have_no_fixed_name_or_host_port(name: str) -> None:
    service = SERVICES[name]

    assert "container_name" not in service
    assert "ports" not in service


@pytest.mark.parametrize("name", TOOLQ_SERVICES)
def test_commands_are_toolq_or_celery(name: str) -> None:
    argv = _argv(SERVICES[name])

    assert argv[0] in {"toolq", "celery"}
    if argv[0] == "celery":
        assert argv[argv.index("-A") + 1] == CELERY_APP
        assert SERVICES[name].get("profiles"), "only optional tools run celery directly"


def _options(command: click.Command) -> dict[str, click.Option]:
    return {
        flag: param
        for param in command.params
        if isinstance(param, click.Option)
        for flag in (*param.opts, *param.secondary_opts)
    }


TOOLQ_COMMANDS = [name for name in TOOLQ_SERVICES if _argv(SERVICES[name])[0] == "toolq"]


@pytest.mark.parametrize("name", TOOLQ_COMMANDS)
def test_toolq_commands_exist_with_every_option_they_pass(name: str) -> None:
    argv = _argv(SERVICES[name])
    subcommand = argv[1]
    assert subcommand in main.commands, f"`toolq {subcommand}` is not a command"
    command = main.commands[subcommand]
    options = _options(command)

    args = iter(argv[2:])
    for token in args:
        assert token.startswith("-"), f"unexpected argument {token!r} to `toolq {subcommand}`"
        flag, has_inline, inline = token.partition("=")
        assert flag in options, f"`toolq {subcommand}` has no option {flag}"
        param = options[flag]
        if param.is_flag or param.count:
            assert not has_inline, f"{flag} takes no value"
            continue
        raw = inline if has_inline else next(args, None)
        assert raw is not None, f"{flag} needs a value"
        value = _resolved(raw)
        if value is None:
            continue  # set at deploy time; nothing to check here
        # The option's own type accepts the value (Choice, int, ...).
        param.type.convert(value, param, None)


@pytest.mark.parametrize("name", TOOLQ_COMMANDS)
def test_the_tool_app_is_configurable(name: str) -> None:
    argv = _argv(SERVICES[name])
    app = argv[argv.index("--app") + 1]

    assert app.startswith("${TOOLQ_APP"), "the tool app comes from TOOLQ_APP"
    assert re.fullmatch(r"[\w.]+:\w+", _resolved(app) or "")


# --------------------------------------------------------------------------- Dockerfile


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines()]
    return [
        (word.upper(), rest.strip())
        for word, _, rest in (line.partition(" ") for line in lines if line and line[0] != "#")
    ]


def test_the_image_is_python_311_slim_and_installs_toolq_with_the_api() -> None:
    instructions = _instructions()
    froms = [rest for word, rest in instructions if word == "FROM"]
    args = dict(rest.partition("=")[::2] for word, rest in instructions if word == "ARG")
    runs = " ".join(rest for word, rest in instructions if word == "RUN")

    assert froms == ["python:3.11-slim"]
    assert "pip install" in runs
    assert "[${TOOLQ_EXTRAS}]" in runs and "api" in args["TOOLQ_EXTRAS"]
    assert "-e " not in runs, "an image installs the package, not an editable link"


def test_the_image_runs_as_a_non_root_user() -> None:
    users = [rest for word, rest in _instructions() if word == "USER"]

    assert users, "no USER instruction: the processes would run as root"
    assert users[-1].split(":")[0] not in {"root", "0"}


def test_the_image_holds_no_secret() -> None:
    for word, rest in _instructions():
        if word in {"ENV", "ARG"}:
            for key, _, value in (pair.partition("=") for pair in shlex.split(rest)):
                assert not (_SECRET_KEY.search(key) and value), f"{word} {key} has a value"


def test_the_build_context_leaves_out_secrets_and_local_state() -> None:
    ignored = {line.strip() for line in DOCKERIGNORE.read_text().splitlines()}

    assert {".env", ".git", ".venv"} <= ignored


@pytest.mark.parametrize("name", TOOLQ_COMMANDS)
def test_an_api_bound_beyond_loopback_gets_its_tokens_from_the_environment(name: str) -> None:
    argv = _argv(SERVICES[name])
    if argv[:2] != ["toolq", "api"]:
        return
    host = argv[argv.index("--host") + 1] if "--host" in argv else "127.0.0.1"
    if host in ("127.0.0.1", "::1", "localhost"):
        return
    tokens = _environment(SERVICES[name]).get("TOOLQ_API_TOKENS", "")
    # without tokens `toolq api` refuses a non-loopback host, so the service would never start
    assert tokens.startswith("${TOOLQ_API_TOKENS"), tokens
