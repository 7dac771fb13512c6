"""The assistant chat on a real broker, with real worker and edge processes and the model
simulator: uploads, the display-event stream (order, dense ids, resume), 202 then poll, the
Louisiana map example end to end with its patterns, ownership, and no plaintext on any topic."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.assistant import AssistantPatternRecorded
from schemas.workflow import step_success
from streams.envelope import decode
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import ASSISTANT, DATASETS, WORKFLOWS, all_specs, topic_name
from tests.support import SseFrame, SseRead, read_all, read_sse, wait_for

pytestmark = pytest.mark.integration

CSV = (Path(__file__).resolve().parents[1] / "fixtures" / "assistant_facilities.csv").read_bytes()
BASE = "/api/v1/assistant"
MAP_ASK = "Show me RCRA facilities in Louisiana on a map"
FIELDS = {"id", "type", "channel", "scope", "message_id", "verb", "priority", "data",
          "persistent", "ts"}


def auth(settings: VoiceSettings, sub: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, sub, 'participant')}"}


def upload(url: str, settings: VoiceSettings, data: bytes = CSV, sub: str = "alice",
           name: str = "facilities.csv") -> httpx.Response:
    return httpx.post(f"{url}{BASE}/files", files={"file": (name, data, "text/csv")},
                      headers=auth(settings, sub), timeout=10)


def chat(url: str, settings: VoiceSettings, body: dict[str, Any], sub: str = "alice"
         ) -> httpx.Response:
    return httpx.post(f"{url}{BASE}/chat", json={"stream": False, **body},
                      headers=auth(settings, sub), timeout=10)


class Streamed(SseRead):
    """A read of the assistant's stream, seen through its ``display`` events."""

    @property
    def events(self) -> list[SseFrame]:
        return [f for f in self.frames if f.event == "display"]

    @property
    def ids(self) -> list[int]:
        return [int(f.id) for f in self.events if f.id is not None]

    @property
    def types(self) -> list[str]:
        return [f.data["type"] for f in self.events if f.data]


def read_stream(method: str, url: str, headers: dict[str, str], **kw: Any) -> Streamed:
    return Streamed(**vars(read_sse(method, url, headers=headers, **kw)))


def chat_stream(url: str, settings: VoiceSettings, body: dict[str, Any], sub: str = "alice"
                ) -> Streamed:
    return read_stream("POST", f"{url}{BASE}/chat", auth(settings, sub),
                       json={**body, "stream": True})


def resume(url: str, settings: VoiceSettings, conversation: str, after: int | None = None,
           sub: str = "alice", **headers: str) -> Streamed:
    query = "" if after is None else f"?after={after}"
    return read_stream("GET", f"{url}{BASE}/conversations/{conversation}/stream{query}",
                       {**auth(settings, sub), **headers})


def turn_done(url: str, settings: VoiceSettings, conversation: str, turn: str
              ) -> dict[str, Any] | None:
    r = httpx.get(f"{url}{BASE}/conversations/{conversation}/turns/{turn}",
                  headers=auth(settings), timeout=10)
    return r.json() if r.status_code == 200 and r.json()["state"] != "Thinking" else None


def records(settings: VoiceSettings, spec: Any) -> list[Any]:
    return [decode(m.key(), m.value(), m.headers()) for m in
            read_all(settings, topic_name(settings, spec))]


# --- uploads ----------------------------------------------------------------------------------


def test_upload_ok_too_large_and_unparseable(settings: VoiceSettings,
                                             start_edge: Callable[..., str]) -> None:
    url = start_edge(VOICE_MAX_UPLOAD_BYTES="2048")
    r = upload(url, settings)
    assert r.status_code == 201, r.text
    body = r.json()
    assert len(body["dataset_id"]) == 32 and int(body["dataset_id"], 16) >= 0
    assert body == {"dataset_id": body["dataset_id"], "name": "facilities.csv", "rows": 12,
                    "columns": ["name", "state", "lat", "lon", "program"], "namespace": None}
    big = upload(url, settings, CSV * 4)
    assert big.status_code == 413 and "VOICE_MAX_UPLOAD_BYTES" in big.json()["detail"]
    bad = upload(url, settings, b"\x89PNG\r\n\x1a\n\x00\x00binary")
    assert bad.status_code == 422 and "not a usable CSV" in bad.json()["detail"]
    empty = upload(url, settings, b"name,state,lat,lon\n")
    assert empty.status_code == 422 and "no rows" in empty.json()["detail"]
    (rec,) = records(settings, DATASETS)
    assert rec.key == body["dataset_id"] and rec.record.owner == "alice"
    assert rec.record.rows == 12 and b"Bayou Solvents" not in rec.record.model_dump_json().encode()


