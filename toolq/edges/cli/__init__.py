"""The ``toolq`` command line: one thin layer over the Python API.

Every command takes ``--app MODULE:ATTR`` (or ``TOOLQ_APP``) to find the
tools, and ``--redis-url`` (or ``TOOLQ_REDIS_URL``, or the state directory
that ``toolq up`` writes) to find the server. Each area of commands lives in
its own module and registers itself here, when first needed: ``toolq status``
imports only its own module (Celery, FastAPI and the rest cost ~0.4 s of
imports it does not need; it answers in under 0.3 s); so does ``toolq show``.
"""

from __future__ import annotations

import importlib

import click

from toolq.core.settings import settings_problem

#: Where each area of commands lives (``toolq.edges.cli.<name>``, its ``COMMANDS``).
MODULES = (
    "processes",
    "operations",
    "monitor",
    "stack",
    "interfaces",
    "cells",
    "ledger",
    "lists",
    "deps",
)
#: Commands that load only their own module; any other name loads every module.
QUICK = {"status": "monitor", "show": "operations"}


class _Commands(click.Group):
    """A group whose commands are imported when first asked for."""

    _loaded: set[str]
    _known: dict[str, click.Command]

    @property  # type: ignore[override]
    def commands(self) -> dict[str, click.Command]:
        """Every command (``main.commands``: tests and doc tools see them all)."""
        self._load(*MODULES)
        return self._known

    @commands.setter
    def commands(self, value: dict[str, click.Command]) -> None:
        self._known = dict(value)
        self._loaded = set()

    def _load(self, *modules: str) -> None:
        for name in modules:
            if name not in self._loaded:
                self._loaded.add(name)
                module = importlib.import_module(f"toolq.edges.cli.{name}")
                for command in module.COMMANDS:
                    self.add_command(command)

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        name = name or cmd.name
        if name is None:
            raise TypeError("Command has no name.")
        self._known[name] = cmd

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        self._load(*([QUICK[cmd_name]] if cmd_name in QUICK else MODULES))
        return self._known.get(cmd_name)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(self.commands)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except Exception as exc:
            problem = settings_problem(exc)
            if problem is not None:
                raise click.ClickException(problem) from None
            raise


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolq")
def main() -> None:
    """toolq: run AI-agent tool calls through queues, safe to recover from.

    \b
    Start everything locally:     toolq up
    See it work (and misbehave):  toolq demo
    Watch pending recovery:       toolq status --watch
    """
