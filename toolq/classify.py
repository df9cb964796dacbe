"""Public import path of :mod:`toolq.core.classify` (the module lives in its layer folder)."""

import sys

from toolq.core import classify as _real
from toolq.core.classify import *  # noqa: F403

sys.modules[__name__] = _real
