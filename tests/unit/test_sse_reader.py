"""The shared SSE reader of ``tests/support.py``, against canned streams (no server)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest

from tests.support import SseFrame, read_sse, sse_frames

WIRE = (
    b"id: 1\r\nevent: message\r\ndata: {\"seq\": 1,\r\ndata:  \"text\": \"hi\"}\r\n\r\n"
    b": keep-alive\r\n\r\n"
    b"id: 2\nevent: turn\ndata:{\"seq\": 2}\n\n"
    b":end; reconnect with after=2\n"
)


def serve(*chunks: bytes, pause: float = 0.0, status: int = 200) -> httpx.MockTransport:
    async def body() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield chunk
        await asyncio.sleep(pause)

    def handler(request: httpx.Request) -> httpx.Response:
        if status != 200:
            return httpx.Response(status, json={"detail": "too old", "oldest_cursor": 3})
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body())

    return httpx.MockTransport(handler)


def test_frames_keep_fields_multi_line_data_and_comments() -> None:
    s = read_sse("GET", "http://edge/stream", transport=serve(WIRE))
    assert s.status == 200 and s.ended
    assert [(f.id, f.event, f.data, f.comments) for f in s.frames] == [
        ("1", "message", {"seq": 1, "text": "hi"}, []),
        (None, None, None, ["keep-alive"]),
        ("2", "turn", {"seq": 2}, []),
        (None, None, None, ["end; reconnect with after=2"]),
    ]
    assert s.frames[0].text == '{"seq": 1,\n "text": "hi"}'
    assert [f.id for f in s.events] == ["1", "2"]


def test_until_stops_reading_early_and_during_runs_once() -> None:
    calls: list[int] = []
    s = read_sse("GET", "http://edge/stream", transport=serve(WIRE, pause=60),
                 until=lambda ev: bool(ev) and ev[-1].event == "turn",
                 during=lambda: calls.append(1))
    assert not s.ended and [f.event for f in s.events] == ["message", "turn"]
    assert calls == [1]


def test_a_stream_open_past_the_deadline_fails_naming_what_arrived() -> None:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"still open after 0.5s.*'message'"):
        read_sse("GET", "http://edge/stream", transport=serve(WIRE.split(b": keep")[0], pause=60),
                 deadline=0.5)
    assert time.monotonic() - t0 < 5


def test_an_answer_other_than_200_keeps_its_body() -> None:
    s = read_sse("GET", "http://edge/stream", transport=serve(status=409))
    assert s.status == 409 and s.frames == [] and s.body["oldest_cursor"] == 3


def test_frames_from_lines_count_a_frame_the_server_did_not_close() -> None:
    assert list(sse_frames(["data: 1", "", "", "event: x"])) == [
        SseFrame(text="1"), SseFrame(event="x")]
