"""The edge's server options: httptools and uvloop by default, a clean fallback when either is
missing, and h11's bound on a request head kept under httptools (``deploy.edge_server``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn

from deploy import edge_server
from deploy.edge_server import HEAD_LIMIT_BYTES, server_options
from streams.settings import VoiceSettings


async def _ok(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"ok"})


@contextlib.asynccontextmanager
async def serving(settings: VoiceSettings, app: Any = _ok) -> AsyncIterator[int]:
    """A uvicorn server for ``app`` (a plain 200 unless given) on the edge's options from
    ``settings`` (in this test's loop); its port."""
    options = server_options(settings)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error",
                                           http=options["http"],
                                           timeout_keep_alive=options["timeout_keep_alive"]))
    task = asyncio.create_task(server.serve())
    deadline = asyncio.get_running_loop().time() + 30
    while not server.started:
        assert asyncio.get_running_loop().time() < deadline, "server did not start"
        await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def port() -> AsyncIterator[int]:
    """A uvicorn server on the edge's default options (in this test's loop)."""
    async with serving(VoiceSettings()) as p:
        yield p


GET = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


async def _idle_then_ask(port: int, idle_s: float) -> tuple[bytes, bytes]:
    """Two requests on one connection, ``idle_s`` apart: the two answers' first bytes (b""
    for the second when the server closed the connection meanwhile)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(GET)
        first = await asyncio.wait_for(reader.readuntil(b"\r\n0\r\n\r\n"), 30)  # chunked
        await asyncio.sleep(idle_s)
        try:
            writer.write(GET)
            await writer.drain()
            second = await asyncio.wait_for(reader.read(200), 30)
        except ConnectionError:
            second = b""
        return first, second
    finally:
        writer.close()


async def test_an_idle_connection_outlives_a_clients_five_second_pool() -> None:
    """Regression: uvicorn's default keep-alive (5 s) equalled httpx's pool expiry (5 s), so the
    edge closed connections just as the bench's client sent a request on them (``ReadError``,
    a reset). The edge keeps an idle connection 75 s by default."""
    async with serving(VoiceSettings()) as p:
        first, second = await _idle_then_ask(p, 6.0)
    assert first.startswith(b"HTTP/1.1 200") and second.startswith(b"HTTP/1.1 200")


async def test_the_keep_alive_is_the_settings() -> None:
    async with serving(VoiceSettings(edge_keep_alive_s=1)) as p:
        first, second = await _idle_then_ask(p, 2.5)
    assert first.startswith(b"HTTP/1.1 200") and second == b""


async def _ask(port: int, head: bytes, trickle: int = 0) -> bytes:
    """Send ``head`` (in ``trickle``-byte writes when given); the answer's first bytes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        step = trickle or len(head)
        for i in range(0, len(head), step):
            writer.write(head[i:i + step])
            try:
                await writer.drain()
            except ConnectionError:
                break
        return await asyncio.wait_for(reader.read(200), 30)
    finally:
        writer.close()


def test_defaults_are_httptools_and_uvloop() -> None:
    options = server_options(VoiceSettings())
    assert options["loop"] == "uvloop"
    assert options["http"].__name__ == "BoundedHttpTools"


def test_h11_and_asyncio_when_asked() -> None:
    assert server_options(VoiceSettings(edge_http="h11", edge_loop="asyncio")) == {
        "http": "h11", "loop": "asyncio", "timeout_keep_alive": 75.0}


def test_falls_back_when_not_installed(monkeypatch: pytest.MonkeyPatch,
                                       caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(edge_server, "_installed", lambda module: False)
    assert server_options(VoiceSettings()) == {"http": "h11", "loop": "asyncio",
                                               "timeout_keep_alive": 75.0}
    assert "httptools is not installed" in caplog.text
    assert "uvloop is not installed" in caplog.text


def test_refuses_an_unknown_server() -> None:
    with pytest.raises(ValueError, match="edge_http"):
        VoiceSettings(edge_http="zttp")  # type: ignore[arg-type]


async def test_a_head_within_the_bound_is_served(port: int) -> None:
    head = (b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (HEAD_LIMIT_BYTES - 100)
            + b"\r\n\r\n")
    assert (await _ask(port, head, trickle=1024)).startswith(b"HTTP/1.1 200")


async def test_a_head_past_the_bound_answers_431(port: int) -> None:
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (4 * HEAD_LIMIT_BYTES) + b"\r\n\r\n"
    answer = await _ask(port, head)
    assert answer.startswith(b"HTTP/1.1 431"), answer
    assert str(HEAD_LIMIT_BYTES).encode() in answer


async def test_a_head_that_never_ends_answers_431(port: int) -> None:
    # httptools alone buffers a header of any size (a 50 MiB one was read whole); this one
    # never ends, so only the bytes read so far can refuse it.
    head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * (4 * HEAD_LIMIT_BYTES)
    answer = await _ask(port, head, trickle=1024)
    assert answer.startswith(b"HTTP/1.1 431"), answer


async def test_a_long_url_counts_too(port: int) -> None:
    head = b"GET /" + b"a" * (2 * HEAD_LIMIT_BYTES) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
    assert (await _ask(port, head)).startswith(b"HTTP/1.1 431")


async def test_requests_after_the_first_on_one_connection(port: int) -> None:
    """Each request's head is bounded by itself, not with those before it on the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        pad = b"a" * (HEAD_LIMIT_BYTES // 2)
        for _ in range(4):  # 4 × half the bound on one keep-alive connection
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + pad + b"\r\n\r\n")
            await writer.drain()
            status = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
            assert status.startswith(b"HTTP/1.1 200"), status
            body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 30)
            assert b"ok" in body
    finally:
        writer.close()
