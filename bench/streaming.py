"""``reply.chunk_to_sse``: a piece of reply the model emits → the participant's SSE client has it.

A model of the bench's own (in this process, speaking the Messages streaming API) writes each
reply as ``CHUNKS`` numbered words, ``CHUNK_GAP_S`` apart, and notes when it sent each; the
client holds the conversation's SSE stream and notes when each word arrives in a ``delta``
event. Both clocks are this process's, so a word's latency is exact: the worker's stream
handling, the time coalescing (up to 50 ms by design), the delta's produce, the edge's tail
and the SSE write. Beside ``kafka.round_trip``, the raw produce → consume of one record.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import httpx

from bench.harness import Context, Result, benchmark, latency_summary
from bench.stack import start_stack
from streams.tokens import mint_token

CHUNKS = 20
CHUNK_GAP_S = 0.04
TURNS = 12
WORD = re.compile(r"w(\d+)t(\d{3})\b")


class TimedModel:
    """A Messages-API model that streams numbered words and notes when it sent each."""

    def __init__(self) -> None:
        self.sent: dict[tuple[int, int], float] = {}
        self.calls = 0

    def app(self) -> Any:
        from starlette.applications import Starlette
        from starlette.requests import Request
        from starlette.responses import JSONResponse, StreamingResponse
        from starlette.routing import Route

        async def messages(request: Request) -> Any:
            body = await request.json()
            self.calls += 1
            call = self.calls
            if not body.get("stream"):
                return JSONResponse(self._message(call, "".join(
                    f"w{call}t{i:03d} " for i in range(CHUNKS))))
            return StreamingResponse(self._stream(call), media_type="text/event-stream")

        async def count(_request: Request) -> Any:
            return JSONResponse({"input_tokens": 10})

        return Starlette(routes=[Route("/v1/messages", messages, methods=["POST"]),
                                 Route("/v1/messages/count_tokens", count, methods=["POST"])])

    @staticmethod
    def _message(call: int, text: str) -> dict[str, Any]:
        return {"id": f"msg_{call}", "type": "message", "role": "assistant",
                "model": "claude-sim-1", "content": [{"type": "text", "text": text}],
                "stop_reason": "end_turn", "stop_sequence": None,
                "usage": {"input_tokens": 10, "output_tokens": CHUNKS}}

    async def _stream(self, call: int) -> AsyncIterator[bytes]:
        def sse(event: str, data: dict[str, Any]) -> bytes:
            return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()

        start = {**self._message(call, ""), "content": [], "stop_reason": None}
        yield sse("message_start", {"type": "message_start", "message": start})
        yield sse("content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}})
        for i in range(CHUNKS):
            if i:
                await asyncio.sleep(CHUNK_GAP_S)
            self.sent[(call, i)] = time.time()
            yield sse("content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta",
                                                        "text": f"w{call}t{i:03d} "}})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield sse("message_delta", {"type": "message_delta",
                                    "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                                    "usage": {"output_tokens": CHUNKS}})
        yield sse("message_stop", {"type": "message_stop"})


@contextmanager
def serving(model: TimedModel) -> Iterator[str]:
    import uvicorn

    from deploy.kafka_local import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(model.app(), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True, name="bench-timed-model")
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the timed model did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)


async def _turn(client: httpx.AsyncClient, url: str, headers: dict[str, str]
                ) -> dict[tuple[int, int], float]:
    """One turn: open the stream, post, note when each word arrives until the turn ends."""
    r = await client.post(f"{url}/me/conversations", headers=headers)
    r.raise_for_status()
    cnv = r.json()["conversation"]
    arrived: dict[tuple[int, int], float] = {}
    posted = False
    async with client.stream("GET", f"{url}/me/conversations/{cnv}/stream",
                             params={"after": 0}, headers=headers) as s:
        event = None
        async for line in s.aiter_lines():
            if not posted:  # the stream is open: now the turn
                r = await client.post(f"{url}/me/conversations/{cnv}/messages",
                                      headers=headers, json={"text": "How is the street?"})
                r.raise_for_status()
                posted = True
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "delta":
                now = time.time()
                for call, i in WORD.findall(json.loads(line[5:])["text"]):
                    arrived.setdefault((int(call), int(i)), now)
            elif line.startswith("data:") and event == "turn":
                if json.loads(line[5:])["state"] != "Thinking":
                    break
    return arrived


@benchmark("reply.chunk_to_sse", baseline="kafka.round_trip", compare=("p50_ms", "p99_ms"))
def chunk_to_sse(ctx: Context) -> Result:
    """A piece of reply the model emits → the participant's SSE client has it (delta events)."""
    model = TimedModel()
    with serving(model) as model_url:
        st = start_stack(ctx, "stream", workers=1, model_url=model_url)
        try:
            headers = {"Authorization": "Bearer "
                       + mint_token(st.settings, "bench-reader", "participant")}

            async def run() -> dict[tuple[int, int], float]:
                out: dict[tuple[int, int], float] = {}
                async with httpx.AsyncClient(timeout=60) as client:
                    for _ in range(TURNS):
                        out.update(await asyncio.wait_for(
                            _turn(client, st.edge_url, headers), 60))
                return out

            t0 = time.perf_counter()
            arrived = asyncio.run(run())
            wall = time.perf_counter() - t0
        finally:
            st.close()
    warm = {k: t for k, t in arrived.items() if k[0] > 2}  # the first turns warm up
    samples = [t - model.sent[k] for k, t in warm.items() if k in model.sent]
    if not samples:
        raise RuntimeError("no delta arrived at the client")
    return {**latency_summary(samples), "chunks_sent": len(model.sent),
            "chunks_seen": len(arrived), "model_calls": model.calls, "wall_s": round(wall, 2),
            "note": f"{CHUNKS} words {CHUNK_GAP_S * 1000:.0f} ms apart per reply; the worker "
                    "coalesces for up to 50 ms by design; the first 2 turns are warm-up"}
