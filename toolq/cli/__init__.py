"""The ``toolq`` command line: one thin layer over the Python API.

Every command takes ``--app MODULE:ATTR`` (or ``TOOLQ_APP``) to find the
tools, and ``--redis-url`` (or ``TOOLQ_REDIS_URL``, or the state directory
that ``toolq up`` writes) to find the server. Each area of commands lives in
its own module and registers itself here.
"""

from __future__ import annotations

import importlib

import click


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="toolq")
def main() -> None:
    """toolq: run AI-agent tool calls through queues, safe to recover from.

    \b
    Start everything locally:     toolq up
    See it work (and misbehave):  toolq demo
    Watch pending recovery:       toolq status --watch
    """


for _module in ("processes", "operations", "monitor", "stack", "interfaces"):
    try:
        _mod = importlib.import_module(f"toolq.cli.{_module}")
    except ModuleNotFoundError as _exc:  # an area still being written
        if _exc.name != f"toolq.cli.{_module}":
            raise
        continue
    for _cmd in getattr(_mod, "COMMANDS", ()):
        main.add_command(_cmd)
