"""Public import path of :mod:`toolq.edges.cli`; ``python -m toolq.cli`` runs the CLI."""

import sys

from toolq.edges import cli as _real
from toolq.edges.cli import *  # noqa: F403

if __name__ == "__main__":
    _real.main(prog_name="toolq")
else:
    sys.modules[__name__] = _real
