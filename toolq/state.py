"""The state directory ``toolq up`` writes (default ``.toolq/``): where its
server listens and which app it runs, so other commands in the same directory
find them. It also records the pid and host of that ``toolq up``: a file left
by one that was SIGKILLed names a server that is gone, and is refused with
that said, rather than a bare "cannot reach Redis"."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

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
        from toolq.errors import RequestRefused

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
