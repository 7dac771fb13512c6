"""The lean model adapter over real sockets, on both of its HTTP pools (``VOICE_MODEL_HTTP``):
aiohttp's (the default, through ``httpx-aiohttp``) and httpx's own. Against the bundled
simulator every scenario of ``test_engine_lean`` gives the engine the same callbacks and the
same response or ``ModelError`` on both; a refused connection is a connection error and a
server that never answers a timeout on both, as the SDK names them (decision 0013)."""

from __future__ import annotations

import dataclasses
import socket
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


def test_the_default_pool_is_aiohttps() -> None:
    from streams.settings import VoiceSettings

    assert VoiceSettings(env="test").model_http == "aiohttp"
    client = LeanModel("http://127.0.0.1:1", "k")._http()
    assert type(client).__name__ == "HttpxAiohttpClient"


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