# --- the stream -------------------------------------------------------------------------------


def test_chat_stream_events_in_order_with_dense_ids_and_resume(
        settings: VoiceSettings, start_worker: Callable[..., object],
        start_edge: Callable[..., str]) -> None:
    start_worker()
    url = start_edge()
    first = chat_stream(url, settings, {"message": "Hello there, what can you do for me?"})
    assert first.status == 200
    assert first.headers["content-type"].startswith("text/event-stream")
    assert first.headers["cache-control"] == "no-cache"
    assert first.headers["x-accel-buffering"] == "no"
    conversation, turn = first.headers["x-conversation-id"], first.headers["x-turn-id"]
    n = len(first.events)
    assert first.ids == list(range(1, n + 1))
    assert first.types[0] == "busy" and first.types[-3:] == ["cost", "idle", "done"]
    assert "text_delta" in first.types and "text_complete" in first.types
    for f in first.events:
        assert FIELDS <= set(f.data) and f.data["message_id"] == turn
    complete = next(f.data for f in first.events if f.data["type"] == "text_complete")
    assert "Happy to help" in complete["data"]["content"]
    assert any("end; turn done" in c for f in first.frames for c in f.comments)
    assert all(f.id is None for f in first.frames if f.event is None)  # comments carry no id

    again = resume(url, settings, conversation, after=0)  # after the stream ended
    assert again.ids == first.ids and [f.data for f in again.events] == [
        f.data for f in first.events]
    assert any("end; idle" in c for f in again.frames for c in f.comments)
    tail = resume(url, settings, conversation, after=3)
    assert tail.ids == list(range(4, n + 1))
    by_header = resume(url, settings, conversation, **{"Last-Event-ID": str(n - 1)})
    assert by_header.ids == [n]
    assert resume(url, settings, conversation, after=n).ids == []

    second = chat_stream(url, settings, {"message": "And one more question please",
                                         "conversation_id": conversation})
    assert second.headers["x-conversation-id"] == conversation
    assert second.ids == list(range(n + 1, n + 1 + len(second.events)))
    assert second.types[-1] == "done"


def test_chat_without_stream_answers_202_then_the_turn_reads_back(
        settings: VoiceSettings, start_worker: Callable[..., object],
        start_edge: Callable[..., str]) -> None:
    start_worker()
    url = start_edge()
    r = chat(url, settings, {"message": "Good morning, can you help me with data?"})
    assert r.status_code == 202, r.text
    accepted = r.json()
    conversation, turn = accepted["conversation_id"], accepted["turn"]
    assert turn == f"{conversation}:turn-2" and accepted["after"] == 0
    assert r.headers["location"].endswith(f"/conversations/{conversation}/turns/{turn}")
    done = wait_for(lambda: turn_done(url, settings, conversation, turn), timeout=30,
                    what="the turn to be replied")
    assert done["state"] == "Replied" and "Happy to help" in done["text"]
    assert done["end_reason"] == "end_turn" and done["cards"] == []


def test_a_stream_ends_before_the_gateway_bound_and_resumes(
        settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str], held_model: str) -> None:
    worker = start_worker(ANTHROPIC_BASE_URL=held_model)
    try:
        # 6 s, not less: the edge waits a third of the bound for the writer's ack, and a
        # loaded 2-core CI machine has taken more than 1 s to give it (a flake at 3 s)
        url = start_edge(VOICE_GATEWAY_BOUND_S="6")
        started = time.monotonic()
        s = chat_stream(url, settings, {"message": "Take your time with this one"})
        assert time.monotonic() - started < 6.0
        assert s.status == 200 and s.types == ["busy"] and s.ids == [1]
        assert "end; reconnect with after=1" in s.frames[-1].comments
        conversation = s.headers["x-conversation-id"]
        busy = chat(url, settings, {"message": "and another", "conversation_id": conversation})
        assert busy.status_code == 409 and "busy" in busy.json()["detail"]
        started = time.monotonic()
        again = resume(url, settings, conversation, after=0)
        assert time.monotonic() - started < 6.0
        assert again.ids == [1] and "end; reconnect with after=1" in again.frames[-1].comments
    finally:
        worker.kill()  # a graceful stop would wait for the held model call
        worker.wait()


# --- the map example, patterns, and no plaintext -------------------------------------------------


