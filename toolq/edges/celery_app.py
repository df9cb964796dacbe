"""``toolq.celery_app:celery_app`` for Flower and ``celery inspect``.

The app named by ``TOOLQ_APP`` when set (its tools registered), else a bare
app on ``TOOLQ_REDIS_URL``: enough for Flower, which only reads events::

    TOOLQ_APP=myapp:tq TOOLQ_REDIS_URL=redis://127.0.0.1:6379/0 \
        celery -A toolq.celery_app:celery_app flower --address=127.0.0.1

(what ``toolq flower`` runs). Celery's ``-A`` takes ``module:attribute``, one
name: ``-A myapp:tq.celery`` cannot work, hence this module.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name != "celery_app":
        raise AttributeError(name)
    import os

    app_path = os.environ.get("TOOLQ_APP")
    if app_path:
        from toolq.edges.loader import load_app

        return load_app(app_path, os.environ.get("TOOLQ_REDIS_URL")).celery
    from toolq.adapters.broker.app import make_celery
    from toolq.core.settings import ToolqSettings

    settings = ToolqSettings()
    return make_celery(settings, url=settings.url if settings.redis_url else None)
