"""Public import path of :mod:`toolq.edges.stack` (the module lives in its layer folder)."""

import sys

from toolq.edges import stack as _real
from toolq.edges.stack import *  # noqa: F403

sys.modules[__name__] = _real