def test_the_louisiana_map_example_end_to_end(settings: VoiceSettings,
                                              start_worker: Callable[..., object],
                                              start_edge: Callable[..., str]) -> None:
    start_worker()
    url = start_edge()
    dataset = upload(url, settings).json()["dataset_id"]
    s = chat_stream(url, settings, {"message": MAP_ASK, "data_refs": [dataset]})
    assert s.status == 200, s
    conversation, turn = s.headers["x-conversation-id"], s.headers["x-turn-id"]
    calls = [f.data["data"]["tool"] for f in s.events if f.data["type"] == "tool_call"]
    assert calls == ["describe_dataset", "query_dataset", "display_map"]
    query = next(f.data["data"]["input"] for f in s.events if f.data["type"] == "tool_call"
                 and f.data["data"]["tool"] == "query_dataset")
    assert query["sql"] == "SELECT * FROM data WHERE state = 'LA'"
    (card,) = [f.data for f in s.events if f.data["type"] == "card"]
    assert card["data"]["card_type"] == "map_display" and card["display_id"] == "map"
    features = card["data"]["card_data"]["features"]
    assert len(features) == 4 and {f["properties"]["state"] for f in features} == {"LA"}
    assert s.types.index("text_complete") < s.types.index("card") < s.types.index("done")
    done = wait_for(lambda: turn_done(url, settings, conversation, turn), timeout=30,
                    what="the turn")
    assert done["state"] == "Replied" and "Louisiana" in done["text"]
    assert [c["card_type"] for c in done["cards"]] == ["map_display"]
    assert {f["properties"]["state"] for f in done["cards"][0]["card_data"]["features"]} == {"LA"}

    # After the turn: a provisional pattern at once, then the extracted one (sealed).
    def patterns() -> list[Any]:
        found = [e.record for e in records(settings, ASSISTANT)
                 if isinstance(e.record, AssistantPatternRecorded) and e.record.turn == turn]
        return found if len(found) == 2 else []

    found = wait_for(patterns, timeout=30, what="both patterns")
    assert [p.stage for p in found] == ["provisional", "extracted"]
    # The next turn of the conversation gets them as suggested context.
    r = chat(url, settings, {"message": "Which RCRA facilities in Louisiana are near rivers?",
                             "conversation_id": conversation, "data_refs": [dataset]})
    assert r.status_code == 202, r.text
    turn2 = r.json()["turn"]
    wait_for(lambda: turn_done(url, settings, conversation, turn2), timeout=30, what="turn 2")
    (out,) = [done.output for done in (step_success(e.record)
                                       for e in records(settings, WORKFLOWS))
              if done is not None and done.workflow == turn2]
    assert set(out["suggested"]) & {p.pattern_id for p in found}
    # Issue 14: an assistant turn's step outcome is applied where it ran, not recorded.
    turn_records = [e.type for e in records(settings, WORKFLOWS) if e.key == turn2]
    assert "voice.workflow.step_outcome.v1" not in turn_records, turn_records

    # No plaintext of the CSV or of the messages on any raw topic.
    secrets = [b"Bayou Solvents", b"Pelican Chemical", b"RCRA facilities in Louisiana",
               b"near rivers", b"Atchafalaya"]
    for spec in all_specs():
        for m in read_all(settings, topic_name(settings, spec)):
            raw = b"".join([m.key() or b"", m.value() or b"",
                            *(v or b"" for _, v in m.headers() or [])])
            leaked = [s for s in secrets if s in raw]
            assert not leaked, f"{leaked} in plaintext on {m.topic()}"


def test_another_users_conversation_and_dataset_are_404(settings: VoiceSettings,
                                                        start_worker: Callable[..., object],
                                                        start_edge: Callable[..., str]) -> None:
    start_worker()
    url = start_edge()
    dataset = upload(url, settings).json()["dataset_id"]
    r = chat(url, settings, {"message": "Hello, please describe my data", "data_refs": [dataset]})
    assert r.status_code == 202, r.text
    conversation, turn = r.json()["conversation_id"], r.json()["turn"]
    bob = auth(settings, "bob")
    assert chat(url, settings, {"message": "let me in", "conversation_id": conversation},
                sub="bob").status_code == 404
    assert httpx.get(f"{url}{BASE}/conversations/{conversation}/stream", headers=bob,
                     timeout=10).status_code == 404
    assert httpx.get(f"{url}{BASE}/conversations/{conversation}/turns/{turn}", headers=bob,
                     timeout=10).status_code == 404
    stolen = chat(url, settings, {"message": "use alice's data", "data_refs": [dataset]},
                  sub="bob")
    assert stolen.status_code == 404 and "data_refs[0]" in stolen.json()["detail"]
    wait_for(lambda: turn_done(url, settings, conversation, turn), timeout=30, what="turn")
