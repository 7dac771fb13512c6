"""When the edge last had work (``api.frame.activity``): every HTTP request that comes in is
noted, whatever answers it, and nothing it sends passes through the note; the edge's idle
collections (``streams.heap.collect_when_idle``) wait for quiet on both requests and records."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from fastapi.testclient import TestClient
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from api.frame.activity import LastRequest, NoteRequests
from streams.settings import VoiceSettings


def test_each_request_is_noted_when_it_comes_in_whatever_answers_it(tmp_path: Any) -> None:
    from api.app import create_app

    app = create_app(VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1",
                                   state_dir=tmp_path))
    last: LastRequest = app.state.last_request
    assert last.at == 0.0  # nothing came in yet
    client = TestClient(app, raise_server_exceptions=False)  # no lifespan, no tail
    for path, status in (("/healthz", 200), ("/no/such/route", 404)):
        before = time.monotonic()
        assert client.get(path).status_code == status
        assert before <= last.at <= time.monotonic()
    # A stream's request is taken by the stream lane, inside the note: noted all the same.
    before = time.monotonic()
    client.get("/me/conversations/cnv-1/stream", headers={"Authorization": "Bearer x"})
    assert before <= last.at <= time.monotonic()


def test_the_note_passes_the_request_through_untouched() -> None:
    seen: dict[str, Any] = {}

    async def echo(scope: Any, receive: Any, send: Any) -> None:
        seen.update(scope=scope, receive=receive, send=send)

    last = LastRequest()
    note = NoteRequests(echo, last=last)

    async def receive() -> dict[str, Any]:
        return {"type": "http.request"}

    async def send(message: Any) -> None:
        pass

    scope = {"type": "http", "path": "/"}
    asyncio.run(note(scope, receive, send))
    assert seen == {"scope": scope, "receive": receive, "send": send}  # not wrapped
    assert last.at > 0.0
    asyncio.run(note({"type": "lifespan"}, receive, send))
    at = last.at
    asyncio.run(note({"type": "lifespan"}, receive, send))
    assert last.at == at  # only HTTP requests are work


def test_a_plain_app_under_the_note_answers_as_without_it() -> None:
    async def hello(_request: Any) -> PlainTextResponse:
        return PlainTextResponse("hello", headers={"X-A": "1"})

    last = LastRequest()
    inner = Starlette(routes=[Route("/", hello)])
    with TestClient(NoteRequests(inner, last=last)) as client:
        r = client.get("/")
    assert (r.status_code, r.text, r.headers["x-a"]) == (200, "hello", "1")
    assert last.at > 0.0
