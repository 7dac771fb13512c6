"""The page routes and the static files: each page is one HTML file whose script modules (under
``/static``) call the API. The pages themselves need no token (they hold no data); every call
they make does. Kept out of the OpenAPI document: they are not API operations.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from starlette.staticfiles import StaticFiles

from api.web.signin import WebConfig, dev_signin_allowed, dev_signin_router, web_config
from streams.settings import VoiceSettings

STATIC = Path(__file__).parent / "static"
"""The files the edge serves under ``/static`` (no build step: plain JavaScript modules)."""

PAGES = {"/": "index.html", "/assistant": "assistant.html", "/staff": "staff.html"}
"""Each page's path and its file under ``STATIC``."""

PAGE_HEADERS = {
    "Cache-Control": "no-cache",
    # Only this origin's scripts, styles and connections: the token a page holds can reach no
    # other origin, and no injected inline script or style runs. No Referer leaves a page.
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; "
                               "style-src 'self'; frame-ancestors 'none'; base-uri 'none'",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def _page(name: str) -> Callable[[], Awaitable[FileResponse]]:
    """The handler serving the page file ``name``."""

    async def page() -> FileResponse:
        return FileResponse(STATIC / name, media_type="text/html", headers=PAGE_HEADERS)

    page.__name__ = f"page_{name.split('.')[0]}"
    page.__doc__ = f"The {name} page."
    return page


def install_web(app: FastAPI, settings: VoiceSettings, bind_host: str | None) -> None:
    """Serve the pages and their files on ``app``; add the dev sign-in route only when
    ``dev_signin_allowed(settings, bind_host)``."""
    for path, name in PAGES.items():
        app.add_api_route(path, _page(name), methods=["GET"], include_in_schema=False,
                          response_class=FileResponse)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")
    allowed = dev_signin_allowed(settings, bind_host)
    # Added on the app itself, not through a router, so the app's own route list names it
    # (the authorization matrix checks every route the edge serves has a row).
    app.add_api_route("/web/config", web_config(allowed), methods=["GET"],
                      include_in_schema=False, response_model=WebConfig)
    if allowed:
        app.include_router(dev_signin_router(settings))
