"""What every command shares: finding the app and the server, and failing in one line."""

from __future__ import annotations

import functools
import json
import logging
import math
import re
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import click
import redis

from toolq.adapters.stack_state import read_state, recorded_mode, recorded_url, with_mode
from toolq.core.redact import CREDENTIALS_ADVICE, redact_url

if TYPE_CHECKING:
    from toolq.core.errors import RequestRefused

F = TypeVar("F", bound=Callable[..., Any])

DEFAULT_APP = "toolq.examples.invoices:tq"


def raised(name: str) -> tuple[type[BaseException], ...]:
    """``toolq.core.errors.<name>`` to catch, if that module is loaded; else nothing to catch.

    No toolq error can have been raised before the module was imported, and not
    importing it (the envelope's pydantic models) keeps ~50 ms off ``toolq status``.
    """
    errors = sys.modules.get("toolq.core.errors")
    return (getattr(errors, name),) if errors is not None else ()


#: What redis-py's Cluster clients raise with a node away, beside ConnectionError and
#: TimeoutError (toolq.adapters.outage.CLUSTER_UNREACHABLE, without importing toolq.core.errors
#: here).
CLUSTER_AWAY: tuple[type[Exception], ...] = (
    redis.exceptions.RedisClusterException,
    redis.exceptions.ClusterError,
)
#: A server (a Cluster's node) away: what a long-running process starting waits out.
AWAY: tuple[type[Exception], ...] = (redis.ConnectionError, redis.TimeoutError, *CLUSTER_AWAY)
#: Any failure of a check of the server, away or answering with an error.
FAILED: tuple[type[Exception], ...] = (redis.RedisError, *CLUSTER_AWAY)


def unreachable_line(url: str | None, exc: BaseException, cluster: bool) -> str | None:
    """The line for a server (a Cluster's node) that is away; None if ``exc`` is not that."""
    from toolq.adapters.outage import message, unreachable

    return message(url or "", exc, cluster=cluster) if unreachable(exc) else None


def server_said(url: str | None, exc: BaseException, away: str = "") -> str:
    """The line for a first command that failed: away ("cannot reach", then ``away``:
    what the command adds about an outage), or refused by the server, in its words
    (``DB index is out of range``), scrubbed."""
    where = redact_url(url or "")
    if isinstance(exc, redis.AuthenticationError):  # a ConnectionError to redis-py
        return (
            f"the server at {where} refused the URL's credentials ({type(exc).__name__}): "
            f"{CREDENTIALS_ADVICE}"
        )
    if isinstance(exc, AWAY):
        from toolq.adapters.outage import tls_hint

        return f"cannot reach Redis at {where}: {type(exc).__name__}{away}{tls_hint(url, exc)}"
    return f"the server at {where} refused toolq's first command: {refusal(exc)}"


def refusal(exc: BaseException) -> str:
    """``ResponseError: <the server's words>``: one line, no credential, bounded."""
    from toolq.core.redact import scrub

    said = scrub(str(exc))[:200]
    return f"{type(exc).__name__}: {said}" if said else type(exc).__name__


class CliError(click.ClickException):
    """One clear line on stderr and a non-zero exit (2 unless told)."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        # click declares exit_code a class variable; this instance differs.
        vars(self)["exit_code"] = exit_code


def app_option(f: F) -> F:
    return click.option(
        "--app",
        "app_path",
        envvar="TOOLQ_APP",
        default=None,
        metavar="MODULE:ATTR",
        help="Where the ToolQueue is (env TOOLQ_APP; else the app `toolq up` recorded here; "
        f"else {DEFAULT_APP}).",
    )(f)


class Seconds(click.FloatRange):
    """A number of seconds between bounds. click's FloatRange lets ``nan`` through (it
    compares false to both bounds): a wait of nan seconds returned at once, a watch
    slept nan seconds (a traceback)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = super().convert(value, param, ctx)
        if math.isnan(seconds):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return seconds


