"""``/docs`` and ``/redoc`` served from the package: no CDN, so they work offline.

FastAPI's own pages load Swagger UI and ReDoc from a CDN (and fonts from
Google), so on an air-gapped machine they are blank. The same files come in
the ``fastapi-offline`` package (part of the ``api`` extra; Swagger UI is
Apache-2.0, ReDoc and the package MIT); only its static folder is used here,
served under :data:`ASSETS`. Swagger UI's online validator badge is turned off
too: it would send the document's URL to validator.swagger.io.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

#: Where the bundled assets are served.
ASSETS = "/docs/assets"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"


def assets_dir() -> Path:
    """The folder holding ``swagger-ui-bundle.js``, ``swagger-ui.css``, ReDoc and a favicon."""
    return Path(str(files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """``/docs``, ``/redoc`` and their assets, on an app made with ``docs_url=None``.

    Needs no token, like ``/openapi.json``: the document holds no secret.
    """
    folder = assets_dir()
    app.mount(ASSETS, StaticFiles(directory=folder), name="docs-assets")
    title = app.title

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title} - Swagger UI",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon.png",
            oauth2_redirect_url=OAUTH2_REDIRECT,
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(OAUTH2_REDIRECT, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=app.openapi_url or "/openapi.json",
            title=f"{title} - ReDoc",
            redoc_js_url=f"{ASSETS}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS}/favicon.png",
            with_google_fonts=False,
        )
