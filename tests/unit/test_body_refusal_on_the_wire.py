"""A body over its limit, refused on a real server (uvicorn on the edge's options): the client
reads the 413 even while it is still writing the body (``api.frame.body``).

Regression: the 413 was sent the moment the limit was passed and the connection closed with
the rest of the body unread, so the kernel answered the client's next bytes with a reset and a
client still writing (httpx, curl without ``Expect``) could meet the reset before it read the
413 — ``httpx.ReadError`` instead of the answer, now and then, on a running stack.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from starlette.types import Receive, Scope, Send

from api.frame.body import LINGER_BYTES, LINGER_S, BodyGuard, BodyLimit
from streams.settings import VoiceSettings
from tests.unit.test_edge_server import serving

LIMIT = 64 * 1024
DETAIL = b"larger than 65536 bytes (VOICE_MAX_BODY_BYTES)"


async def _sized(scope: Scope, receive: Receive, send: Send) -> None:
    """Answers 200 with the size of the body it was given."""
    if scope["type"] != "http":
        return
    size, more = 0, True
    while more:
        message = await receive()
        size += len(message.get("body", b""))
        more = message.get("more_body", False)
    answer = str(size).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain"),
                            (b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})


GUARDED = BodyGuard(_sized, default=BodyLimit(LIMIT, "VOICE_MAX_BODY_BYTES"))


@pytest.fixture(params=["httptools", "h11"])
async def port(request: pytest.FixtureRequest) -> AsyncIterator[int]:
    """The guarded app on a real server, on each HTTP parser the edge can run on."""
    async with serving(VoiceSettings(edge_http=request.param), GUARDED) as p:
        yield p


def head(length: int | None, expect: bool = False) -> bytes:
    lines = [b"POST /x HTTP/1.1", b"host: edge", b"content-type: application/octet-stream"]
    lines.append(b"transfer-encoding: chunked" if length is None
                 else b"content-length: %d" % length)
    if expect:
        lines.append(b"expect: 100-continue")
    return b"\r\n".join(lines) + b"\r\n\r\n"


def chunked(data: bytes, last: bool) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data) + (b"0\r\n\r\n" if last else b"")


async def read_answer(reader: asyncio.StreamReader) -> bytes:
    """One response (head and its ``content-length`` body); b"RESET" when the connection was
    reset before it came, b"" when it closed."""
    try:
        raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        return b"RESET" if isinstance(exc, ConnectionError) else b""
    length = 0
    for line in raw.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    try:
        return raw + await asyncio.wait_for(reader.readexactly(length), 10)
    except ConnectionError:
        return b"RESET"


async def post(port: int, first: bytes, rest: list[bytes], pause_s: float = 0.3
               ) -> tuple[bytes, asyncio.StreamReader, asyncio.StreamWriter]:
    """Writes ``first``, waits ``pause_s`` (the server answers meanwhile if it answers early),
    writes each of ``rest``, then reads the answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(first)
    await writer.drain()
    await asyncio.sleep(pause_s)
    try:
        for part in rest:
            writer.write(part)
            await writer.drain()
    except ConnectionError:
        pass  # the server went away: what matters is whether the answer can still be read
    return await read_answer(reader), reader, writer


async def test_a_client_still_writing_a_declared_body_reads_the_413(port: int) -> None:
    body = b"x" * (4 * LIMIT)
    answer, reader, writer = await post(port, head(len(body)) + body[:2 * LIMIT],
                                        [body[2 * LIMIT:]])
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert DETAIL in answer and b"connection: close" not in answer.lower()
    # The body was read to its end: the connection serves the next request.
    writer.write(head(5) + b"hello")
    again = await read_answer(reader)
    writer.close()
    assert again.startswith(b"HTTP/1.1 200") and again.endswith(b"\r\n\r\n5"), again


async def test_a_client_still_writing_a_chunked_body_reads_the_413(port: int) -> None:
    piece = b"y" * LIMIT
    answer, _reader, writer = await post(
        port, head(None) + chunked(piece, False) + chunked(piece, False),
        [chunked(piece, False), chunked(piece, True)])
    writer.close()
    assert answer.startswith(b"HTTP/1.1 413") and DETAIL in answer, answer[:200]


async def test_a_client_that_waits_for_100_continue_is_refused_at_once(port: int) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(2 * LIMIT, expect=True))
    started = asyncio.get_running_loop().time()
    answer = await read_answer(reader)
    took = asyncio.get_running_loop().time() - started
    writer.close()
    # Not told to go on (no "100 Continue"), and not made to wait: nothing was sent to read.
    assert answer.startswith(b"HTTP/1.1 413") and DETAIL in answer, answer[:200]
    assert took < LINGER_S / 2


async def test_a_body_that_does_not_end_is_cut_off_within_the_bounds(port: int) -> None:
    """A hostile client writing forever holds its connection no longer than ``LINGER_S`` and
    costs no more than ``LINGER_BYTES`` read past the limit; the server serves others."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(None))
    loop = asyncio.get_running_loop()
    started, sent, cut = loop.time(), 0, False
    while loop.time() - started < LINGER_S + 5:
        try:
            writer.write(chunked(b"z" * 16384, False))
            await asyncio.wait_for(writer.drain(), 1)
            sent += 16384
        except ConnectionError:
            cut = True
            break
        except TimeoutError:  # the server stopped reading: it is about to close
            continue
        await asyncio.sleep(0.001)
    took = loop.time() - started
    answer = await read_answer(reader)
    writer.close()
    assert cut, f"still open after {took:.1f} s and {sent} bytes"
    assert took < LINGER_S + 2
    assert answer in (b"RESET", b"") or answer.startswith(b"HTTP/1.1 413")
    other, _r, w = await post(port, head(5) + b"hello", [], pause_s=0)
    w.close()
    assert other.startswith(b"HTTP/1.1 200"), other


async def test_a_body_declared_past_what_is_discarded_is_refused_at_once(port: int) -> None:
    """Nothing is read that would be dropped in vain: a length past the limit and
    ``LINGER_BYTES`` is answered, and the connection closed, without reading any of it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head(LIMIT + LINGER_BYTES + 1))
    started = asyncio.get_running_loop().time()
    answer = await read_answer(reader)
    took = asyncio.get_running_loop().time() - started
    writer.close()
    assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower()
    assert took < LINGER_S / 2
