"""Validation of the assistant routes, before anything reaches Kafka: the chat request (422
naming the field), ownership of datasets, and the upload (size limit, CSV check)."""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from api import assistant
from api.assistant.models import ChatRequest, CsvRejected, check_csv
from api.assistant.views import AssistantViews
from streams.assistant_settings import AssistantSettings
from streams.sealing import MemoryKeyStore, Sealer
from streams.tokens import mint_token

CSV = (Path(__file__).resolve().parents[1] / "fixtures" / "assistant_facilities.csv").read_bytes()
CHAT = "/api/v1/assistant/chat"
FILES = "/api/v1/assistant/files"


@pytest.fixture
def client(tmp_path: Path) -> TestClient:
    settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path,
                                 max_message_bytes=64, max_upload_bytes=2048)
    app = FastAPI()
    app.include_router(assistant.router)
    app.state.settings = settings
    app.state.assistant = AssistantViews(settings)
    app.state.sealer = Sealer(MemoryKeyStore())
    app.state.producer = app.state.tail = None  # nothing here may reach Kafka
    c = TestClient(app)
    c.headers["Authorization"] = f"Bearer {mint_token(settings, 'alice', 'participant')}"
    return c


def problem(resp) -> list[tuple[str, ...]]:  # noqa: ANN001
    assert resp.status_code == 422, resp.text
    return [tuple(str(x) for x in e["loc"]) for e in resp.json()["detail"]]


@pytest.mark.parametrize("body, loc", [
    ({"message": "hi", "bogus": 1}, ("body", "bogus")),
    ({"message": "   "}, ("body", "message")),
    ({}, ("body", "message")),
    ({"message": "hi", "conversation_id": "not-a-uuid"}, ("body", "conversation_id")),
    ({"message": "hi", "dataset_id": "XYZ"}, ("body", "dataset_id")),
    ({"message": "hi", "data_refs": ["ab" * 16, "nope"]}, ("body", "data_refs", "1")),
    ({"message": "hi", "inference_params": {"temperature": 3}},
     ("body", "inference_params", "temperature")),
    ({"message": "hi", "advanced": {"data_isolation": True, "x": 1}}, ("body", "advanced", "x")),
    ({"message": "hi", "model_override": "bad model!"}, ("body", "model_override")),
    ({"message": "hi", "file_context": ["x"] * 21}, ("body", "file_context")),
    ({"message": "hi", "namespace_id": "../etc"}, ("body", "namespace_id")),
    ({"message": "hi", "stream": "sometimes"}, ("body", "stream")),
    ({"message": "x" * 65}, ("body", "message")),  # over VOICE_MAX_MESSAGE_BYTES
])
def test_bad_chat_requests_answer_422_naming_the_field(client: TestClient, body: dict,
                                                       loc: tuple[str, ...]) -> None:
    assert loc in problem(client.post(CHAT, json=body))


def test_a_full_chat_request_validates() -> None:
    req = ChatRequest.model_validate({
        "message": "Show me RCRA facilities in Louisiana on a map",
        "conversation_id": "7d7d7d7d-1111-2222-3333-444444444444", "dataset_id": "ab" * 16,
        "model_override": "claude-haiku-4-5", "file_context": ["[Dataset: f | ID: " + "ab" * 16],
        "data_refs": ["cd" * 16], "inference_params": {"temperature": 0.2, "top_p": 0.9},
        "focus_context": {"artifact": "map"}, "selection_state": {"points": [1, 2]},
        "agentic_mode": True, "skip_history": False, "advanced": {"data_isolation": True},
        "namespace_id": "ns-1", "stream": False})
    assert req.advanced.data_isolation and not req.stream


def test_chat_needs_a_token(client: TestClient) -> None:
    assert client.post(CHAT, json={"message": "hi"}, headers={"Authorization": ""}
                       ).status_code == 401


def test_a_dataset_that_is_not_the_callers_is_404_naming_the_field(client: TestClient) -> None:
    r = client.post(CHAT, json={"message": "hi", "data_refs": ["ab" * 16]})
    assert r.status_code == 404 and r.json()["detail"].startswith("data_refs[0]: no dataset")


def test_someone_elses_or_an_unknown_conversation_is_404(client: TestClient) -> None:
    r = client.post(CHAT, json={"message": "hi",
                                "conversation_id": "7d7d7d7d-1111-2222-3333-444444444444"})
    assert r.status_code == 404


def upload(client: TestClient, data: bytes, name: str = "f.csv"):  # noqa: ANN201
    return client.post(FILES, files={"file": (name, data, "text/csv")})


def test_upload_over_the_limit_is_413_naming_the_limit(client: TestClient) -> None:
    r = upload(client, CSV + b"Extra Row,LA,30.0,-91.0,RCRA\n" * 60)
    assert r.status_code == 413 and "2048" in r.json()["detail"]
    assert "VOICE_MAX_UPLOAD_BYTES" in r.json()["detail"]


@pytest.mark.parametrize("data, why", [
    (b"\xff\xfe\x00binary\x00", "not UTF-8"),
    (b"", "empty"),
    (b"name,state\n", "no rows"),
    (b"name,state\nA,LA\nB\n", "record 3 has 1 fields"),
    (b"name,name\nA,B\n", "repeats column names"),
    (b'name,state\n"A,LA\n', "not valid CSV"),
])
def test_upload_that_is_not_a_usable_csv_is_422(client: TestClient, data: bytes,
                                                why: str) -> None:
    r = upload(client, data)
    assert r.status_code == 422 and why in r.json()["detail"], r.text


def test_upload_must_be_multipart_with_a_file_part(client: TestClient) -> None:
    assert client.post(FILES, content=CSV, headers={"Content-Type": "text/csv"}
                       ).status_code == 415
    r = client.post(FILES, files={"other": ("f.csv", CSV, "text/csv")})
    assert r.status_code == 422 and "'file'" in r.json()["detail"]


def test_check_csv_reads_header_and_rows() -> None:
    checked = check_csv(CSV)
    assert checked.columns == ["name", "state", "lat", "lon", "program"] and checked.rows == 12
    assert check_csv(b"\xef\xbb\xbfa,b\r\n1,2\r\n").columns == ["a", "b"]  # BOM, CRLF
    with pytest.raises(CsvRejected, match="empty column name"):
        check_csv(b"a,,c\n1,2,3\n")
