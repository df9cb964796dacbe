"""Public import path of :mod:`toolq.core.envelope` (the module lives in its layer folder)."""

import sys

from toolq.core import envelope as _real
from toolq.core.envelope import *  # noqa: F403

sys.modules[__name__] = _real
