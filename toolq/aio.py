"""Public import path of :mod:`toolq.client.aio` (the module lives in its layer folder)."""

import sys

from toolq.client import aio as _real
from toolq.client.aio import *  # noqa: F403

sys.modules[__name__] = _real
