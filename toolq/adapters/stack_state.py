"""The state directory ``toolq up`` writes (default ``.toolq/``): where its
server listens and which app it runs, so other commands in the same directory
find them. It also records the pid and host of that ``toolq up``: a file left
by one that was SIGKILLed names a server that is gone, and is refused with
that said, rather than a bare "cannot reach Redis".

It records the deployment's **mode** too (:func:`mode_of`): the settings every
process on that ledger must share (cells, cluster, key prefix, the broker's URL
without its password). A command that finds the server here takes them where
its own settings leave them unset, and is refused where they disagree
(:func:`with_mode`): a process on another layout reads an empty ledger, and one
that publishes elsewhere sends messages no worker of the stack receives."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolq.core.redact import redact_url

if TYPE_CHECKING:
    from toolq.core.settings import ToolqSettings

DEFAULT_DIR = ".toolq"
STATE_FILE = "state.json"


def state_dir(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get("TOOLQ_STATE_DIR") or DEFAULT_DIR)


def read_state(path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    f = state_dir(path) / STATE_FILE
    try:
        data = json.loads(f.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_state(data: dict[str, Any], path: str | os.PathLike[str] | None = None) -> Path:
    d = state_dir(path)
    d.mkdir(parents=True, exist_ok=True)
    f = d / STATE_FILE
    tmp = f.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.chmod(0o600)
    tmp.replace(f)
    return f


def clear_state(path: str | os.PathLike[str] | None = None) -> None:
    (state_dir(path) / STATE_FILE).unlink(missing_ok=True)


def owner() -> dict[str, Any]:
    """What ``toolq up`` records about itself, for :func:`dead_owner` to check."""
    return {"pid": os.getpid(), "hostname": socket.gethostname()}


def dead_owner(data: dict[str, Any]) -> int | None:
    """The pid of the ``toolq up`` that wrote ``data`` if it is no longer running.

    ``None`` when it runs, or cannot be checked from here (another host, or no pid).
    """
    pid = data.get("pid")
    host = data.get("hostname")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return None
    if isinstance(host, str) and host != socket.gethostname():
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return pid
    except PermissionError:  # alive, under another user
        return None
    return pid if _zombie(pid) else None


def _zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def stale_message(path: str | os.PathLike[str] | None, pid: int, fix: str) -> str:
    f = state_dir(path) / STATE_FILE
    return f"the `toolq up` recorded in {f} (pid {pid}) is no longer running; {fix}"


def recorded_url(path: str | os.PathLike[str] | None, fix: str) -> str | None:
    """The URL a running ``toolq up`` recorded in ``path``; ``None`` if none did.

    ``RequestRefused`` (saying ``fix``) if the one that recorded it is gone.
    """
    data = read_state(path)
    url = data.get("redis_url") if data else None
    if data is None or not isinstance(url, str):
        return None
    pid = dead_owner(data)
    if pid is not None:
        # Imported here: the envelope's models cost `toolq status` ~50 ms at start-up.
        from toolq.core.errors import RequestRefused

        raise RequestRefused(stale_message(path, pid, fix))
    return url


def discover_redis_url(path: str | os.PathLike[str] | None = None) -> str | None:
    """``TOOLQ_REDIS_URL``, else the URL a running ``toolq up`` recorded here.

    ``RequestRefused`` if the ``toolq up`` that recorded it is no longer running.
    """
    env = os.environ.get("TOOLQ_REDIS_URL")
    if env:
        return env
    return recorded_url(path, "start it again, or pass redis_url= or set TOOLQ_REDIS_URL")


def mode_of(settings: ToolqSettings) -> dict[str, Any]:
    """The settings every process of this deployment must share, as recorded (the
    broker's URL redacted: the file holds no password)."""
    broker = settings.broker_url.get_secret_value() if settings.broker_url else None
    return {
        "cells": settings.cells,
        "cluster": settings.cluster,
        "prefix": settings.prefix,
        "broker": redact_url(broker) if broker else None,
        "durability": settings.durability,
    }


def recorded_mode(path: str | os.PathLike[str] | None = None) -> dict[str, Any] | None:
    """The mode a ``toolq up`` recorded in ``path`` (None: none, or an older toolq's file)."""
    data = read_state(path)
    mode = data.get("mode") if data else None
    return mode if isinstance(mode, dict) else None


#: Fields of the mode a process takes when its settings leave them unset, and must
#: not set otherwise: (setting, environment variable).
_SHARED = (("cells", "TOOLQ_CELLS"), ("cluster", "TOOLQ_CLUSTER"), ("prefix", "TOOLQ_PREFIX"))


def with_mode(
    settings: ToolqSettings,
    mode: dict[str, Any] | None,
    *,
    publishes: bool = True,
    path: str | os.PathLike[str] | None = None,
) -> ToolqSettings:
    """``settings`` with the recorded ``mode`` where they leave it unset (not set in the
    environment nor given); ``errors.RequestRefused``, in one sentence, where they set it
    otherwise, or where the stack publishes through a broker and this process would
    publish (``publishes``) without its URL, which the file cannot give (no password).

    A read-only process (``publishes=False``) without the broker's URL gets the rest."""
    if not mode:
        return settings
    where = f"the `toolq up` recorded in {state_dir(path) / STATE_FILE}"
    given = settings.model_fields_set
    update: dict[str, Any] = {}
    for name, var in _SHARED:
        theirs = mode.get(name, getattr(settings, name))
        mine = getattr(settings, name)
        if name not in given:
            update[name] = theirs
        elif mine != theirs:
            fix = f"unset {var}" if theirs in (None, False) else f"set {var}={_show(theirs)}"
            return _refuse(
                f"this command's {var}={_show(mine)} disagrees with {where} "
                f"({var}={_show(theirs)}): {fix}"
            )
    if "durability" not in given and mode.get("durability") in ("fsync", "none"):
        update["durability"] = mode["durability"]
    theirs_broker = mode.get("broker")
    mine_broker = settings.broker_url.get_secret_value() if settings.broker_url else None
    if mine_broker is None and theirs_broker and publishes:
        return _refuse(
            f"{where} publishes through a broker: set TOOLQ_BROKER_URL to the broker "
            f"{theirs_broker} (its password is not recorded)"
        )
    if mine_broker is not None and theirs_broker is None:
        return _refuse(
            f"this command's TOOLQ_BROKER_URL disagrees with {where}, whose ledger is its "
            "own broker: unset TOOLQ_BROKER_URL"
        )
    if mine_broker is not None and redact_url(mine_broker) != theirs_broker:
        return _refuse(
            f"this command's TOOLQ_BROKER_URL ({redact_url(mine_broker)}) disagrees with "
            f"{where}: set TOOLQ_BROKER_URL to the broker {theirs_broker}"
        )
    return settings.model_copy(update=update) if update else settings


def _show(value: object) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _refuse(message: str) -> ToolqSettings:
    # Imported here: the envelope's models cost `toolq status` ~50 ms at start-up.
    from toolq.core.errors import RequestRefused

    raise RequestRefused(message)
