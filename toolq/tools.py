"""Public import path of :mod:`toolq.core.tools` (the module lives in its layer folder)."""

import sys

from toolq.core import tools as _real
from toolq.core.tools import *  # noqa: F403

sys.modules[__name__] = _real
