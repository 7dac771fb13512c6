"""A lean ``ModelPort``: the Messages API's streaming wire format read over aiohttp (or httpx),
without the SDK.

Why: against a model that answers at once, the ``anthropic`` SDK's streaming (a pydantic model
per event, the message snapshot rebuilt through ``construct_type``, its tracing observer) was
27 % of the worker's CPU (docs/benchmarks.md, issue 14). This adapter sends the request the SDK
sends (same path, body, API version, authorization) and turns the server-sent events into the
same engine-visible result: the same callbacks in the same order, the same ``ModelResponse``,
the same ``ModelError`` (kind, error type, fallback, status, message) for every failure the
engine acts on. ``tests/unit/test_engine_lean.py`` holds the two paths equal on recorded and
hand-written streams; ``VOICE_MODEL_CLIENT=sdk`` selects the SDK again.

It must never retry (the engine walks the fallback chain), never classify a callback's own
exception as a model error, and never import the SDK.
"""

from __future__ import annotations

import json
import platform
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal

import aiohttp
import httpx
import jiter
import orjson
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from consumers.engine.model import (
    ModelError,
    ModelNotFound,
    ModelRequest,
    ModelResponse,
    StreamCallbacks,
    _CallbackFailed,
)
from consumers.engine.types import Usage

API_VERSION = "2026-10-21"
"""The ``anthropic-version`` the pinned SDK sends (a unit test holds them equal)."""

TIMEOUT = httpx.Timeout(600.0, connect=5.0)
LIMITS = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
"""The SDK's defaults: a turn may stream for minutes; 64 steps at once keep their connections."""

TIMED_OUT = ("Request timed out or interrupted. This could be due to a network timeout, "
             "dropped connection, or request cancellation. See "
             "https://docs.anthropic.com/en/api/errors#long-requests for more details.")
"""The SDK's words for a timeout (recorded nowhere, but logged: one wording for both paths)."""

_TRACKS_INPUT = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})

# status → the SDK's error class name (recorded as ``error_type``; the engine acts on 404, 429,
# 529 and ``overloaded_error`` bodies only). Errors the SDK names by ``error.details.error_code``
# (a few dozen 400s) are recorded here under their status's name.
_STATUS_NAMES = {400: "BadRequestError", 401: "AuthenticationError", 402: "PaymentRequiredError",
                 403: "PermissionDeniedError", 404: "NotFoundError", 408: "RequestTimeoutError",
                 409: "ConflictError", 412: "PreconditionFailedError",
                 413: "ContentTooLargeError", 422: "UnprocessableEntityError",
                 429: "RateLimitError", 431: "RequestHeaderFieldsTooLargeError",
                 499: "ClientClosedRequestError", 501: "HTTPNotImplementedError",
                 503: "ServiceUnavailableError", 504: "GatewayTimeoutError",
                 529: "OverloadedError"}


