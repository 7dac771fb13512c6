"""The lean model adapter against the SDK, differentially: the same bytes on the wire (recorded
from the simulator, or written by hand: tool use, thinking, citations, errors, odd chunking)
go through ``AnthropicModel`` (the ``anthropic`` SDK) and through ``LeanModel``, and the engine
must see the same thing from both — the callbacks in order and the response, or the same
``ModelError``. Both read the bytes from an in-memory transport of their own httpx flavour."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from consumers.engine.lean import API_VERSION, LeanModel, _body_json, sse_events
from consumers.engine.model import (
    AnthropicModel,
    ModelError,
    ModelRequest,
    ModelResponse,
    StreamCallbacks,
)
from deploy.simulator import serve_simulator

REQUEST = ModelRequest(model="claude-sonnet-4-5",
                       system=[{"type": "text", "text": "[agent: concern-extraction]",
                                "cache_control": {"type": "ephemeral"}}],
                       messages=[{"role": "user", "content": "Please fix the broken lights"}],
                       tools=[{"name": "search_issues", "description": "Search issues",
                               "input_schema": {"type": "object", "properties": {
                                   "query": {"type": "string"}}}}],
                       max_tokens=256, sampling={"temperature": 0.5})

Reply = tuple[int, dict[str, str], bytes]


def chunked(body: bytes, size: int) -> list[bytes]:
    return [body[i:i + size] for i in range(0, len(body), size)] or [b""]


def sse(*events: tuple[str, Any], eol: str = "\n") -> bytes:
    out = ""
    for name, data in events:
        text = data if isinstance(data, str) else json.dumps(data)
        out += f"event: {name}{eol}data: {text}{eol}{eol}"
    return out.encode()


def start(**over: Any) -> tuple[str, dict]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
               "content": [], "stop_reason": None, "stop_sequence": None,
               "usage": {"input_tokens": 11, "output_tokens": 1,
                         "cache_read_input_tokens": 5, "cache_creation_input_tokens": 0}}
    return "message_start", {"type": "message_start", "message": {**message, **over}}


def block_start(index: int, block: dict) -> tuple[str, dict]:
    return "content_block_start", {"type": "content_block_start", "index": index,
                                   "content_block": block}


def delta(index: int, **d: Any) -> tuple[str, dict]:
    return "content_block_delta", {"type": "content_block_delta", "index": index, "delta": d}


def stop(index: int) -> tuple[str, dict]:
    return "content_block_stop", {"type": "content_block_stop", "index": index}


def end(stop_reason: str = "end_turn", **usage: Any) -> list[tuple[str, dict]]:
    return [("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                               "usage": {"output_tokens": 42, **usage}}),
            ("message_stop", {"type": "message_stop"})]


# ---------------------------------------------------------------------------- the harness
async def _chunks(parts: list[bytes]) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


def _handlers(reply: Reply, size: int, seen: list[Any]) -> tuple[Callable, Callable]:
    status, headers, body = reply

    def sdk(request: httpx2.Request) -> httpx2.Response:
        seen.append(("sdk", request))
        return httpx2.Response(status, headers=headers, content=_chunks(chunked(body, size)))

    def lean(request: httpx.Request) -> httpx.Response:
        seen.append(("lean", request))
        return httpx.Response(status, headers=headers, content=_chunks(chunked(body, size)))

    return sdk, lean


def ports(sdk: Callable, lean: Callable) -> tuple[AnthropicModel, LeanModel]:
    client = anthropic.AsyncAnthropic(
        api_key="sk-test", base_url="http://model.test", max_retries=0,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(sdk)))
    return (AnthropicModel(client, extra_headers={"x-extra": "1"}),
            LeanModel("http://model.test", "sk-test", extra_headers={"x-extra": "1"},
                      transport=httpx.MockTransport(lean)))


async def outcome(port: Any, request: ModelRequest = REQUEST) -> tuple[list, tuple]:
    """What the engine sees of one call: the callbacks in order, then the response or error."""
    heard: list[tuple[str, str]] = []

    async def on_text(t: str) -> None:
        heard.append(("text", t))

    async def on_tool(name: str) -> None:
        heard.append(("tool", name))

    try:
        response = await port.stream(request, StreamCallbacks(on_text, on_tool))
    except ModelError as exc:
        return heard, ("error", type(exc).__name__, exc.kind, exc.error_type, exc.fallback,
                       exc.status, str(exc))
    assert isinstance(response, ModelResponse)
    return heard, ("ok", response.to_dict())


async def both(reply: Reply, size: int = 1 << 20) -> tuple[Any, Any]:
    seen: list[Any] = []
    sdk, lean = ports(*_handlers(reply, size, seen))
    return await outcome(sdk), await outcome(lean)


def ok(body: bytes) -> Reply:
    return 200, {"content-type": "text/event-stream"}, body


# ---------------------------------------------------------------------------- recorded
SCENARIOS = {  # name → (extra headers, request changes)
    "text": ({}, {"system": [{"type": "text", "text": "[agent: x] hello"}]}),
    "tool_use": ({}, {}),
    "midstream_overload": ({"x-simulator-fail": "midstream"}, {}),
    "malformed": ({"x-simulator-fail": "malformed"}, {}),
    "rate_limited": ({"x-simulator-fail": "429"}, {}),
    "overloaded": ({"x-simulator-fail": "529"}, {}),
    "server_error": ({"x-simulator-fail": "500"}, {}),
    "not_found": ({}, {"model": "unknown-model-1"}),
    "max_tokens": ({}, {"max_tokens": 3, "system": [{"type": "text", "text": "[agent: x]"}]}),
}


@pytest.fixture(scope="module")
def recorded() -> dict[str, Reply]:
    """Each scenario's answer from the simulator, byte for byte."""
    out: dict[str, Reply] = {}
    with serve_simulator() as url:
        for name, (headers, change) in SCENARIOS.items():
            body = {"model": REQUEST.model, "max_tokens": REQUEST.max_tokens,
                    "system": REQUEST.system, "messages": REQUEST.messages,
                    "tools": REQUEST.tools, "stream": True, **change}
            r = httpx.post(url + "/v1/messages", json=body, headers=headers)
            out[name] = (r.status_code, {"content-type": r.headers["content-type"]}, r.content)
    assert b'"tool_use"' in out["tool_use"][2] and b"input_json_delta" in out["tool_use"][2]
    return out


