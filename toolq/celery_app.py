"""Public import path of :mod:`toolq.edges.celery_app` (the module lives in its layer folder)."""

import sys

from toolq.edges import celery_app as _real
from toolq.edges.celery_app import *  # noqa: F403

sys.modules[__name__] = _real
