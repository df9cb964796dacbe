"""The configuration toolq asks of an embedded Valkey, and the URLs it is reached by
(pure: tested without a server)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from toolq.core.redact import redact_url

HOST = "127.0.0.1"
_UNIX_SCHEMES = frozenset({"unix", "redis+unix", "valkey+unix"})
#: ``always`` (the default): every reply follows its fsync, so a power loss undoes
#: nothing a client was told; ``everysec`` can lose about the last second.
APPENDFSYNC = ("always", "everysec", "no")


class RedactedUrl(str):
    """A URL whose ``repr`` hides the password.

    ``str()`` is the real URL, for clients; ``repr()`` is what tracebacks,
    pytest's failure reports and ``%r`` log lines show.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(redact_url(str(self)))


def url_for_db(url: str, db: int) -> RedactedUrl:
    """``url`` with its database number replaced by ``db``.

    TCP URLs carry the database as the path (``redis://host:port/3``); unix
    socket URLs carry it as the ``db`` query parameter. Credentials, query and
    fragment are kept as they are.
    """
    if db < 0:
        raise ValueError(f"database number must be >= 0, got {db}")
    parts = urlsplit(url)
    if parts.scheme in _UNIX_SCHEMES:
        query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "db"]
        query.append(("db", str(db)))
        # Built by hand: urlunsplit drops the empty netloc ("unix:/path").
        fragment = f"#{parts.fragment}" if parts.fragment else ""
        return RedactedUrl(
            f"{parts.scheme}://{parts.netloc}{parts.path}?{urlencode(query)}{fragment}"
        )
    return RedactedUrl(urlunsplit(parts._replace(path=f"/{db}")))


def _quote_config(value: str) -> str:
    """A config-file string literal (valkey's sdssplitargs understands these escapes)."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def render_config(
    *,
    port: int,
    data_dir: Path,
    appendonly: bool = True,
    appendfsync: str = "always",
    databases: int = 16,
    password: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> str:
    """The valkey.conf text for an embedded server. Pure: tested without a server."""
    if databases < 1:
        raise ValueError(f"databases must be >= 1, got {databases}")
    if appendfsync not in APPENDFSYNC:
        raise ValueError(f"appendfsync must be one of {', '.join(APPENDFSYNC)}: {appendfsync!r}")
    lines = [
        "# Written by toolq.adapters.embedded; rewritten on every start.",
        f"port {port}",
        f"bind {HOST}",
        # Loopback only, so protected mode never refuses a client we want; it
        # stays on as a second guard should the bind ever be widened.
        "protected-mode yes",
        "daemonize no",
        f"dir {_quote_config(str(data_dir))}",
        # Empty logfile = stdout, which the spawner sends to valkey.log in data_dir.
        'logfile ""',
        "loglevel notice",
        f"databases {databases}",
        "maxmemory-policy noeviction",
        'save ""',
    ]
    if appendonly:
        lines += ["appendonly yes", f"appendfsync {appendfsync}"]
    else:
        lines += ["appendonly no"]
    if password is not None:
        lines.append(f"requirepass {_quote_config(password)}")
    for key, value in (extra or {}).items():
        if any(c in f"{key}{value}" for c in "\r\n"):
            raise ValueError(f"config entry {key!r} spans lines")
        lines.append(f"{key} {value}")
    return "\n".join(lines) + "\n"