@pytest.mark.parametrize("size", [1 << 20, 1, 7, 64])
@pytest.mark.parametrize("name", list(SCENARIOS))
async def test_recorded_simulator_streams_give_the_same_result(recorded, name, size):
    sdk, lean = await both(recorded[name], size)
    assert lean == sdk
    if name == "tool_use":
        assert ("tool", "search_issues") in lean[0]
        assert lean[1][1]["content"][0]["input"]["query"]


# ---------------------------------------------------------------------------- by hand
HAND: dict[str, Reply] = {
    "thinking_text_tool": ok(sse(
        start(), ("ping", {"type": "ping"}),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Let me "), delta(0, type="thinking_delta",
                                                                   thinking="think."),
        delta(0, type="signature_delta", signature="sig=="), stop(0),
        block_start(1, {"type": "text", "text": ""}),
        delta(1, type="text_delta", text="Héllo — "), delta(1, type="text_delta", text="wörld"),
        stop(1),
        block_start(2, {"type": "tool_use", "id": "toolu_1", "name": "search_issues",
                        "input": {}}),
        delta(2, type="input_json_delta", partial_json=""),
        delta(2, type="input_json_delta", partial_json='{"query": "stre'),
        delta(2, type="input_json_delta", partial_json='et lights", "n": [1, 2]}'), stop(2),
        *end("tool_use", cache_creation_input_tokens=7))),
    "redacted_thinking_and_citations": ok(sse(
        start(),
        block_start(0, {"type": "redacted_thinking", "data": "opaque"}), stop(0),
        block_start(1, {"type": "text", "text": "", "citations": None}),
        delta(1, type="text_delta", text="Cited."),
        delta(1, type="citations_delta", citation={
            "type": "char_location", "cited_text": "x", "document_index": 0,
            "document_title": None, "start_char_index": 0, "end_char_index": 1}),
        stop(1), *end())),
    "tool_without_input_deltas": ok(sse(
        start(), block_start(0, {"type": "tool_use", "id": "toolu_2", "name": "noop",
                                 "input": {}}), stop(0), *end("tool_use"))),
    "truncated_tool_json": ok(sse(
        start(), block_start(0, {"type": "tool_use", "id": "toolu_3", "name": "search_issues",
                                 "input": {}}),
        delta(0, type="input_json_delta", partial_json='{"query": "half", "n'),
        *end("max_tokens"))),
    "invalid_tool_json": ok(sse(
        start(), block_start(0, {"type": "tool_use", "id": "toolu_4", "name": "x",
                                 "input": {}}),
        delta(0, type="input_json_delta", partial_json='{"query": ]'), stop(0), *end())),
    "crlf_comments_and_unknowns": ok(
        b": a comment\r\n\r\n" + sse(
            start(), ("future_event", {"type": "future_event", "x": 1}),
            block_start(0, {"type": "text", "text": ""}),
            delta(0, type="future_delta", x=1), delta(0, type="text_delta", text="ok"),
            stop(0), *end(), eol="\r\n")),
    "bare_cr_lines": ok(sse(start(), block_start(0, {"type": "text", "text": ""}),
                            delta(0, type="text_delta", text="cr"), stop(0), *end(), eol="\r")),
    "data_without_space_and_split_lines": ok(
        b"event:message_start\ndata:" + json.dumps(start()[1]).encode() + b"\n\n"
        + b"event: content_block_start\ndata: {\"type\": \"content_block_start\",\n"
        + b"data: \"index\": 0, \"content_block\": {\"type\": \"text\", \"text\": \"\"}}\n\n"
        + sse(delta(0, type="text_delta", text="split"), stop(0), *end())),
    "events_without_a_name_are_skipped": ok(
        sse(start()) + b"data: {\"type\": \"content_block_start\"}\n\n"
        + sse(block_start(0, {"type": "text", "text": ""}),
              delta(0, type="text_delta", text="a"), stop(0), *end())),
    "no_message_stop": ok(sse(start(), block_start(0, {"type": "text", "text": ""}),
                              delta(0, type="text_delta", text="cut"))),
    "usage_updated_at_the_end": ok(sse(
        start(), block_start(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text="u"), stop(0),
        *end(input_tokens=99, cache_read_input_tokens=12))),
    "error_event_api_error": ok(sse(
        start(), block_start(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text="partial"),
        ("error", {"type": "error", "error": {"type": "api_error", "message": "boom"}}))),
    "error_event_overloaded_first": ok(sse(
        ("error", {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}))),
    "error_event_not_json": ok(sse(start(), ("error", "it broke"))),
    "bad_json_mid_stream": ok(sse(start(), block_start(0, {"type": "text", "text": ""}),
                                  ("content_block_delta", "{not json"))),
    "status_400_json": (400, {"content-type": "application/json"}, json.dumps(
        {"type": "error", "error": {"type": "invalid_request_error",
                                    "message": "max_tokens: too large"}}).encode()),
    "status_401": (401, {"content-type": "application/json"}, json.dumps(
        {"type": "error", "error": {"type": "authentication_error",
                                    "message": "invalid x-api-key"}}).encode()),
    "status_429_retry_after": (429, {"content-type": "application/json", "retry-after": "3"},
                               json.dumps({"type": "error", "error": {
                                   "type": "rate_limit_error", "message": "slow"}}).encode()),
    "status_500_text": (500, {"content-type": "text/plain"}, b"upstream exploded  "),
    "status_503_empty": (503, {}, b""),
    "status_504": (504, {"content-type": "application/json"}, b'{"error": "gateway"}'),
    "status_529": (529, {"content-type": "application/json"}, json.dumps(
        {"type": "error", "error": {"type": "overloaded_error",
                                    "message": "Overloaded"}}).encode()),
    "status_418_overloaded_body": (418, {"content-type": "application/json"}, json.dumps(
        {"type": "error", "error": {"type": "overloaded_error", "message": "tea"}}).encode()),
}


