"""The model simulator, driven through the real ``anthropic`` SDK over HTTP."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import anthropic
import httpx
import pytest
import uvicorn

from deploy.simulator import SimulatorSettings, create_simulator_app

MODEL = "claude-sim-1"
MAP_TOOLS = [{"name": n, "description": n, "input_schema": {"type": "object"}}
             for n in ("describe_dataset", "query_dataset", "display_map")]
SEARCH_TOOL = [{"name": "search_issues", "description": "Search issues",
                "input_schema": {"type": "object", "properties": {"query": {"type": "string"}}}}]


@pytest.fixture(scope="module")
def port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    free = s.getsockname()[1]
    s.close()
    app = create_simulator_app(SimulatorSettings(port=free))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "simulator did not start"
        time.sleep(0.02)
    yield free
    server.should_exit = True
    thread.join(5)


@pytest.fixture(scope="module")
def client(port):
    return anthropic.Anthropic(base_url=f"http://127.0.0.1:{port}", api_key="sim", max_retries=0)


def ask(client, text=None, agent=None, messages=None, **kw):
    system = f"You are helpful.\n[agent: {agent}]" if agent else "You are helpful."
    messages = messages or [{"role": "user", "content": text}]
    return client.messages.create(model=kw.pop("model", MODEL),
                                  max_tokens=kw.pop("max_tokens", 1024),
                                  system=kw.pop("system", system), messages=messages, **kw)


def fenced_json(message) -> dict:
    text = "".join(b.text for b in message.content if b.type == "text")
    m = re.search(r"```json\n(.*?)\n```", text, re.S)
    assert m, text
    return json.loads(m.group(1))


def tool_round(messages, reply, result) -> list[dict]:
    """Append the assistant reply and a tool_result for its (single) tool_use."""
    use = next(b for b in reply.content if b.type == "tool_use")
    return [*messages, {"role": "assistant", "content": [b.model_dump(exclude_none=True)
                                                         for b in reply.content]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                          "content": json.dumps(result)}]}]


# ------------------------------------------------------------------ protocol
def test_non_streaming_message_shape(client):
    m = ask(client, "hello there simulator")
    assert m.type == "message" and m.role == "assistant" and m.model == MODEL
    assert m.id.startswith("msg_sim_")
    assert m.content[0].type == "text" and m.content[0].text == "Echo: hello there simulator"
    assert m.stop_reason == "end_turn"
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0
    assert m.usage.cache_creation_input_tokens == 0 and m.usage.cache_read_input_tokens == 0


def test_streaming_with_sdk_text_stream_and_final_message(client):
    text = "please tell me something long enough to be split into several deltas"
    with client.messages.stream(model=MODEL, max_tokens=512,
                                messages=[{"role": "user", "content": text}]) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) >= 3 and all(len(p) <= 20 for p in pieces)
    assert "".join(pieces) == final.content[0].text == f"Echo: {text}"
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 1


def test_raw_sse_event_sequence(port):
    body = {"model": MODEL, "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "one two three four five six"}]}
    r = httpx.post(f"http://127.0.0.1:{port}/v1/messages", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = re.findall(r"^event: (\w+)$", r.text, re.M)
    assert events[0] == "message_start" and events[-2:] == ["message_delta", "message_stop"]
    assert events.count("content_block_delta") >= 2
    datas = [json.loads(d) for d in re.findall(r"^data: (.*)$", r.text, re.M)]
    assert [d["type"] for d in datas] == events
    delta = next(d for d in datas if d["type"] == "message_delta")
    assert delta["delta"]["stop_reason"] == "end_turn" and delta["usage"]["output_tokens"] > 0


def test_streamed_tool_use_is_assembled_by_sdk(client):
    text = "The streetlights on Elm Street are broken. Please fix them."
    msgs = [{"role": "user", "content": text}]
    with client.messages.stream(model=MODEL, max_tokens=512, tools=SEARCH_TOOL, messages=msgs,
                                system="[agent: concern-extraction]") as stream:
        final = stream.get_final_message()
    use = final.content[0]
    assert final.stop_reason == "tool_use" and use.type == "tool_use"
    assert use.name == "search_issues" and "streetlights" in use.input["query"]


def test_max_tokens_and_stop_sequences(client):
    m = ask(client, "a b c d e f g h i j k l m n o p q r s t", max_tokens=2)
    assert m.stop_reason == "max_tokens" and m.content[0].text == "Echo: a "  # 2 tokens = 8 chars
    m = ask(client, "alpha beta STOP gamma", stop_sequences=["STOP"])
    assert m.stop_reason == "stop_sequence" and m.stop_sequence == "STOP"
    assert m.content[0].text == "Echo: alpha beta "


def test_prompt_cache_creation_then_read(client):
    system = [{"type": "text", "text": "[agent: assistant]\n" + "Long cached rules. " * 50,
               "cache_control": {"type": "ephemeral"}}]
    first = ask(client, "hello", system=system)
    second = ask(client, "a different question", system=system)
    assert first.usage.cache_creation_input_tokens > 100
    assert first.usage.cache_read_input_tokens == 0
    assert second.usage.cache_read_input_tokens == first.usage.cache_creation_input_tokens
    assert second.usage.cache_creation_input_tokens == 0
    assert second.usage.input_tokens < 20
    plain = ask(client, "hello", system="[agent: assistant]\n" + "Long cached rules. " * 50)
    assert plain.usage.cache_read_input_tokens == 0 and plain.usage.input_tokens > 100


def test_models_and_count_tokens(client, port):
    ids = [m.id for m in client.models.list()]
    assert MODEL in ids
    r = httpx.post(f"http://127.0.0.1:{port}/v1/messages/count_tokens",
                   json={"model": MODEL, "messages": [{"role": "user", "content": "x" * 400}]})
    assert r.status_code == 200 and 100 <= r.json()["input_tokens"] <= 110


def test_settings_env_prefix(monkeypatch):
    monkeypatch.setenv("VOICE_SIMULATOR_PORT", "9123")
    monkeypatch.setenv("VOICE_SIMULATOR_LATENCY_MS", "15")
    s = SimulatorSettings()
    assert (s.port, s.latency_ms, s.chunk_delay_ms) == (9123, 15, 0)


def test_latency_header_and_chunk_delay():
    app = create_simulator_app(SimulatorSettings(chunk_delay_ms=30))
    body = {"model": MODEL, "max_tokens": 100,
            "messages": [{"role": "user", "content": "x" * 60}]}

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://sim") as c:
            t0 = time.monotonic()
            r = await c.post("/v1/messages", json=body, headers={"x-simulator-latency-ms": "150"})
            assert r.status_code == 200 and time.monotonic() - t0 >= 0.15
            t0 = time.monotonic()
            r = await c.post("/v1/messages", json={**body, "stream": True})
            assert r.text.count("event: content_block_delta") == 4  # "Echo: " + 60 chars → 4 deltas
            assert time.monotonic() - t0 >= 0.09

    import asyncio
    asyncio.run(go())


# ------------------------------------------------------------------ failures
def test_429_is_rate_limit_error_with_retry_after(client):
    with pytest.raises(anthropic.RateLimitError) as err:
        ask(client, "hi there you", extra_headers={"x-simulator-fail": "429"})
    assert err.value.status_code == 429 and err.value.response.headers["retry-after"] == "0"
    assert err.value.body["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize("how", [{"extra_headers": {"x-simulator-fail": "529"}},
                                 {"model": "sim-fail-529"}])
def test_529_is_overloaded(client, how):
    with pytest.raises(anthropic.InternalServerError) as err:
        ask(client, "hi there you", **how)
    assert err.value.status_code == 529
    assert err.value.body["error"]["type"] == "overloaded_error"


def test_500_and_sim_fail_429_model(client):
    with pytest.raises(anthropic.InternalServerError) as err:
        ask(client, "hi there you", extra_headers={"x-simulator-fail": "500"})
    assert err.value.status_code == 500 and err.value.body["error"]["type"] == "api_error"
    for _ in range(2):
        with pytest.raises(anthropic.RateLimitError):
            ask(client, "hi there you", model="sim-fail-429")


def test_unknown_model_is_not_found_but_others_accepted(client):
    with pytest.raises(anthropic.NotFoundError):
        ask(client, "hi there you", model="unknown-model-9")
    assert ask(client, "hi there you", model="some-new-model").model == "some-new-model"


def test_malformed_body_raises(client):
    with pytest.raises((anthropic.APIResponseValidationError, ValueError)):
        ask(client, "hi there you", extra_headers={"x-simulator-fail": "malformed"})
    with pytest.raises((anthropic.APIResponseValidationError, ValueError)):
        with client.messages.stream(model=MODEL, max_tokens=50,
                                    messages=[{"role": "user", "content": "hi"}],
                                    extra_headers={"x-simulator-fail": "malformed"}) as stream:
            stream.get_final_message()


def test_midstream_error_event(client):
    with pytest.raises(anthropic.APIStatusError) as err:
        with client.messages.stream(model=MODEL, max_tokens=50,
                                    messages=[{"role": "user", "content": "hi there you"}],
                                    extra_headers={"x-simulator-fail": "midstream"}) as stream:
            stream.get_final_message()
    assert "overloaded_error" in str(err.value)


def test_bad_request_without_max_tokens(port):
    r = httpx.post(f"http://127.0.0.1:{port}/v1/messages",
                   json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


# ------------------------------------------------------------------ concern extraction
def test_concern_extraction_tool_round_trip_relates_to_existing_issue(client):
    text = ("I walk home every night. The streetlights on Elm Street are broken and it feels "
            "unsafe. Please fix them.")
    msgs = [{"role": "user", "content": [
        {"type": "text", "text": "[CURRENT_STATE]\nissues: 2 open"},
        {"type": "text", "text": text}]}]
    first = ask(client, messages=msgs, agent="concern-extraction", tools=SEARCH_TOOL)
    assert first.stop_reason == "tool_use"
    use = first.content[0]
    assert use.name == "search_issues" and use.id.startswith("toolu_sim_")
    assert "streetlights" in use.input["query"] and "current_state" not in use.input["query"]
    again = ask(client, messages=msgs, agent="concern-extraction", tools=SEARCH_TOOL)
    assert again.content[0].id == use.id  # deterministic per request content

    found = {"issues": [{"id": "iss-0a1", "title": "Potholes on Main Road"},
                        {"id": "iss-7b2", "title": "Broken streetlight near Elm Street park"}]}
    final = ask(client, messages=tool_round(msgs, first, found), agent="concern-extraction",
                tools=SEARCH_TOOL)
    assert final.stop_reason == "end_turn"
    data = fenced_json(final)
    assert data["relates_to_issue"] == "iss-7b2" and data["new_issue"] is None
    assert [c["quote"] for c in data["concerns"]] == [
        "The streetlights on Elm Street are broken and it feels unsafe."]
    assert all(c["quote"] in text for c in data["concerns"])


def test_concern_extraction_proposes_new_issue_when_nothing_matches(client):
    text = "The bins behind the library are dirty and noisy at night. We need more collections."
    msgs = [{"role": "user", "content": text}]
    first = ask(client, messages=msgs, agent="concern-extraction", tools=SEARCH_TOOL)
    final = ask(client, messages=tool_round(msgs, first, {"issues": [
        {"id": "iss-0a1", "title": "Potholes on Main Road"}]}),
        agent="concern-extraction", tools=SEARCH_TOOL)
    data = fenced_json(final)
    assert data["relates_to_issue"] is None
    assert data["new_issue"]["title"] == "The bins behind the library are dirty and noisy at night"
    assert len(data["new_issue"]["title"]) <= 80
    # without the tool the proposal comes directly
    direct = fenced_json(ask(client, text, agent="concern-extraction"))
    assert direct["new_issue"] == data["new_issue"]


def test_concern_extraction_without_ask_or_concern_words(client):
    data = fenced_json(ask(client, "Our community garden has lovely tomatoes this year",
                           agent="concern-extraction", tools=SEARCH_TOOL))
    assert data["concerns"] == [{"statement": "Our community garden has lovely tomatoes this year",
                                 "quote": "Our community garden has lovely tomatoes this year"}]
    assert data["relates_to_issue"] is None and data["new_issue"] is None


@pytest.mark.parametrize("text", ["asdfgh qwrtzp xcvbnm", "ok", "",
                                  "this is [uninterpretable] text"])
def test_concern_extraction_could_not_interpret(client, text):
    msgs = [{"role": "user", "content": [{"type": "text", "text": "[CURRENT_STATE]\nx y z w"},
                                         {"type": "text", "text": text or " "}]}]
    m = ask(client, messages=msgs, agent="concern-extraction", tools=SEARCH_TOOL)
    assert m.stop_reason == "end_turn" and m.content[0].text.startswith("COULD_NOT_INTERPRET:")
    assert f'"{" ".join(text.split())[:80]}"' in m.content[0].text  # it quotes the message


# ------------------------------------------------------------------ assistant map flow
@pytest.mark.parametrize("samples,value", [(["CA", "NY", "TX"], "CA"),
                                           (["California", "New York"], "California")])
def test_assistant_map_flow(client, samples, value):
    msgs = [{"role": "user", "content": [
        {"type": "text", "text": "[CURRENT_STATE]\ndatasets:\n- Parks (ID: 3f9a2c7e)"},
        {"type": "text", "text": "Can you show me a map of the parks in California?"}]}]
    kw = {"agent": "assistant", "tools": MAP_TOOLS}
    step1 = ask(client, messages=msgs, **kw)
    use = step1.content[-1]
    assert step1.stop_reason == "tool_use"
    assert (use.name, use.input) == ("describe_dataset", {"dataset_id": "3f9a2c7e"})
    msgs = tool_round(msgs, step1, {"name": "Parks", "columns": [
        {"name": "park_name", "type": "String"},
        {"name": "state", "type": "String", "sample_values": samples}]})
    step2 = ask(client, messages=msgs, **kw)
    use = step2.content[-1]
    sql = f"SELECT * FROM data WHERE state = '{value}'"
    assert use.name == "query_dataset" and use.input["sql"] == sql
    msgs = tool_round(msgs, step2, {"rows": [{"park_name": "A"}, {"park_name": "B"},
                                             {"park_name": "C"}]})
    step3 = ask(client, messages=msgs, **kw)
    use = step3.content[-1]
    assert use.name == "display_map"
    assert use.input == {"dataset_id": "3f9a2c7e", "sql": sql, "title": "Map of California"}
    step4 = ask(client, messages=tool_round(msgs, step3, {"ok": True}), **kw)
    assert step4.stop_reason == "end_turn" and "3 matching rows" in step4.content[0].text


def test_assistant_generic_reply(client):
    m = ask(client, "What time is the council meeting?", agent="assistant", tools=MAP_TOOLS)
    assert m.stop_reason == "end_turn" and "council meeting" in m.content[0].text


# ------------------------------------------------------------------ other agents
def test_compaction(client):
    msgs = [{"role": "user", "content": "first message " + "x" * 300},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second message"}]
    text = ask(client, messages=msgs, agent="compaction").content[0].text
    assert text == "Summary: " + ("first message " + "x" * 300)[:200] + "\nsecond message"


def test_privacy_flagging_offsets(client):
    text = "Yesterday John Smith told me that Dr Mary Jones lives on Elm Street."
    data = fenced_json(ask(client, text, agent="privacy-flagging"))
    spans = [text[f["start"]:f["end"]] for f in data["flags"]]
    assert spans == ["John Smith", "Mary Jones"]
    assert all(f["kind"] == "person_name" and f["reason"] for f in data["flags"])


def test_research_assistant_flow(client):
    tools = [{"name": n, "description": n, "input_schema": {"type": "object"}}
             for n in ("summarise", "list_concerns", "get_issue")]
    msgs = [{"role": "user", "content": "Research issue iss-4c2 for me please"}]
    first = ask(client, messages=msgs, agent="research-assistant", tools=tools)
    use = first.content[0]
    assert (use.name, use.input) == ("list_concerns", {"issue": "iss-4c2"})
    final = ask(client, messages=tool_round(msgs, first, {"concerns": [
        {"id": "con-1", "text": "a"}, {"id": "con-2", "text": "b"}]}),
        agent="research-assistant", tools=tools)
    data = fenced_json(final)
    assert set(data) == {"sources", "questions", "investigations"}
    for key in data:
        assert data[key] and all({"title", "reason", "read"} <= set(i) for i in data[key])
    assert data["sources"][0]["read"] == ["con-1", "con-2"]
