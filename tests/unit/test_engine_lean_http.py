"""The lean model adapter over real sockets, on both of its HTTP clients (``VOICE_MODEL_HTTP``):
aiohttp's session (the default) and httpx's own pool. Against the bundled simulator every
scenario of ``test_engine_lean`` gives the engine the same callbacks and the same response or
``ModelError`` on both; a refused connection is a connection error and a server that never
answers a timeout on both, as the SDK names them (decision 0013); both go through the proxy the
environment names, and a connection dropped mid-stream goes up unclassified from both."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from consumers.engine import lean
from consumers.engine.lean import LeanModel
from deploy.simulator import serve_simulator
from tests.unit.test_engine_lean import REQUEST, SCENARIOS, outcome

POOLS = ("aiohttp", "httpx")


async def _on(pool: str, url: str, headers: dict[str, str], change: dict[str, Any],
              calls: int = 2) -> list[Any]:
    """``calls`` calls in a row on one client (the second one on a kept connection)."""
    model = LeanModel(url, "sk-test", extra_headers=headers, http=pool)  # type: ignore[arg-type]
    try:
        return [await outcome(model, dataclasses.replace(REQUEST, **change))
                for _ in range(calls)]
    finally:
        await model.aclose()


async def _every_scenario(pool: str) -> dict[str, list[Any]]:
    """Each scenario on ``pool``, in order, against a simulator of its own (it remembers the
    prompts it has seen: its cache figures depend on what came before)."""
    with serve_simulator() as url:
        return {name: await _on(pool, url, *SCENARIOS[name]) for name in SCENARIOS}


async def test_both_pools_give_the_engine_the_same_result():
    over_aiohttp = await _every_scenario("aiohttp")
    over_httpx = await _every_scenario("httpx")
    for name in SCENARIOS:
        assert over_aiohttp[name] == over_httpx[name], name
    assert ("tool", "search_issues") in over_aiohttp["tool_use"][0][0]
    assert over_aiohttp["rate_limited"][0][1][0] == "error"
    assert over_aiohttp["text"][1][1][0] == "ok"  # the second call, on a kept connection


async def test_the_default_client_is_an_aiohttp_session() -> None:
    from streams.settings import VoiceSettings

    assert VoiceSettings(env="test").model_http == "aiohttp"
    model = LeanModel("http://127.0.0.1:1", "k")
    try:
        await outcome(model)  # refused, but the call went out on the session
        assert model._session is not None and model._client is None
    finally:
        await model.aclose()
    assert model._session is None


@pytest.mark.parametrize("pool", POOLS)
async def test_a_refused_connection_is_a_connection_error(pool):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    [(heard, result)] = await _on(pool, f"http://127.0.0.1:{port}", {}, {}, calls=1)
    assert heard == []
    assert result[0] == "error" and result[2:4] == ("CONNECTION", "APIConnectionError")


@pytest.mark.parametrize("pool", POOLS)
async def test_a_server_that_never_answers_is_a_timeout(pool, monkeypatch):
    import httpx

    monkeypatch.setattr(lean, "TIMEOUT", httpx.Timeout(0.5, connect=5.0))
    with socket.socket() as s:  # accepts connections (the backlog) and never answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
        [(heard, result)] = await _on(pool, url, {}, {}, calls=1)
    assert heard == []
    assert result[0] == "error" and result[2:4] == ("CONNECTION", "APITimeoutError")


# ---------------------------------------------------------------------------- a raw server
@asynccontextmanager
async def _raw_server(answer: bytes) -> AsyncIterator[tuple[str, list[bytes]]]:
    """A server that reads one request head (and its body, by ``content-length``), keeps it,
    writes ``answer`` and closes the connection; yields its URL and the heads it got."""
    heads: list[bytes] = []

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        heads.append(head)
        length = next((int(line.split(b":")[1]) for line in head.lower().split(b"\r\n")
                       if line.startswith(b"content-length:")), 0)
        await reader.readexactly(length)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}", heads
    finally:
        server.close()


NOT_FOUND = (b"HTTP/1.1 404 Not Found\r\ncontent-type: application/json\r\n"
             b"content-length: 60\r\nconnection: close\r\n\r\n"
             + b'{"type":"error","error":{"type":"not_found_error","message":"x"}}'[:60])


@pytest.mark.parametrize("pool", POOLS)
async def test_the_proxy_the_environment_names_is_used(pool, monkeypatch):
    """The aiohttp session reads the environment's proxy once, when the client is made, not
    on every request (``trust_env``): the same proxy as httpx's, ``NO_PROXY`` honoured."""
    for name in ("HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    async with _raw_server(NOT_FOUND) as (proxy, heads):
        monkeypatch.setenv("HTTP_PROXY", proxy)
        [(_, result)] = await _on(pool, "http://model.test", {}, {}, calls=1)
        assert result[0] == "error" and result[3] == "NotFoundError", result
        assert heads and heads[0].startswith(b"POST http://model.test/v1/messages HTTP/1.1")
        monkeypatch.setenv("NO_PROXY", "model.test")
        [(_, result)] = await _on(pool, "http://model.test", {}, {}, calls=1)
        assert result[2:4] == ("CONNECTION", "APIConnectionError")  # no such host, no proxy
        assert len(heads) == 1


@pytest.mark.parametrize("pool", POOLS)
async def test_a_netrc_entry_for_the_host_changes_nothing(pool, monkeypatch, tmp_path):
    """aiohttp's ``trust_env`` would read ``~/.netrc`` and refuse a request that also carries
    an ``authorization`` header; the session does not trust the environment per request."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login someone password secret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    async with _raw_server(NOT_FOUND) as (url, heads):
        [(_, result)] = await _on(pool, url, {}, {}, calls=1)
    assert result[3] == "NotFoundError"
    assert b"authorization: bearer sk-test" in heads[0].lower()


@pytest.mark.parametrize("pool", POOLS)
async def test_a_connection_dropped_mid_stream_goes_up_unclassified(pool):
    """Not a ``ModelError``: the step fails and its workflow decides (as with the SDK)."""
    start = (b'event: message_start\ndata: {"type":"message_start","message":{"id":"m",'
             b'"type":"message","role":"assistant","model":"m","content":[],'
             b'"stop_reason":null,"usage":{"input_tokens":1,"output_tokens":0}}}\n\n')
    answer = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
              b"content-length: 100000\r\n\r\n" + start)
    async with _raw_server(answer) as (url, _):
        model = LeanModel(url, "sk-test", http=pool)
        try:
            with pytest.raises(Exception) as caught:
                await model.stream(REQUEST, lean.StreamCallbacks())
        finally:
            await model.aclose()
    assert not isinstance(caught.value, lean.ModelError), caught.value