@pytest.mark.parametrize("size", [1 << 20, 1, 5, 33])
@pytest.mark.parametrize("name", list(HAND))
async def test_hand_written_streams_give_the_same_result(name, size):
    sdk, lean = await both(HAND[name], size)
    assert lean == sdk


async def test_the_hand_written_streams_say_what_they_are_meant_to():
    """The cases above are not vacuous: each reaches the part of the stream it names."""
    heard, (_, response) = (await both(HAND["thinking_text_tool"]))[1]
    assert heard == [("text", "Héllo — "), ("text", "wörld"), ("tool", "search_issues")]
    assert response["content"] == [
        {"type": "thinking", "thinking": "Let me think.", "signature": "sig=="},
        {"type": "text", "text": "Héllo — wörld"},
        {"type": "tool_use", "id": "toolu_1", "name": "search_issues",
         "input": {"query": "street lights", "n": [1, 2]}}]
    assert response["usage"] == {"input_tokens": 11, "output_tokens": 42,
                                 "cache_read_input_tokens": 5,
                                 "cache_creation_input_tokens": 7}
    _, (_, response) = (await both(HAND["truncated_tool_json"]))[1]
    assert response["content"][0]["input"] == {"query": "half"}
    _, error = (await both(HAND["error_event_api_error"]))[1]
    assert error[2:6] == ("MODEL_ERROR", "APIStatusError", False, 200)
    _, error = (await both(HAND["status_429_retry_after"]))[1]
    assert error[2:6] == ("RATE_LIMITED", "RateLimitError", True, 429)
    _, error = (await both(HAND["status_418_overloaded_body"]))[1]
    assert error[2:6] == ("OVERLOADED", "OverloadedError", True, 418)
    _, error = (await both(HAND["invalid_tool_json"]))[1]
    assert error[2] == "MALFORMED_RESPONSE"


