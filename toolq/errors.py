"""Public import path of :mod:`toolq.core.errors` (the module lives in its layer folder)."""

import sys

from toolq.core import errors as _real
from toolq.core.errors import *  # noqa: F403

sys.modules[__name__] = _real
