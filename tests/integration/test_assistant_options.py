"""What an assistant chat accepts, on a real broker with real worker and edge processes and the
model simulator (issue 13 point 7): ``agentic_mode`` offers the production ``plan`` tool and an
unfinished plan is reported (display warning and telemetry); ``done`` carries the work log; the
chat command carries the asker's tenant and capabilities as the edge resolved them, and the SQL
tool, which needs one of them, runs because they reached it; ``namespace_id`` scopes the
datasets a turn sees; an uploaded image reaches the model as an image block, in its turn and
in later turns' history."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from schemas.agent import TelemetryEvent, telemetry_events
from schemas.assistant import AssistantChat
from streams.capabilities import resolve_capabilities
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, DATASETS, TELEMETRY, topic_name
from tests.integration.test_assistant_chat import (
    BASE,
    CSV,
    MAP_ASK,
    Streamed,
    read_stream,
    records,
)
from tests.support import read_all, wait_for

pytestmark = pytest.mark.integration

TENANT = "acme"


def auth(settings: VoiceSettings) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant', TENANT)}"}


def upload(url: str, settings: VoiceSettings) -> str:
    r = httpx.post(f"{url}{BASE}/files", files={"file": ("facilities.csv", CSV, "text/csv")},
                   headers=auth(settings), timeout=10)
    assert r.status_code == 201, r.text
    return str(r.json()["dataset_id"])


def chat_stream(url: str, settings: VoiceSettings, body: dict[str, Any]) -> Streamed:
    s = read_stream("POST", f"{url}{BASE}/chat", auth(settings), json={**body, "stream": True})
    assert s.status == 200, s
    return s


def of_type(s: Streamed, type_: str) -> list[dict[str, Any]]:
    return [f.data for f in s.events if f.data["type"] == type_]


def test_agentic_chat_plans_is_warned_and_done_carries_the_work_log(
        settings: VoiceSettings, start_worker: Callable[..., object],
        start_edge: Callable[..., str]) -> None:
    start_worker()
    url = start_edge()
    dataset = upload(url, settings)
    s = chat_stream(url, settings, {"message": "How many facilities are listed? Stop early.",
                                    "data_refs": [dataset], "agentic_mode": True})
    turn = s.headers["x-turn-id"]
    calls = [e["data"]["tool"] for e in of_type(s, "tool_call")]
    assert calls == ["plan", "describe_dataset", "plan"]
    assert [e["data"]["envelope"] for e in of_type(s, "tool_result")] == ["ok", "ok", "ok"]
    (warning,) = of_type(s, "warning")
    assert "1 of 2 steps not done (Answer the question)" in warning["data"]["text"]
    (done,) = of_type(s, "done")
    log = done["data"]["work_log"]
    assert [e["tool"] for e in log if e["kind"] == "tool"] == calls
    models = [e for e in log if e["kind"] == "model"]
    assert len(models) == 4 and all(e["input_tokens"] > 0 and e["output_tokens"] > 0
                                    for e in models)
    assert done["data"]["max_turns_reached"] is False

    def guardrail() -> TelemetryEvent | None:
        return next((t for e in records(settings, TELEMETRY)
                     for t in telemetry_events(e.record)
                     if t.name == "completion_guardrail" and t.workflow == turn), None)

    fired = wait_for(guardrail, timeout=30, what="the completion_guardrail telemetry")
    assert fired.attributes["unfinished_steps"] == 1 and fired.attributes["total_steps"] == 2


def test_the_edge_puts_tenant_and_capabilities_in_the_command_and_the_sql_tool_runs(
        settings: VoiceSettings, start_worker: Callable[..., object],
        start_edge: Callable[..., str]) -> None:
    start_worker()
    url = start_edge()
    dataset = upload(url, settings)
    s = chat_stream(url, settings, {"message": MAP_ASK, "data_refs": [dataset]})
    conversation = s.headers["x-conversation-id"]
    # Not agentic: no plan tool; the SQL tool (which needs `converse`) ran and answered Ok.
    results = {e["data"]["tool"]: e["data"]["envelope"] for e in of_type(s, "tool_result")}
    assert results == {"describe_dataset": "ok", "query_dataset": "ok", "display_map": "ok"}
    (cmd,) = [e for e in records(settings, COMMANDS)
              if isinstance(e.record, AssistantChat) and e.record.conversation == conversation]
    assert cmd.tenant == TENANT
    assert set(cmd.record.options.capabilities) == resolve_capabilities("participant")


def test_a_namespace_scopes_the_datasets_a_turn_sees(
        settings: VoiceSettings, start_worker: Callable[..., object],
        start_edge: Callable[..., str]) -> None:
    start_worker()
    url = start_edge()
    r = httpx.post(f"{url}{BASE}/files", files={"file": ("facilities.csv", CSV, "text/csv")},
                   data={"namespace": "proj-a"}, headers=auth(settings), timeout=10)
    assert r.status_code == 201 and r.json()["namespace"] == "proj-a", r.text
    in_a = r.json()["dataset_id"]
    unscoped = upload(url, settings)
    for body, missing in (({"namespace_id": "proj-b", "data_refs": [in_a]}, in_a),
                          ({"data_refs": [in_a]}, in_a),
                          ({"namespace_id": "proj-a", "data_refs": [unscoped]}, unscoped)):
        refused = httpx.post(f"{url}{BASE}/chat", headers=auth(settings), timeout=10,
                             json={"message": "Describe it", "stream": False, **body})
        assert refused.status_code == 404, refused.text
        assert refused.json()["detail"].startswith(f"data_refs[0]: no dataset {missing!r} in ")
    # An ID in file_context from another namespace is not attached either (silently).
    s = chat_stream(url, settings, {"message": MAP_ASK, "namespace_id": "proj-a",
                                    "data_refs": [in_a], "file_context": [f"ID: {unscoped}"]})
    results = {e["data"]["tool"]: e["data"]["envelope"] for e in of_type(s, "tool_result")}
    assert results == {"describe_dataset": "ok", "query_dataset": "ok", "display_map": "ok"}
    described = next(e["data"]["input"] for e in of_type(s, "tool_call")
                     if e["data"]["tool"] == "describe_dataset")
    assert described["dataset_id"] == in_a


PNG = base64.b64decode("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA"
                       "60e6kgAAAABJRU5ErkJggg==")


def test_an_uploaded_image_reaches_the_model_now_and_in_later_turns(
        settings: VoiceSettings, start_worker: Callable[..., object],
        start_edge: Callable[..., str]) -> None:
    start_worker()
    url = start_edge(VOICE_MAX_UPLOAD_BYTES="2048")
    r = httpx.post(f"{url}{BASE}/files", files={"file": ("dot.png", PNG, "image/png")},
                   headers=auth(settings), timeout=10)
    assert r.status_code == 201, r.text
    image = r.json()
    assert image == {"image_id": image["image_id"], "name": "dot.png",
                     "media_type": "image/png", "size_bytes": len(PNG), "namespace": None}
    too_big = httpx.post(f"{url}{BASE}/files", headers=auth(settings), timeout=10,
                         files={"file": ("big.png", PNG + b"\0" * 4096, "image/png")})
    assert too_big.status_code == 413 and "VOICE_MAX_UPLOAD_BYTES" in too_big.json()["detail"]
    as_data = httpx.post(f"{url}{BASE}/chat", headers=auth(settings), timeout=10, json={
        "message": "Query it", "stream": False, "data_refs": [image["image_id"]]})
    assert as_data.status_code == 422 and "is an image" in as_data.json()["detail"]
    seen = f"1 image(s) in this conversation: image/png of {len(PNG)} bytes"
    named = f"[Image: dot.png | ID: {image['image_id']}]"
    s = chat_stream(url, settings, {"message": "What is in this picture?",
                                    "file_context": [named]})
    (complete,) = of_type(s, "text_complete")
    assert seen in complete["data"]["content"]
    conversation = s.headers["x-conversation-id"]
    later = chat_stream(url, settings, {"message": "And what colour was it?",
                                        "conversation_id": conversation})
    (complete,) = of_type(later, "text_complete")
    assert seen in complete["data"]["content"]  # rebuilt from history, read back by position
    # The image's bytes are nowhere in plaintext on the log.
    for m in read_all(settings, topic_name(settings, DATASETS)):
        assert PNG not in (m.value() or b"")