# ---------------------------------------------------------------------------- where they differ
async def test_a_stream_the_sdk_cannot_read_at_all_is_malformed_for_the_adapter():
    """Events out of order or without their fields: the SDK raises whatever its parser hits
    (``RuntimeError``, ``IndexError``, ``AssertionError``), which escapes the engine's model
    errors; the adapter answers ``MALFORMED_RESPONSE``, which the engine records and acts on."""
    for body in (sse(block_start(0, {"type": "text", "text": ""})),
                 sse(start(), delta(3, type="text_delta", text="x")),
                 b"", b'{"id": "msg"}'):
        seen: list[Any] = []
        sdk, lean = ports(*_handlers(ok(body), 1 << 20, seen))
        with pytest.raises(Exception) as raised:  # noqa: PT011 - whatever the SDK raises
            await outcome(sdk)
        assert not isinstance(raised.value, ModelError)
        _, error = await outcome(lean)
        assert error[2] == "MALFORMED_RESPONSE"


# ---------------------------------------------------------------------------- transport
async def test_connection_errors_and_timeouts_are_the_same_model_errors():
    for sdk_exc, lean_exc in ((httpx2.ConnectError("refused"), httpx.ConnectError("refused")),
                              (httpx2.ConnectTimeout("slow"), httpx.ConnectTimeout("slow")),
                              (httpx2.ReadTimeout("slow"), httpx.ReadTimeout("slow"))):
        def raise_sdk(request: httpx2.Request, exc: Exception = sdk_exc) -> httpx2.Response:
            raise exc

        def raise_lean(request: httpx.Request, exc: Exception = lean_exc) -> httpx.Response:
            raise exc

        sdk, lean = ports(raise_sdk, raise_lean)
        assert await outcome(lean) == await outcome(sdk)
        assert (await outcome(lean))[1][2] == "CONNECTION"