#: What ``--loglevel`` takes, in any case: a typo is a usage error, not a traceback.
LOGLEVEL = click.Choice(["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"], case_sensitive=False)


def redis_option(f: F) -> F:
    return click.option(
        "--redis-url",
        envvar="TOOLQ_REDIS_URL",
        default=None,
        metavar="URL",
        help="Redis/Valkey URL (env TOOLQ_REDIS_URL; else the server `toolq up` recorded in "
        "--state-dir).",
    )(f)


def _prefix(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    from toolq.core.settings import PREFIX_PATTERN

    if not re.fullmatch(PREFIX_PATTERN, value):
        raise click.BadParameter("1 to 64 letters, digits, '_', '.' or '-'")
    return value


#: The ledger's key prefix, for the commands that read it without the app (``migrate``,
#: ``cells``): the settings' own pattern.
prefix_option = click.option(
    "--prefix",
    envvar="TOOLQ_PREFIX",
    default="toolq",
    show_default=True,
    callback=_prefix,
    help="The ledger's key prefix (env TOOLQ_PREFIX).",
)


def state_dir_option(f: F) -> F:
    return click.option(
        "--state-dir",
        envvar="TOOLQ_STATE_DIR",
        default=".toolq",
        show_default=True,
        type=click.Path(file_okay=False, path_type=Path),
        help="Where `toolq up` records the server URL and app path.",
    )(f)


def bindable(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now. With SO_REUSEADDR, as uvicorn
    and the metrics server bind theirs: the TIME_WAIT connections a crash (or a browser
    tab) leaves on the port do not count, a socket listening there still does."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_port(host: str, port: int, what: str) -> None:
    """One line, before anything starts, if ``port`` is taken: uvicorn's own is an ERROR
    line and exit 3 once the app and its connections are made."""
    if not bindable(host, port):
        raise CliError(f"port {port} on {host} is in use ({what}): pass --port with another one")


#: No URL anywhere: the CLI's words (the library's name ``redis_url=``).
NO_URL = "no Redis URL: pass --redis-url, set TOOLQ_REDIS_URL, or run `toolq up` in this directory"


def resolve_url(redis_url: str | None, state_dir: Path | None) -> str | None:
    """``--redis-url``, else what a running ``toolq up`` recorded in ``state_dir``.

    One line naming the state file if the ``toolq up`` that recorded it is gone; one
    line (invalid settings, password redacted) for a malformed URL, which redis-py
    refuses only at its first connection, with a traceback.
    """
    if redis_url:
        url: str | None = redis_url
    else:
        try:
            url = recorded_url(state_dir, "start it again or pass --redis-url")
        except raised("RequestRefused") as exc:
            raise CliError(cast("RequestRefused", exc).message) from None
    if url:
        from toolq.core.settings import ToolqSettings

        ToolqSettings(redis_url=url)
    return url


def resolve_app_path(app_path: str | None, state_dir: Path | None) -> str:
    if app_path:
        return app_path
    data = read_state(state_dir)
    recorded = data.get("app") if data else None
    return recorded if isinstance(recorded, str) else DEFAULT_APP


def load_app(app_path: str, redis_url: str | None = None) -> Any:
    """Import ``MODULE:ATTR`` and return the ToolQueue, pointed at ``redis_url`` if given."""
    from toolq.edges.loader import load_app as load

    try:
        return load(app_path, redis_url)
    except raised("ToolqError") as exc:
        raise CliError(str(exc)) from None


def open_app(
    app_path: str | None,
    redis_url: str | None,
    state_dir: Path | None,
    *,
    publishes: bool = True,
    away: str = "exit",
) -> Any:
    """Load the app and check the server answers; one clear line if it does not.

    A server found in ``state_dir`` brings the mode its ``toolq up`` recorded
    (:func:`toolq.adapters.stack_state.with_mode`; ``publishes``: whether this command may send
    messages, and so needs the broker's URL). The ledger's number of cells is checked
    against the app's: on another layout every read would answer "nothing".

    ``away`` is what a server that does not answer means: ``exit`` (a command: one
    line, exit 2), ``wait`` (a long-running process that needs it: wait for it, one
    line when the wait starts and one when it ends), ``serve`` (the API, the MCP
    server: start anyway, say so once; requests answer QUEUE_UNAVAILABLE meanwhile).
    """
    url = resolve_url(redis_url, state_dir)
    tq = load_app(resolve_app_path(app_path, state_dir), url)
    if url is None and tq.settings.redis_url is None:  # nor one the app module set
        raise CliError(NO_URL)
    if url and not redis_url:
        tq.app.adopt(recorded_settings(tq.settings, state_dir, publishes=publishes))
    while True:
        if away == "wait":
            wait_for_server(tq)
        try:
            tq.redis.ping()
            if not tq.app.ledger.cells_checked:
                tq.app.ledger.record_cells()
            return tq
        except raised("RequestRefused") as exc:
            raise CliError(cast("RequestRefused", exc).message) from None
        except FAILED as exc:
            if away == "wait" and isinstance(exc, AWAY):  # gone between the wait and the check
                continue
            if away == "serve":
                _start_log().warning(
                    "the ledger's server at %s does not answer (%s); serving anyway: requests "
                    "answer 503 QUEUE_UNAVAILABLE until it does",
                    redact_url(tq.redis_url),
                    type(exc).__name__,
                )
                return tq
            raise CliError(server_said(tq.redis_url, exc)) from None


def ledger_client(redis_url: str | None, state_dir: Path | None) -> tuple[Any, Any, Any, str]:
    """The settings (from TOOLQ_* and the mode a ``toolq up`` recorded in ``state_dir``),
    the topology they choose, a plain client on the ledger's server and its URL, without
    importing the app (nor Celery). Nothing is sent yet: :func:`check_meta` is the first
    read."""
    from toolq.core.settings import ToolqSettings
    from toolq.topology import topology_for

    settings = ToolqSettings()  # a bad TOOLQ_* said first, URL or not
    url = resolve_url(redis_url, state_dir)
    if url is None:
        raise CliError(NO_URL)
    settings = ToolqSettings(redis_url=url)
    if not redis_url:  # the server `toolq up` recorded: its mode too
        settings = recorded_settings(settings, state_dir, publishes=False)
    topology = topology_for(settings)
    # On a Cluster a node answers MOVED for the cells it does not serve: the cluster
    # client (the ledger's, which reads FCALL's keys itself) sends each its own.
    client = topology.make_redis(url, {"socket_connect_timeout": 5, "socket_timeout": 30})
    return settings, topology, client, url


def check_meta(topology: Any, client: Any) -> None:
    """Read the ledger's meta and refuse (CliError) a ledger on another number of cells
    or in another stored format (every read would answer "nothing"); an empty ledger is
    stamped with today's format, as any process's first use does."""
    from toolq.adapters.ledger.stored_format import format_checked
    from toolq.core.errors import LedgerFormat
    from toolq.decisions.formats import FORMAT_FIELD

    root = topology.layout.root
    cells, stored = client.hmget(root.meta, ["cells", FORMAT_FIELD])
    why = topology.layout.conflict(cells)
    if why is not None:
        raise CliError(why)
    try:
        format_checked(client, root.prefix, stored)
    except LedgerFormat as exc:
        raise CliError(exc.message) from None


def open_ledger(redis_url: str | None, state_dir: Path | None) -> tuple[Any, Any]:
    """The ledger's settings-chosen topology and a plain client on its server, without
    importing the app (nor Celery): what the read-only commands that need no tool
    (``toolq show``) answer with in well under a second; a ledger on another number
    of cells or in another format is refused (:func:`check_meta`)."""
    _, topology, client, url = ledger_client(redis_url, state_dir)
    try:
        check_meta(topology, client)
    except FAILED as exc:
        line = unreachable_line(url, exc, cluster=isinstance(exc, CLUSTER_AWAY))
        raise CliError(line or server_said(url, exc)) from None
    return topology, client


def recorded_settings(settings: Any, state_dir: Path | None, *, publishes: bool) -> Any:
    """``settings`` with the mode the ``toolq up`` in ``state_dir`` recorded; one line
    where they disagree (:func:`toolq.adapters.stack_state.with_mode`)."""
    from toolq.core.errors import RequestRefused

    try:
        return with_mode(settings, recorded_mode(state_dir), publishes=publishes, path=state_dir)
    except RequestRefused as exc:
        raise CliError(exc.message) from None


def wait_for_server(tq: Any) -> None:
    """Ping until the server answers, with a capped backoff (:mod:`toolq.process.waiting`):
    a long-running process started while it is away waits instead of exiting."""
    from toolq.adapters.outage import TLS_ADVICE, tls_hint
    from toolq.process.waiting import Outage, Waiter

    def advice(exc: BaseException) -> str:
        return TLS_ADVICE if tls_hint(tq.redis_url, exc) else ""

    where = f"the ledger's server at {redact_url(tq.redis_url)}"
    waiter = Waiter(Outage(where), _start_log(), advice=advice)
    while True:
        try:
            tq.redis.ping()
        except raised("RequestRefused") as exc:  # no URL, a refused setting: said at once
            raise CliError(cast("RequestRefused", exc).message) from None
        except AWAY as exc:
            waiter.failed(exc)
            continue
        waiter.answered()
        return


def _start_log() -> logging.Logger:
    """The logger of a process starting. Before any logging is set up (a worker sets
    Celery's up later) its lines go to stderr on a handler of its own."""
    log = logging.getLogger("toolq.start")
    if not logging.getLogger().handlers and not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(asctime)s: %(levelname)s/%(name)s] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False
    return log


def parse_json_args(text: str, option: str = "--args") -> Any:
    try:
        return json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError as exc:
        raise CliError(f"{option} is not valid JSON: {exc.msg} at position {exc.pos}") from None
    except RecursionError:  # json's C decoder recurses per level: '[' * 100000
        raise CliError(f"{option} is nested too deeply to be read") from None
    except ValueError as exc:  # _not_json's
        raise CliError(f"{option} is not valid JSON: {exc}") from None


def _not_json(name: str) -> Any:
    """Python's json reads NaN, Infinity and -Infinity; JSON has none of them."""
    raise ValueError(f"{name} is not a JSON number")


def handle_errors(f: F) -> F:
    """Turn toolq's refusals and Redis failures into one line and a non-zero exit."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return f(*args, **kwargs)
        except click.ClickException:
            raise
        except raised("RequestRefused") as exc:
            refused = cast("RequestRefused", exc)
            fields = getattr(refused, "field_errors", None) or []
            detail = "; ".join(f"{fe.field}: {fe.rule}" for fe in fields[:5])
            raise CliError(
                f"{refused.code}: {refused.message}" + (f" ({detail})" if detail else "")
            ) from None
        except raised("ToolqError") as exc:
            raise CliError(str(exc)) from None
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            from toolq.adapters.outage import tls_hint

            raise CliError(
                f"cannot reach Redis/Valkey ({type(exc).__name__}): check --redis-url "
                "(or TOOLQ_REDIS_URL) and that the server is up"
                f"{tls_hint(kwargs.get('redis_url'), exc)}"
            ) from None
        except CLUSTER_AWAY as exc:  # a RedisClusterException is no RedisError
            # --redis-url reads TOOLQ_REDIS_URL too: the seeds, when not the node's
            line = unreachable_line(kwargs.get("redis_url"), exc, cluster=True)
            if line is None:
                raise
            raise CliError(line) from None
        except redis.RedisError as exc:
            raise CliError(f"redis error: {refusal(exc)}") from None

    return wrapper  # type: ignore[return-value]


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))
