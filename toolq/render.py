"""Public import path of :mod:`toolq.core.render` (the module lives in its layer folder)."""

import sys

from toolq.core import render as _real
from toolq.core.render import *  # noqa: F403

sys.modules[__name__] = _real
