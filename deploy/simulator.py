"""A local model simulator that speaks the Anthropic Messages API.

``voice up`` runs it when ``ANTHROPIC_API_KEY`` is unset (``ANTHROPIC_BASE_URL`` then points
here), and tests use it for deterministic replies. Endpoints: ``POST /v1/messages`` (JSON or SSE
with ``stream: true``), ``POST /v1/messages/count_tokens``, ``GET /v1/models[/{id}]``,
``GET /health``. Replies come from ``deploy.simulator_rules`` keyed by the ``[agent: NAME]`` line
of the system prompt.

Failures on demand:

* header ``x-simulator-fail: 429|529|500|malformed|midstream`` or a model named
  ``sim-fail-<same>`` (fails every time, for fallback chains); ``midstream`` sends an
  ``overloaded_error`` SSE event after the first text delta (a plain 529 when not streaming);
* models named ``unknown-…`` → 404 ``not_found_error``;
* header ``x-simulator-latency-ms`` overrides ``VOICE_SIMULATOR_LATENCY_MS`` for one request.

Usage is estimated at one token per four characters. Prompt caching is modelled per process:
the prefix up to each ``cache_control`` breakpoint (tools, system, messages) is remembered by
hash; a request reports ``cache_read_input_tokens`` for the longest prefix seen before and
``cache_creation_input_tokens`` for the rest up to its last breakpoint.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic_settings import BaseSettings, SettingsConfigDict

from deploy.simulator_rules import answer, block_text, image_problem

FAILURES = ("429", "529", "500", "malformed", "midstream")
MODELS = ("claude-sim-1", "claude-sonnet-4-5", "claude-haiku-4-5", "claude-opus-4-1")
CHUNK_CHARS = 20
_ERRORS = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error",
           500: "api_error", 529: "overloaded_error"}


class SimulatorSettings(BaseSettings):
    """``VOICE_SIMULATOR_*`` environment variables."""

    model_config = SettingsConfigDict(env_prefix="VOICE_SIMULATOR_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = 8100
    latency_ms: float = 0.0        # added before the first byte of every reply
    chunk_delay_ms: float = 0.0    # between streamed deltas


def _digest(obj: Any) -> str:
    raw = json.dumps(obj, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(raw.encode()).hexdigest()


def _tokens(chars: int) -> int:
    return (chars + 3) // 4


def _segments(body: dict) -> list[tuple[str, bool]]:
    """The prompt in order (tools, system, message blocks) as (text, is_cache_breakpoint)."""
    segs: list[tuple[str, bool]] = []
    for tool in body.get("tools") or []:
        if isinstance(tool, dict):
            plain = {k: v for k, v in tool.items() if k != "cache_control"}
            segs.append((json.dumps(plain, sort_keys=True), bool(tool.get("cache_control"))))
    system = body.get("system")
    if isinstance(system, str):
        segs.append((system, False))
    elif isinstance(system, list):
        segs += [(block_text([b]), bool(b.get("cache_control")))
                 for b in system if isinstance(b, dict)]
    for msg in body.get("messages") or []:
        if not isinstance(msg, dict):
            continue
        content = msg.get("content")
        if isinstance(content, str):
            segs.append((f"{msg.get('role')}: {content}", False))
            continue
        for b in content or []:
            if isinstance(b, dict):
                segs.append((f"{msg.get('role')}: {block_text([b])}", bool(b.get("cache_control"))))
    return segs


def usage_for(body: dict, seen: set[str]) -> dict[str, int]:
    """Input-side usage of a request; remembers its cache breakpoints in ``seen``."""
    segs = _segments(body)
    text, breakpoints = "", []
    for seg, mark in segs:
        text += seg + "\n"
        if mark:
            breakpoints.append((_digest([body.get("model"), text]), _tokens(len(text))))
    total = max(1, _tokens(len(text)))
    read = max((n for h, n in breakpoints if h in seen), default=0)
    created = 0
    if breakpoints and breakpoints[-1][0] not in seen:
        created = breakpoints[-1][1] - read
    seen.update(h for h, _ in breakpoints)
    return {"input_tokens": max(0, total - read - created),
            "cache_creation_input_tokens": created, "cache_read_input_tokens": read}


def finish(blocks: list[dict], max_tokens: int,
           stop_sequences: list[str]) -> tuple[list[dict], str, str | None, int]:
    """Apply max_tokens / stop_sequences: (content, stop_reason, stop_sequence, output_tokens)."""
    budget, out, chars = max(1, max_tokens) * 4, [], 0
    stop_reason, stop_seq = None, None
    for b in blocks:
        if b["type"] == "text":
            t = b["text"]
            hits = [(t.find(s), s) for s in stop_sequences if s and s in t]
            if hits:
                cut, stop_seq = min(hits)
                t, stop_reason = t[:cut], "stop_sequence"
            if len(t) > budget:
                t, stop_reason, stop_seq = t[:budget], "max_tokens", None
            if t:
                out.append({"type": "text", "text": t})
            budget -= len(t)
            chars += len(t)
            if stop_reason:
                break
        else:
            out.append(b)
            n = len(json.dumps(b["input"]))
            budget, chars = budget - n, chars + n
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in out) else "end_turn"
    return out, stop_reason, stop_seq, max(1, _tokens(chars))


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = _ERRORS.get(status, "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=status, headers=headers)


def _sse(event: str, data: dict) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _chunks(s: str, size: int = CHUNK_CHARS) -> list[str]:
    return [s[i:i + size] for i in range(0, len(s), size)] or [""]


def _failure_response(kind: str, stream: bool) -> Response:
    if kind == "429":
        return _error(429, "Simulated rate limit. Please retry.", {"retry-after": "0"})
    if kind in ("529", "midstream"):
        return _error(529, "Overloaded (simulated).")
    if kind == "500":
        return _error(500, "Internal server error (simulated).")
    if stream:
        return Response(b"event: message_start\ndata: {this is not json\n\n", 200,
                        media_type="text/event-stream")
    return Response(b'{"id": "msg_sim_broken", "type": "message", "content": [', 200,
                    media_type="application/json")


def create_simulator_app(settings: SimulatorSettings | None = None) -> FastAPI:
    """The simulator as an ASGI app; prompt-cache memory lives in this app instance."""
    settings = settings or SimulatorSettings()
    app = FastAPI(title="Voice model simulator", version="1")
    seen: set[str] = set()
    app.state.settings, app.state.cache_hashes = settings, seen

    async def delay(request: Request) -> None:
        raw = request.headers.get("x-simulator-latency-ms")
        try:
            ms = float(raw) if raw is not None else settings.latency_ms
        except ValueError:
            ms = settings.latency_ms
        if ms > 0:
            await asyncio.sleep(ms / 1000)

    async def read_body(request: Request) -> dict | JSONResponse:
        try:
            body = json.loads(await request.body() or b"null")
        except ValueError:
            return _error(400, "Request body is not valid JSON.")
        if not isinstance(body, dict):
            return _error(400, "Request body must be a JSON object.")
        if not isinstance(body.get("model"), str) or not body["model"]:
            return _error(400, "model: Field required")
        if not isinstance(body.get("messages"), list) or not body["messages"]:
            return _error(400, "messages: at least one message is required")
        problem = image_problem(body)
        if problem is not None:
            return _error(400, problem)
        return body

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "simulator": True}

    @app.get("/v1/models")
    async def list_models() -> dict:
        data = [_model(m) for m in MODELS]
        return {"data": data, "has_more": False, "first_id": MODELS[0], "last_id": MODELS[-1]}

    @app.get("/v1/models/{model_id}")
    async def get_model(model_id: str) -> Any:
        if model_id.startswith("unknown-"):
            return _error(404, f"model: {model_id}")
        return _model(model_id)

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(request: Request) -> Any:
        body = await read_body(request)
        if isinstance(body, JSONResponse):
            return body
        return {"input_tokens": max(1, _tokens(sum(len(s) + 1 for s, _ in _segments(body))))}

    @app.post("/v1/messages")
    async def messages(request: Request) -> Response:
        await delay(request)
        body = await read_body(request)
        if isinstance(body, JSONResponse):
            return body
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            return _error(400, "max_tokens: Field required (a positive integer)")
        model, stream = body["model"], bool(body.get("stream"))
        fail = request.headers.get("x-simulator-fail", "").strip().lower()
        if not fail and model.startswith("sim-fail-"):
            fail = model.removeprefix("sim-fail-")
        if fail:
            if fail not in FAILURES:
                return _error(400, f"x-simulator-fail must be one of {', '.join(FAILURES)}")
            if fail != "midstream" or not stream:
                return _failure_response(fail, stream)
        if model.startswith("unknown-"):
            return _error(404, f"model: {model}")

        key = _digest({k: body.get(k) for k in ("model", "system", "messages", "tools")})
        try:
            blocks = answer(body)
        except Exception as exc:  # a rule bug must look like an API error, not a hang
            return _error(500, f"simulator rule failed: {type(exc).__name__}: {exc}")
        for i, b in enumerate(blocks):
            if b["type"] == "tool_use":
                b["id"] = "toolu_sim_" + _digest([key, i, b["name"], b["input"]])[:24]
        stops = [s for s in body.get("stop_sequences") or [] if isinstance(s, str)]
        content, stop_reason, stop_seq, out_tokens = finish(blocks, max_tokens, stops)
        usage = {**usage_for(body, seen), "output_tokens": out_tokens}
        message = {"id": "msg_sim_" + key[:24], "type": "message", "role": "assistant",
                   "model": model, "content": content, "stop_reason": stop_reason,
                   "stop_sequence": stop_seq, "usage": usage}
        headers = {"request-id": "req_sim_" + key[24:48]}
        if not stream:
            return JSONResponse(message, headers=headers)
        events = _stream(message, settings.chunk_delay_ms / 1000, midstream=fail == "midstream")
        return StreamingResponse(events, media_type="text/event-stream",
                                 headers={**headers, "cache-control": "no-cache"})

    return app


def _model(model_id: str) -> dict:
    return {"type": "model", "id": model_id, "display_name": f"{model_id} (simulated)",
            "created_at": "2025-01-01T00:00:00Z"}


async def _stream(message: dict, chunk_delay: float,
                  midstream: bool = False) -> AsyncIterator[bytes]:
    """The Messages streaming event sequence for a finished ``message``."""
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**message["usage"], "output_tokens": 1}}
    yield _sse("message_start", {"type": "message_start", "message": start})
    yield _sse("ping", {"type": "ping"})
    first = True
    for index, block in enumerate(message["content"]):
        if block["type"] == "text":
            shell = {"type": "text", "text": ""}
            parts = [("text_delta", "text", c) for c in _chunks(block["text"])]
        else:
            shell = {"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}
            parts = [("input_json_delta", "partial_json", c)
                     for c in _chunks(json.dumps(block["input"], ensure_ascii=False))]
        yield _sse("content_block_start",
                   {"type": "content_block_start", "index": index, "content_block": shell})
        for kind, field, chunk in parts:
            if not first and chunk_delay > 0:
                await asyncio.sleep(chunk_delay)
            first = False
            yield _sse("content_block_delta", {"type": "content_block_delta", "index": index,
                                               "delta": {"type": kind, field: chunk}})
            if midstream:
                yield _sse("error", {"type": "error", "error": {
                    "type": "overloaded_error", "message": "Overloaded (simulated, mid-stream)"}})
                return
        yield _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield _sse("message_delta", {"type": "message_delta",
                                 "delta": {"stop_reason": message["stop_reason"],
                                           "stop_sequence": message["stop_sequence"]},
                                 "usage": {"output_tokens": message["usage"]["output_tokens"]}})
    yield _sse("message_stop", {"type": "message_stop"})


def run_simulator(host: str = "127.0.0.1", port: int | None = None) -> None:
    """Serve the simulator with uvicorn (blocking)."""
    import uvicorn

    settings = SimulatorSettings()
    if port is not None:
        settings = settings.model_copy(update={"port": port})
    uvicorn.run(create_simulator_app(settings), host=host, port=settings.port,
                log_level="warning", timeout_graceful_shutdown=2)


if __name__ == "__main__":  # python -m deploy.simulator
    _s = SimulatorSettings()
    run_simulator(_s.host, _s.port)


@contextmanager
def serve_simulator(**settings: Any) -> Iterator[str]:
    """The model simulator on a free port in a thread (for tests); yields its base URL."""
    import uvicorn

    from deploy.kafka_local import free_port

    port = free_port()
    app = create_simulator_app(SimulatorSettings(port=port, **settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True, name="voice-simulator")
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the simulator did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(5)
