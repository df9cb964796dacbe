"""Public import path of :mod:`toolq.client.queue` (the module lives in its layer folder)."""

import sys

from toolq.client import queue as _real
from toolq.client.queue import *  # noqa: F403

sys.modules[__name__] = _real
