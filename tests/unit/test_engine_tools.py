"""Tools: the envelope contract, the read-only allow-list, timeouts and cancellation."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import date, datetime

import pytest
from pydantic import BaseModel

from consumers.engine import (
    CancelToken,
    Card,
    ContractViolation,
    Err,
    Hint,
    HintSignal,
    Ok,
    Tool,
    ToolContext,
    ToolNotAllowed,
    ToolRegistry,
)
from consumers.engine.envelopes import envelope_from_dict, envelope_to_dict, render
from consumers.engine.tools import ProgressPump, execute


class Q(BaseModel):
    query: str = ""


class Slow(BaseModel):
    seconds: float = 5.0


def ctx(tool_use_id: str = "toolu_1", principal: object = "alice",
        cancel: CancelToken | None = None, progress=None) -> ToolContext:
    return ToolContext(principal=principal, agent_name="assistant", turn_id="t1",
                       tool_use_id=tool_use_id, cancel=cancel or CancelToken(),
                       progress_sink=progress)


def tool(name: str, run, model: type[BaseModel] = Q, **kw) -> Tool:
    return Tool(name, f"the {name} tool", model, run, **kw)


# ---------------------------------------------------------------- envelopes
def test_ok_schema_is_measured_from_rows_not_declared():
    ok = Ok(rows=[{"id": 1, "name": "a", "score": 1.5, "when": date(2024, 1, 2)},
                  {"id": 2, "name": None, "score": 2, "extra": {"k": 1}},
                  {"id": "3", "name": "c", "score": None}])
    schema = {c.name: c.type for c in ok.schema}
    assert list(schema) == ["id", "name", "score", "when", "extra"]
    assert schema == {"id": "mixed", "name": "str", "score": "float", "when": "date",
                      "extra": "json"}
    with pytest.raises(TypeError):
        Ok(rows=[{"a": 1}], schema=())  # a schema cannot be declared


def test_hint_and_err_with_effects_are_rejected():
    card = Card("chart", {"x": 1})
    with pytest.raises(ContractViolation):
        Hint("ambiguous", "which one?", ("a", "b"), effects=(card,))
    with pytest.raises(ContractViolation):
        Err("boom", "bug", effects=(card,))
    with pytest.raises(ContractViolation):
        Ok(effects=("not an effect",))
    assert Ok(effects=(card,)).effects == (card,)


def test_render_and_round_trip():
    ok = Ok(rows=[{"n": i} for i in range(60)], data={"total": 60}, warnings=("approx",))
    doc = json.loads(render(ok))
    assert doc["ok"] is True and doc["row_count"] == 60 and len(doc["rows"]) == 50
    assert doc["schema"] == [{"name": "n", "type": "int"}] and doc["warnings"] == ["approx"]
    assert json.loads(render(Hint("unknown_column", "no such column", ("state",)))) == {
        "hint": "unknown_column", "message": "no such column", "alternatives": ["state"]}
    assert json.loads(render(Err("down", "timeout")))["error"] == "timeout"
    for env in (ok, Hint("k", "m", ("a",)), Err("m", "k"),
                Ok(rows=[{"a": datetime(2024, 1, 1)}], effects=(Card("map_display", {}, "m1"),))):
        back = envelope_from_dict(json.loads(json.dumps(envelope_to_dict(env))))
        assert envelope_to_dict(back) == envelope_to_dict(env)


# ---------------------------------------------------------------- registry
def test_registry_accepts_only_read_only_tools_on_the_allow_list():
    reg = ToolRegistry([tool("search", lambda a, c: Ok())], allow=["search", "other"])
    assert reg.names == ("search",)
    with pytest.raises(ToolNotAllowed, match="not read-only"):
        reg.register(tool("other", lambda a, c: Ok(), read_only=False))
    with pytest.raises(ToolNotAllowed, match="allow-list"):
        reg.register(tool("delete_everything", lambda a, c: Ok()))
    with pytest.raises(ToolNotAllowed, match="twice"):
        reg.register(tool("search", lambda a, c: Ok()))
    with pytest.raises(ToolNotAllowed):
        ToolRegistry([tool("write", lambda a, c: Ok(), read_only=False)])
    api = reg.api_tools()
    assert api == [{"name": "search", "description": "the search tool",
                    "input_schema": Q.model_json_schema()}]
    assert reg.api_tools() is api  # computed once: byte-stable across the loop


# ---------------------------------------------------------------- execute
async def test_execute_runs_sync_and_async_tools_with_the_callers_principal():
    seen = {}

    def sync_run(args: Q, c: ToolContext):
        seen["sync"] = (args.query, c.principal, threading.current_thread().name)
        return Ok(rows=[{"q": args.query}])

    async def async_run(args: Q, c: ToolContext):
        seen["async"] = (args.query, c.principal)
        return Hint("narrow", "too broad", ("add a filter",))

    reg = ToolRegistry([tool("s", sync_run), tool("a", async_run)])
    r1 = await execute(reg, "s", {"query": "x"}, ctx(principal="bob"), CancelToken())
    r2 = await execute(reg, "a", {"query": "y"}, ctx(principal="bob"), CancelToken())
    assert isinstance(r1.envelope, Ok) and r1.envelope.rows == ({"q": "x"},)
    assert isinstance(r2.envelope, Hint) and r2.envelope.hint_kind == "narrow"
    assert seen["sync"][:2] == ("x", "bob") and seen["sync"][2] != "MainThread"
    assert seen["async"] == ("y", "bob")


async def test_execute_turns_failures_into_envelopes():
    def boom(args, c):
        raise RuntimeError("disk on fire")

    def hinting(args, c):
        raise HintSignal("unknown_id", "no issue iss-9", ("iss-1",))

    reg = ToolRegistry([tool("boom", boom), tool("hint", hinting),
                        tool("bad", lambda a, c: {"rows": []}), tool("ok", lambda a, c: Ok())])
    c, tok = ctx(), CancelToken()
    env = (await execute(reg, "boom", {}, c, tok)).envelope
    assert isinstance(env, Err) and env.err_kind == "RuntimeError" and "disk on fire" in env.message
    env = (await execute(reg, "hint", {}, c, tok)).envelope
    assert isinstance(env, Hint) and env.alternatives == ("iss-1",)
    env = (await execute(reg, "bad", {}, c, tok)).envelope
    assert isinstance(env, Err) and env.err_kind == "contract"
    env = (await execute(reg, "nope", {}, c, tok)).envelope
    assert isinstance(env, Hint) and env.hint_kind == "unknown_tool"
    assert set(env.alternatives) == {"boom", "hint", "bad", "ok"}
    env = (await execute(reg, "ok", {"query": 5}, c, tok)).envelope
    assert isinstance(env, Hint) and env.hint_kind == "invalid_arguments" and "query" in env.message


async def test_timeouts_for_sync_and_async_tools():
    async def slow_async(args: Slow, c):
        await asyncio.sleep(args.seconds)
        return Ok()

    def slow_sync(args: Slow, c):
        time.sleep(args.seconds)
        return Ok()

    reg = ToolRegistry([tool("sa", slow_async, Slow, timeout_s=0.1),
                        tool("ss", slow_sync, Slow, timeout_s=0.1)])
    for name in ("sa", "ss"):
        started = time.monotonic()
        ex = await execute(reg, name, {"seconds": 0.6}, ctx(), CancelToken())
        assert time.monotonic() - started < 0.5
        assert isinstance(ex.envelope, Err) and ex.envelope.err_kind == "timeout"
        assert 90 <= ex.duration_ms < 500


async def test_cancel_watcher_wins_over_a_slow_sync_tool_and_the_thread_drains():
    finished = threading.Event()

    def slow(args: Slow, c):
        time.sleep(args.seconds)
        finished.set()
        return Ok(rows=[{"late": True}])

    reg = ToolRegistry([tool("slow", slow, Slow)])
    token = CancelToken()
    asyncio.get_running_loop().call_later(0.1, token.cancel)
    started = time.monotonic()
    ex = await execute(reg, "slow", {"seconds": 0.5}, ctx(cancel=token), token)
    assert time.monotonic() - started < 0.4
    assert isinstance(ex.envelope, Err) and ex.envelope.err_kind == "cancelled"
    assert not finished.is_set()
    await asyncio.to_thread(finished.wait, 2)  # left to drain, not killed
    assert finished.is_set()
    # a cancelled token refuses to start another tool at all
    ex = await execute(reg, "slow", {"seconds": 5}, ctx(cancel=token), token)
    assert ex.envelope.err_kind == "cancelled" and ex.duration_ms < 100


async def test_progress_from_a_worker_thread_streams_in_order_and_stops_after_close():
    got = []

    async def emit(text, percent, current, total):
        got.append((text, percent))

    pump = ProgressPump(emit)

    def work():
        for i in range(5):
            pump.callback(f"step {i}", i * 20.0)

    await asyncio.to_thread(work)
    await pump.close()
    pump.callback("too late")
    await asyncio.sleep(0.01)
    assert got == [(f"step {i}", i * 20.0) for i in range(5)]
