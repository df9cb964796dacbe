"""The ``toolq`` command line: one thin layer over the Python API.

Every command takes ``--app MODULE:ATTR`` (or ``TOOLQ_APP``) to find the
tools, and ``--redis-url`` (or ``TOOLQ_REDIS_URL``, or the state directory
that ``toolq up`` writes) to find the server. Each area of commands lives in
its own module and registers itself here.
"""

from __future__ import annotations

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


def _register() -> None:
    from toolq.cli import interfaces, monitor, operations, processes, stack

    for module in (processes, operations, monitor, stack, interfaces):
        for command in module.COMMANDS:
            main.add_command(command)


_register()