class LeanModel:
    """``ModelPort`` over one HTTP client, made on first use in the caller's loop.

    ``http`` chooses the client (``VOICE_MODEL_HTTP``): ``aiohttp`` (the default) is an
    ``aiohttp.ClientSession``; ``httpx`` is an ``httpx.AsyncClient`` on httpx's own pool, which
    cost ~4–5 ms of CPU per streamed call at 32 calls at once against ~0.9 ms (a request there
    checks every kept connection, a ``getpeername`` each: decision 0013). A given ``transport``
    (the in-memory ones of the differential tests) always goes through httpx. The same request
    goes out either way, and the same errors come back.

    aiohttp is used directly, not under httpx's interface (``httpx-aiohttp``, until the
    twenty-second pass of issue 14): httpx's request building, cookie handling and transport
    adapter were ~45 % of the client's CPU: 419 → 230 µs a streamed call at 32 at once
    (docs/benchmarks.md). Its proxy is read from the environment once, here (``HTTPS_PROXY``,
    ``NO_PROXY`` and the like, as httpx does); not per request, where ``trust_env`` would look
    in ``~/.netrc`` and the environment on a thread each time.
    """

    def __init__(self, base_url: str, api_key: str, *, extra_headers: dict[str, str] | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 http: Literal["aiohttp", "httpx"] = "aiohttp") -> None:
        self._url = base_url.rstrip("/") + "/v1/messages"
        self._headers = {"accept": "application/json", "content-type": "application/json",
                         "anthropic-version": API_VERSION, "authorization": f"Bearer {api_key}",
                         "user-agent": f"voice-lean/1 Python/{platform.python_version()}",
                         **(extra_headers or {})}
        self._transport = transport
        self._direct = http == "aiohttp" and transport is None
        self._proxy, self._proxy_auth = _env_proxy(self._url) if self._direct else (None, None)
        self._client: httpx.AsyncClient | None = None
        self._session: aiohttp.ClientSession | None = None

    @property
    def base_url(self) -> str:
        """Where requests go (without ``/v1/messages``)."""
        return self._url.removesuffix("/v1/messages")

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # Honours HTTPS_PROXY and the like (a given transport, in tests, is used as is).
            self._client = httpx.AsyncClient(timeout=TIMEOUT, limits=LIMITS, follow_redirects=True,
                                             transport=self._transport)
        return self._client

    def _aiohttp(self) -> aiohttp.ClientSession:
        if self._session is None:
            # httpx's TIMEOUT and LIMITS in aiohttp's terms: a connection 5 s, a read and a wait
            # for the pool 600 s, no bound on the whole call (a turn may stream for minutes).
            connector = aiohttp.TCPConnector(limit=LIMITS.max_connections or 0,
                                             keepalive_timeout=LIMITS.keepalive_expiry or 5.0)
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(),
                timeout=aiohttp.ClientTimeout(total=None, connect=TIMEOUT.pool,
                                              sock_connect=TIMEOUT.connect,
                                              sock_read=TIMEOUT.read))
        return self._session

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def stream(self, request: ModelRequest, callbacks: StreamCallbacks) -> ModelResponse:
        """One streamed call; ``ModelError`` for anything but a usable response."""
        body: dict[str, Any] = {"max_tokens": request.max_tokens, "messages": request.messages,
                                "model": request.model, "system": request.system}
        if request.tools:
            body["tools"] = request.tools
        body.update(request.sampling)
        body["stream"] = True
        content = _body_json(body)
        if self._direct:
            return await self._over_aiohttp(request.model, content, callbacks)
        return await self._over_httpx(request.model, content, callbacks)

    async def _over_aiohttp(self, model: str, content: bytes,
                            callbacks: StreamCallbacks) -> ModelResponse:
        request = self._aiohttp().post(self._url, data=content, headers=self._headers,
                                       proxy=self._proxy, proxy_auth=self._proxy_auth)
        try:
            response = await request.__aenter__()
        except (TimeoutError, aiohttp.ClientError) as exc:  # ServerTimeoutError is a TimeoutError
            raise _no_answer(isinstance(exc, TimeoutError)) from None
        try:
            return await _answer(model, response.status, response.read,
                                 response.content.iter_any(), callbacks)
        finally:
            await request.__aexit__(None, None, None)

    async def _over_httpx(self, model: str, content: bytes,
                          callbacks: StreamCallbacks) -> ModelResponse:
        http = self._http()
        try:
            response = await http.send(http.build_request(
                "POST", self._url, content=content, headers=self._headers), stream=True)
        except httpx.TransportError as exc:
            raise _no_answer(isinstance(exc, httpx.TimeoutException)) from None
        try:
            return await _answer(model, response.status_code, response.aread,
                                 response.aiter_bytes(), callbacks)
        finally:
            await response.aclose()


async def _answer(model: str, status: int, read_all: Callable[[], Awaitable[bytes]],
                  chunks: AsyncIterator[bytes], callbacks: StreamCallbacks) -> ModelResponse:
    """The response's result, or the ``ModelError`` of an error status or a stream the engine
    can't use. From here on a transport error (the connection dropped mid-stream) goes up as it
    is, unclassified, as the SDK's does: the step fails and its workflow decides."""
    try:
        if status >= 400:
            text = (await read_all()).decode("utf-8", errors="replace")
            raise _status_error(model, status, text)
        return await _read_stream(chunks, callbacks, status)
    except _CallbackFailed as carrier:
        raise carrier.exc from None
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        # An event without the fields its type has (the SDK lets these through raw).
        raise _malformed(exc) from None


