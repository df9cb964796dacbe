"""The state directory ``toolq up`` writes (default ``.toolq/``): where its
server listens and which app it runs, so other commands in the same directory
find them."""

from __future__ import annotations

import json
import os
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


def discover_redis_url(path: str | os.PathLike[str] | None = None) -> str | None:
    """``TOOLQ_REDIS_URL``, else the URL a running ``toolq up`` recorded here."""
    env = os.environ.get("TOOLQ_REDIS_URL")
    if env:
        return env
    data = read_state(path)
    url = data.get("redis_url") if data else None
    return url if isinstance(url, str) else None