async def test_a_connection_dropped_mid_stream_goes_up_unclassified_from_both():
    """After the response has begun, a transport error is not a model error for either path:
    the text already streamed was heard, and the step fails as a whole."""
    head = sse(start(), block_start(0, {"type": "text", "text": ""}),
               delta(0, type="text_delta", text="half"))

    async def broken(error: Exception) -> AsyncIterator[bytes]:
        yield head
        raise error

    def sdk(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=broken(httpx2.ReadError("reset")))

    def lean(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=broken(httpx.ReadError("reset")))

    for port, error in zip(ports(sdk, lean), (httpx2.ReadError, httpx.ReadError), strict=True):
        heard: list[str] = []

        async def on_text(t: str, heard: list[str] = heard) -> None:
            heard.append(t)

        with pytest.raises(error):
            await port.stream(REQUEST, StreamCallbacks(on_text=on_text))
        assert heard == ["half"]


async def test_a_callbacks_own_error_is_raised_as_it_is_never_a_model_error():
    class Mine(Exception):
        pass

    async def on_text(t: str) -> None:
        raise Mine(t)

    for port in ports(*_handlers(HAND["thinking_text_tool"], 9, [])):
        with pytest.raises(Mine):
            await port.stream(REQUEST, StreamCallbacks(on_text=on_text))


async def test_the_request_on_the_wire_is_the_sdks():
    seen: list[Any] = []
    sdk, lean = ports(*_handlers(HAND["usage_updated_at_the_end"], 1 << 20, seen))
    await outcome(sdk)
    await outcome(lean)
    (_, a), (_, b) = seen
    assert (a.method, str(a.url)) == (b.method, str(b.url)) == (
        "POST", "http://model.test/v1/messages")
    assert json.loads(a.content) == json.loads(b.content)
    assert json.loads(b.content)["stream"] is True and json.loads(b.content)["temperature"] == 0.5
    for name in ("anthropic-version", "authorization", "content-type", "accept", "x-extra"):
        assert a.headers.get(name) == b.headers.get(name), name
    sdk_version = anthropic._constants.ANTHROPIC_API_VERSION
    assert b.headers["anthropic-version"] == API_VERSION == sdk_version


@pytest.mark.parametrize("body", [
    {"messages": [{"role": "user", "content": "Grüße, 你好 🎉 \u2028 \x01 \"q\" \\"}],
     "max_tokens": 10, "stream": True, "temperature": 0.5, "top_k": None},
    {"metadata": {1: "a key that is not a string"}},  # orjson refuses: the stdlib's
    {"n": 2 ** 70},                                    # the same
])
def test_the_body_is_the_standard_librarys_compact_json(body):
    assert _body_json(body) == json.dumps(body, ensure_ascii=False,
                                          separators=(",", ":")).encode()


def test_a_body_neither_encoder_takes_raises_as_before():
    with pytest.raises(TypeError):
        _body_json({"x": object()})
    with pytest.raises(UnicodeEncodeError):  # a lone surrogate: not UTF-8
        _body_json({"x": "\ud800"})


async def test_sse_decoder_keeps_a_crlf_split_across_chunks_as_one_line_end():
    async def parts() -> AsyncIterator[bytes]:
        for p in (b"event: a\r", b"\ndata: 1\r", b"\n\r", b"\nevent: b\rdata: 2\r\r"):
            yield p

    assert [e async for e in sse_events(parts())] == [("a", "1"), ("b", "2")]