def _env_proxy(url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
    """The proxy the environment names for ``url`` (``NO_PROXY`` honoured), or none."""
    try:
        return get_env_proxy_for_url(URL(url))
    except LookupError:
        return None, None


# ---------------------------------------------------------------------------- errors


def _error_type_of(body: object) -> str | None:
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else body
    return err.get("type") if isinstance(err, dict) else None


def _status_error(model: str, status: int, text: str) -> ModelError:
    """The ``ModelError`` of an HTTP error answer, named and worded as the SDK's would be."""
    text = text.strip()
    body: object = text
    try:
        body = json.loads(text)
        message = f"Error code: {status} - {body}"
    except ValueError:
        message = text or f"Error code: {status}"
    return _classified(model, status, body, message)


def _classified(model: str, status: int, body: object, message: str) -> ModelError:
    name = _STATUS_NAMES.get(status) or ("InternalServerError" if status >= 500
                                         else "APIStatusError")
    if name == "NotFoundError":
        return ModelNotFound(model, message)
    if name == "RateLimitError":
        return ModelError("RATE_LIMITED", message, error_type=name, fallback=True, status=status)
    if status == 529 or _error_type_of(body) == "overloaded_error":
        return ModelError("OVERLOADED", message, error_type="OverloadedError", fallback=True,
                          status=status)
    return ModelError("MODEL_ERROR", message, error_type=name, status=status)


def _no_answer(timed_out: bool) -> ModelError:
    """A request that got no response, named and worded as the SDK names it over either
    client: a timeout, or a connection error (refused, closed, unknown host, bad proxy)."""
    if timed_out:
        return ModelError("CONNECTION", TIMED_OUT, error_type="APITimeoutError")
    return ModelError("CONNECTION", "Connection error.", error_type="APIConnectionError")


def _malformed(exc: Exception) -> ModelError:
    return ModelError("MALFORMED_RESPONSE", f"malformed response: {exc}",
                      error_type="MalformedResponse")


# ---------------------------------------------------------------------------- the stream
async def sse_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[tuple[str | None, str]]:
    """(event, data) per server-sent event, decoded as the WHATWG spec (and the SDK) do: lines end
    at ``\\r\\n``, ``\\n`` or ``\\r``; an event is dispatched at a blank line only."""
    pending = b""
    event: str | None = None
    data: list[str] = []
    async for chunk in chunks:
        pending += chunk
        if not pending:
            continue
        lines = pending.splitlines(keepends=True)
        last = lines[-1]
        # An unterminated line, or a lone \r that a \n in the next chunk may complete.
        if not last.endswith((b"\n", b"\r")) or last.endswith(b"\r"):
            pending = lines.pop()
        else:
            pending = b""
        for raw in lines:
            line = raw.rstrip(b"\r\n").decode("utf-8")
            if not line:
                if event is not None or data:
                    yield event, "\n".join(data)
                event, data = None, []
                continue
            if line.startswith(":"):
                continue
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "event":
                event = value or None
            elif name == "data":
                data.append(value)
    if pending.endswith(b"\r"):  # the lone \r ended a line after all
        line = pending.rstrip(b"\r").decode("utf-8")
        if not line and (event is not None or data):
            yield event, "\n".join(data)


def _body_json(body: dict[str, Any]) -> bytes:
    """The request's JSON: orjson's (~15 times faster than the standard library's on a long
    history: docs/benchmarks.md, issue 14, twenty-first pass), or, for what orjson refuses (a
    key that is not a string, an integer past 64 bits, a lone surrogate), the standard
    library's, which raises where it did before."""
    try:
        return orjson.dumps(body)
    except (orjson.JSONEncodeError, TypeError):
        return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


async def _read_stream(chunks: AsyncIterator[bytes], callbacks: StreamCallbacks,
                       status: int) -> ModelResponse:
    message: dict[str, Any] | None = None
    blocks: list[dict[str, Any]] = []
    json_bufs: dict[int, bytes] = {}
    async for event, data in sse_events(chunks):
        if event is None or event == "ping":
            continue
        if event == "error":
            body: object = data
            try:
                body = json.loads(data)
                message_text = f"{body}"
            except ValueError:
                message_text = data or f"Error code: {status}"
            raise _classified(message["model"] if message else "", status, body, message_text)
        if not data:
            continue
        try:
            doc = json.loads(data)
        except ValueError as exc:
            raise _malformed(exc) from None
        kind = doc.get("type") if isinstance(doc, dict) else None
        if message is None:
            if kind != "message_start":
                raise _malformed(ValueError(f'{kind!r} before "message_start"'))
            message = dict(doc["message"])
            message["usage"] = dict(message.get("usage") or {})
            blocks = [dict(b) for b in message.get("content") or []]
            continue
        if kind == "content_block_delta":
            index = doc["index"]
            block, delta = blocks[index], doc["delta"]
            dtype = delta.get("type")
            if dtype == "text_delta":
                if block.get("type") == "text":
                    block["text"] = block.get("text", "") + delta["text"]
                    if callbacks.on_text is not None:
                        await _call(callbacks.on_text, delta["text"])
            elif dtype == "input_json_delta":
                if block.get("type") in _TRACKS_INPUT:
                    json_bufs[index] = json_bufs.get(index, b"") + delta["partial_json"].encode()
            elif dtype == "thinking_delta":
                if block.get("type") == "thinking":
                    block["thinking"] = block.get("thinking", "") + delta["thinking"]
            elif dtype == "signature_delta":
                if block.get("type") == "thinking":
                    block["signature"] = delta["signature"]
            elif dtype == "citations_delta" and block.get("type") == "text":
                block["citations"] = [*(block.get("citations") or []), delta["citation"]]
        elif kind == "content_block_start":
            block = dict(doc["content_block"])
            blocks.append(block)
            if block.get("type") == "tool_use" and callbacks.on_tool_start is not None:
                await _call(callbacks.on_tool_start, block["name"])
        elif kind == "message_delta":
            delta, usage = doc.get("delta") or {}, doc.get("usage") or {}
            message["stop_reason"] = delta.get("stop_reason")
            message["stop_sequence"] = delta.get("stop_sequence")
            message["usage"]["output_tokens"] = usage.get("output_tokens")
            for key in ("input_tokens", "cache_creation_input_tokens",
                        "cache_read_input_tokens"):
                if usage.get(key) is not None:
                    message["usage"][key] = usage[key]
    if message is None:
        raise _malformed(ValueError('the stream ended before "message_start"'))
    for index, buf in json_bufs.items():
        if buf:
            try:
                blocks[index]["input"] = jiter.from_json(buf, partial_mode=True)
            except ValueError as exc:
                raise _malformed(ValueError(
                    "Unable to parse tool parameter JSON from model. Please retry your request "
                    f"or adjust your prompt. Error: {exc}. JSON: {buf.decode()}")) from None
    u = message["usage"]
    return ModelResponse(content=[_block(b) for b in blocks],
                         stop_reason=message.get("stop_reason"), model=message.get("model") or "",
                         id=message.get("id"),
                         usage=Usage(u.get("input_tokens") or 0, u.get("output_tokens") or 0,
                                     u.get("cache_read_input_tokens") or 0,
                                     u.get("cache_creation_input_tokens") or 0))


async def _call(callback: Callable[[str], Awaitable[None]], arg: str) -> None:
    try:
        await callback(arg)
    except Exception as exc:  # ours, not the model's: must not be classified as a model error
        raise _CallbackFailed(exc) from exc


def _block(block: dict[str, Any]) -> dict[str, Any]:
    kind = block.get("type")
    if kind == "text":
        return {"type": "text", "text": block.get("text", "")}
    if kind == "tool_use":
        return {"type": "tool_use", "id": block.get("id"), "name": block.get("name"),
                "input": block.get("input")}
    return _without_none(block)


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value
