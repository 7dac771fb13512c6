"""Input never breaks the edge (issue 11, point 4): the body limit while reading and before
auth, bounded fields, invalid UTF-8 and lone surrogates, records too large for the broker,
the 500 with a request id, 503s with ``Retry-After``; gzip, never for SSE; a resolvable
OpenAPI document.

The app is the real one (``create_app``: its middleware, handlers and routes) with the
lifespan not run and fakes in its state, so no broker is needed; the producer and tail fakes
are those of ``test_conversation_routes``.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import logging
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from confluent_kafka import KafkaError, KafkaException
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.sse import EventSourceResponse, ServerSentEvent
from fastapi.testclient import TestClient
from pydantic import BaseModel

from api.app import create_app
from api.assistant import AssistantViews
from api.conversations import ConversationViews
from api.frame.body import LINGER_BYTES
from api.frame.models import MAX_JSON_BYTES, RequestModel
from api.staff import StaffViews
from schemas.conversation import ConversationStarted
from schemas.system import CommandAcknowledged
from streams.assistant_settings import AssistantSettings
from streams.envelope import Envelope, decode
from streams.producer import ProduceError
from streams.sealing import MemoryKeyStore, Sealer, SealingError
from streams.tokens import mint_token
from tests.unit.test_conversation_routes import FakeProducer, FakeTail

CHAT = "/api/v1/assistant/chat"
FILES = "/api/v1/assistant/files"
MB12 = 1_200_000
JSON = {"Content-Type": "application/json"}


class Delivered:
    """The broker's ack of a record, as much of it as the routes read."""

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return 1


class AckingProducer(FakeProducer):
    """``FakeProducer`` whose futures resolve with a delivered message, or ``fail`` raised
    when the record is produced (as the client raises it)."""

    def __init__(self, fail: BaseException | None = None) -> None:
        super().__init__()
        self.fail = fail

    def produce_raw(self, topic: str, key: Any, value: Any, headers: Any = None) -> Any:
        if self.fail is not None:
            raise self.fail
        self.sent.append(decode(key, value, headers))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(Delivered())
        return fut


class TenantTail(FakeTail):
    """``FakeTail`` that applies what the writer appends in the command's tenant, as the
    writer does (the edge shows an aggregate only to its own tenant)."""

    async def wait_ack(self, command_id: str, fut: Any, timeout: float) -> Any:
        if self.outcome != "accepted":
            return await super().wait_ack(command_id, fut, timeout)
        cmd = self.producer.sent[-1]
        self.views.apply(Envelope(record=ConversationStarted(conversation=cmd.key,
                                                             owner=cmd.record.owner),
                                  key=cmd.key, source="/test", seq=1, tenant=cmd.tenant))
        return CommandAcknowledged(command_id=command_id, aggregate=cmd.key,
                                   outcome="accepted", seq=1)


class FailingKeys(MemoryKeyStore):
    """A key store that cannot be reached."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def create(self, conversation: str, tenant: str | None = None) -> int:
        raise self.error


def edge(tmp_path: Path, outcome: str = "accepted", producer: FakeProducer | None = None,
         keys: MemoryKeyStore | None = None, **overrides: Any) -> FastAPI:
    """The edge app, its state faked: nothing reaches a broker."""
    settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path,
                                 **overrides)
    app = create_app(settings)
    app.state.settings = settings
    app.state.views = ConversationViews()
    app.state.owners = None  # an edge that reads all history
    app.state.sealer = Sealer(keys or MemoryKeyStore())
    app.state.producer = producer or AckingProducer()
    app.state.tail = TenantTail(app.state.producer, app.state.views, outcome)
    app.state.staff = StaffViews()
    app.state.assistant = AssistantViews(settings)
    return app


def token(app: FastAPI, sub: str = "alice", role: str = "participant") -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(app.state.settings, sub, role)}"}


def client(app: FastAPI, role: str = "participant") -> TestClient:
    c = TestClient(app, raise_server_exceptions=False)
    c.headers.update(token(app, role=role))
    return c


def asgi(app: FastAPI) -> httpx.AsyncClient:
    """A client that sends header bytes and body chunks as given (the TestClient re-encodes
    header values and joins a streamed body)."""
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://edge")


def locs(resp: httpx.Response) -> list[tuple[str, ...]]:
    assert resp.status_code == 422, resp.text
    return [tuple(str(x) for x in e["loc"]) for e in resp.json()["detail"]]


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    return edge(tmp_path)


@pytest.fixture
def conversation(app: FastAPI) -> str:
    r = client(app).post("/me/conversations")
    assert r.status_code == 201, r.text
    return str(r.json()["conversation"])


# --- the body limit: while reading, before parsing, before auth -------------------------------


def big_chat_body() -> bytes:
    return b'{"message":"hi","focus_context":{"a":"' + b"x" * MB12 + b'"}}'


def test_a_body_over_the_limit_with_content_length_is_413_before_auth(app: FastAPI) -> None:
    # No token: had the token been checked first, this would be 401.
    r = TestClient(app).post(CHAT, content=big_chat_body(), headers=JSON)
    assert r.status_code == 413, r.text
    assert r.json()["detail"] == ("the request body is larger than 1048576 bytes "
                                  "(VOICE_MAX_BODY_BYTES)")
    assert app.state.producer.sent == []


def test_a_chunked_body_over_the_limit_is_413_and_its_rest_read_only_within_bounds(
        app: FastAPI) -> None:
    # Past the limit the rest is read only to be dropped, and no further than LINGER_BYTES.
    body = b'{"message":"hi","focus_context":{"a":"' + b"x" * (LINGER_BYTES + MB12) + b'"}}'
    pulled: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(body), 64 * 1024):
            pulled.append(i)
            yield body[i:i + 64 * 1024]

    async def post() -> httpx.Response:
        async with asgi(app) as c:
            return await c.post(CHAT, content=chunks(), headers=JSON)

    r = asyncio.run(post())
    assert r.status_code == 413 and "VOICE_MAX_BODY_BYTES" in r.json()["detail"], r.text
    assert r.request.headers.get("content-length") is None  # sent chunked
    assert r.headers["connection"] == "close"  # the rest is left unread
    assert len(pulled) * 64 * 1024 <= 1024 * 1024 + LINGER_BYTES + 2 * 64 * 1024 < len(body)
    assert app.state.producer.sent == []


def test_the_upload_route_has_its_own_named_limit(tmp_path: Path) -> None:
    app = edge(tmp_path, max_upload_bytes=64 * 1024)
    body = b"x" * (200 * 1024)  # under VOICE_MAX_BODY_BYTES, over the upload's limit
    r = TestClient(app).post(FILES, content=body,
                             headers={"Content-Type": "multipart/form-data; boundary=B"})
    assert r.status_code == 413, r.text
    assert "VOICE_MAX_UPLOAD_BYTES (65536)" in r.json()["detail"]
    # The same body on another route is within its limit: read, then refused for what it is.
    assert client(app).post(CHAT, content=body, headers=JSON).status_code == 422


def test_the_limit_is_exact(app: FastAPI) -> None:
    def body(size: int) -> bytes:
        head = b'{"message":"hi","focus_context":{"a":"'
        return head + b"x" * (size - len(head) - 3) + b'"}}'

    c = client(app)
    at_limit = c.post(CHAT, content=body(1024 * 1024), headers=JSON)
    assert at_limit.status_code == 422  # read and parsed: refused by the field's limit
    assert c.post(CHAT, content=body(1024 * 1024 + 1), headers=JSON).status_code == 413


# --- field limits ----------------------------------------------------------------------------


def request_models(app: FastAPI) -> Iterator[tuple[str, type[BaseModel]]]:
    """Every model a request body is, or holds, by route."""
    for route in api_routes(app.routes):
        if route.body_field is None:
            continue
        stack = [route.body_field.field_info.annotation]
        while stack:
            model = stack.pop()
            if isinstance(model, type) and issubclass(model, BaseModel):
                yield route.path, model
                for field in model.model_fields.values():
                    stack.extend(_models_in(field.annotation))


def api_routes(routes: list[Any]) -> Iterator[APIRoute]:
    """Every ``APIRoute``, included routers opened."""
    for route in routes:
        if isinstance(route, APIRoute):
            yield route
        elif (included := getattr(route, "original_router", None)) is not None:
            yield from api_routes(included.routes)


def _models_in(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", ())
    return [annotation, *(m for a in args for m in _models_in(a))]


def test_every_request_body_is_a_request_model(app: FastAPI) -> None:
    # The one mechanism: a body model not on RequestModel would take unbounded strings.
    found = list(request_models(app))
    assert {m.__name__ for _, m in found} >= {"MessageIn", "ChatRequest", "InferenceParams",
                                              "AdvancedOptions", "IssueIn", "EvidenceIn",
                                              "DevelopmentIn", "ReviewIn", "RedactionIn",
                                              "ContributionIn"}
    assert [(p, m.__name__) for p, m in found if not issubclass(m, RequestModel)] == []


@pytest.mark.parametrize("body, loc", [
    ({"focus_context": {"a": "x" * (MAX_JSON_BYTES - 100), "b": "y" * 200}},
     ("body", "focus_context")),
    ({"selection_state": {"points": [[i, i] for i in range(10_000)]}},
     ("body", "selection_state")),
    ({"focus_context": json.loads('{"a":' + "[" * 40 + "]" * 40 + "}")},
     ("body", "focus_context")),
    ({"focus_context": {"a": "x" * 70_000}}, ("body", "focus_context", "a", "str")),
    ({"file_context": ["x" * 4001]}, ("body", "file_context", "0")),
    ({"file_context": ["x"] * 21}, ("body", "file_context")),
    ({"message": "x" * 70_000}, ("body", "message")),
])
def test_free_form_fields_over_their_limit_are_422_naming_the_field(
        app: FastAPI, body: dict[str, Any], loc: tuple[str, ...]) -> None:
    r = client(app).post(CHAT, json={"message": "hi", **body})
    assert loc in locs(r)
    assert len(r.content) < 4096  # the refusal does not echo the input back


def test_a_non_finite_number_in_a_json_object_is_422(app: FastAPI) -> None:
    r = client(app).post(CHAT, content=b'{"message":"hi","selection_state":{"a":NaN}}',
                         headers=JSON)
    assert ("body", "selection_state") in locs(r)


def test_a_focus_context_of_1_2_mb_is_refused_never_500(app: FastAPI) -> None:
    r = client(app).post(CHAT, json={"message": "hi", "focus_context": {"a": "x" * MB12}})
    assert r.status_code == 413 and "VOICE_MAX_BODY_BYTES" in r.json()["detail"]


def test_staff_bodies_are_bounded_too(app: FastAPI) -> None:
    staff = client(app, "staff")
    assert ("body", "title") in locs(staff.post("/staff/issues", json={"title": "t" * 201}))
    assert ("body", "body") in locs(staff.post("/staff/issues/iss-1/evidence",
                                                json={"title": "t", "body": "b" * 16_001}))
    reviewer = client(app, "reviewer")
    r = reviewer.post("/staff/contributions/ctb-1/review", json={
        "decision": "redact", "redactions": [{"start": 0, "end": 10 ** 30}]})
    assert ("body", "redactions", "0", "end") in locs(r)


# --- invalid UTF-8 and lone surrogates -------------------------------------------------------


BAD_TEXT = [
    pytest.param(b'"hello \\ud800 there"', id="lone-surrogate-escape"),
    pytest.param(b'"hello \xff there"', id="invalid-utf8-byte"),
    pytest.param(b'"hello \xed\xa0\x80 there"', id="utf8-encoded-surrogate"),
]


def route_bodies(conversation: str) -> list[tuple[str, str, bytes, tuple[str, ...]]]:
    """(role, path, body with {} where the bad text goes, where the 422 points)."""
    return [
        ("participant", f"/me/conversations/{conversation}/messages", b'{"text":{}}',
         ("body", "text")),
        ("participant", CHAT, b'{"message":{}}', ("body", "message")),
        ("participant", CHAT, b'{"message":"hi","file_context":["ok",{}]}',
         ("body", "file_context", "1")),
        ("participant", CHAT, b'{"message":"hi","focus_context":{"a":{"b":[{}]}}}',
         ("body", "focus_context", "a", "dict", "b", "list", "0", "str")),
        ("participant", CHAT, b'{"message":"hi","model_override":{}}',
         ("body", "model_override")),
        ("participant", "/me/issues/iss-1/contributions", b'{"text":{}}', ("body", "text")),
        ("staff", "/staff/issues", b'{"title":"t","summary":{}}', ("body", "summary")),
        ("staff", "/staff/issues/iss-1/developments", b'{"title":{},"body":"b"}',
         ("body", "title")),
        ("reviewer", "/staff/contributions/ctb-1/review",
         b'{"decision":"redact","redactions":[{"start":0,"end":1,"kind":{}}]}',
         ("body", "redactions", "0", "kind")),
    ]


@pytest.mark.parametrize("text", BAD_TEXT)
def test_bad_text_in_any_string_of_any_request_is_422_naming_the_field(
        app: FastAPI, conversation: str, text: bytes) -> None:
    for role, path, template, loc in route_bodies(conversation):
        c = client(app, role)
        r = c.post(path, content=template.replace(b"{}", text), headers=JSON)
        assert loc in locs(r), (path, r.text)
        assert r.json()["detail"][0]["type"] == "string_unicode"
    assert len(app.state.producer.sent) == 1  # the conversation's start, nothing since


def test_a_lone_surrogate_as_a_json_key_is_422(app: FastAPI) -> None:
    r = client(app).post(CHAT, content=b'{"message":"hi","focus_context":{"\\udc80":1}}',
                         headers=JSON)
    assert any(loc[:2] == ("body", "focus_context") for loc in locs(r))


def test_a_body_that_is_neither_utf8_nor_json_is_422_at_its_position(app: FastAPI) -> None:
    r = client(app).post(CHAT, content=b'{"message": "\xff', headers=JSON)
    assert r.status_code == 422 and r.json()["detail"][0]["type"] == "json_invalid"


@pytest.mark.parametrize("header, value", [
    ("X-Tenant-ID", b"t\xff"), ("X-Tenant-ID", b"t\x01"), ("Last-Event-ID", b"1\xff"),
    ("Idempotency-Key", b"k\xc3"),
])
def test_header_values_that_are_not_utf8_text_are_422_naming_the_header(
        app: FastAPI, conversation: str, header: str, value: bytes) -> None:
    async def send() -> httpx.Response:
        async with asgi(app) as c:
            headers = {**token(app), header: value}
            if header == "Last-Event-ID":
                return await c.get(f"/me/conversations/{conversation}/stream", headers=headers)
            return await c.post(f"/me/conversations/{conversation}/messages",
                                json={"text": "hi"}, headers=headers)

    assert ("header", header.lower()) in [(w, h.lower()) for w, h in locs(asyncio.run(send()))]


# --- records too large for the broker --------------------------------------------------------


def test_a_record_over_the_record_limit_is_413_and_never_produced(tmp_path: Path) -> None:
    app = edge(tmp_path, max_record_bytes=16 * 1024)
    c = client(app)
    conversation = c.post("/me/conversations").json()["conversation"]
    sent = len(app.state.producer.sent)
    r = c.post(f"/me/conversations/{conversation}/messages", json={"text": "x" * 15_000})
    assert r.status_code == 413, r.text
    assert "VOICE_MAX_RECORD_BYTES" in r.json()["detail"] and "16384" in r.json()["detail"]
    assert len(app.state.producer.sent) == sent


def test_the_largest_upload_fits_the_default_record_limit(tmp_path: Path) -> None:
    app = edge(tmp_path, max_upload_bytes=640 * 1024)
    row = b"Bayou Solvents \xc3\xa9,LA,30.1,-91.2,RCRA\n"
    data = b"name,state,lat,lon,program\n" + row * ((640 * 1024 - 40) // len(row))
    r = client(app).post(FILES, files={"file": ("f.csv", data, "text/csv")})
    assert r.status_code == 201, r.text


@pytest.mark.parametrize("error", [
    KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)),
    ProduceError("too large", retryable=False, code=KafkaError.MSG_SIZE_TOO_LARGE),
])
def test_a_record_the_client_or_broker_finds_too_large_is_413(tmp_path: Path,
                                                              error: Exception) -> None:
    app = edge(tmp_path, producer=AckingProducer(fail=error))
    r = client(app).post(FILES, files={"file": ("f.csv", b"a,b\n1,2\n", "text/csv")})
    assert r.status_code == 413, r.text


# --- 500 with a request id, 503 with Retry-After ---------------------------------------------


class ExplodingTail(TenantTail):
    async def wait_ack(self, command_id: str, fut: Any, timeout: float) -> Any:
        raise RuntimeError("secret: the ack table at /var/lib/voice is corrupt")


def test_an_unexpected_exception_is_500_with_a_request_id_and_no_internals(
        app: FastAPI, caplog: pytest.LogCaptureFixture) -> None:
    app.state.tail = ExplodingTail(app.state.producer, app.state.views, "accepted")
    with caplog.at_level(logging.ERROR, logger="api.frame.errors"):
        r = client(app).post("/me/conversations")
    assert r.status_code == 500
    rid = r.headers["X-Request-ID"]
    assert r.json() == {"detail": "internal error", "request_id": rid}
    assert "secret" not in r.text and "Traceback" not in r.text
    (logged,) = [rec for rec in caplog.records if rid in rec.getMessage()]
    # Logged with where it was raised, but not its message (it may echo what was sent).
    # (The traceback's frames show source lines — here the test's own literal — never values.)
    assert logged.args[3] == "RuntimeError" and "wait_ack" in logged.args[4]
    assert logged.exc_info is None


def test_a_sane_request_id_is_kept_and_any_other_replaced(app: FastAPI) -> None:
    c = client(app)
    assert c.get("/healthz", headers={"X-Request-ID": "req-42.a:b"}
                 ).headers["X-Request-ID"] == "req-42.a:b"
    for insane in ("x" * 200, "a b", "<script>"):
        rid = c.get("/healthz", headers={"X-Request-ID": insane}).headers["X-Request-ID"]
        assert rid != insane and len(rid) == 32
    assert c.get("/healthz").headers["X-Request-ID"] != c.get("/healthz").headers["X-Request-ID"]


@pytest.mark.parametrize("error, what", [
    (KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN)), "broker"),
    (BufferError("Local: Queue full"), "broker"),
    (ProduceError("produce to 'voice.commands' failed: timed out", retryable=True), "broker"),
])
def test_a_broker_that_does_not_take_the_record_is_503_with_retry_after(
        tmp_path: Path, error: Exception, what: str) -> None:
    app = edge(tmp_path, producer=AckingProducer(fail=error))
    r = client(app).post("/me/conversations")
    assert r.status_code == 503 and int(r.headers["Retry-After"]) > 0, r.text
    assert what in r.json()["detail"] and "voice.commands" not in r.text


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"),
                                   SealingError("key file is unreadable")])
def test_a_key_service_that_fails_is_503_with_retry_after(tmp_path: Path,
                                                          error: Exception) -> None:
    app = edge(tmp_path, keys=FailingKeys(error))
    r = client(app).post("/me/conversations")
    assert r.status_code == 503 and r.headers["Retry-After"], r.text
    assert "space" not in r.text and "unreadable" not in r.text


def test_every_503_has_retry_after(tmp_path: Path) -> None:
    # The writer could not record the command: the route raises a bare 503.
    r = client(edge(tmp_path, outcome="not recorded")).post("/me/conversations")
    assert r.status_code == 503 and r.headers["Retry-After"] == "2"


# --- gzip, never for SSE ---------------------------------------------------------------------


def test_a_large_json_response_is_gzipped_and_a_small_one_is_not(app: FastAPI) -> None:
    c = client(app)
    small = c.get("/me/conversations", headers={"Accept-Encoding": "gzip"})
    assert small.status_code == 200 and "content-encoding" not in small.headers
    for _ in range(40):
        c.post("/me/conversations")
    big = c.get("/me/conversations", headers={"Accept-Encoding": "gzip"})
    assert big.headers["content-encoding"] == "gzip" and len(big.json()) == 40
    raw = c.get("/me/conversations", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in raw.headers and len(raw.content) >= 1024


def test_an_sse_response_is_neither_gzipped_nor_buffered(app: FastAPI) -> None:
    first_sent = asyncio.Event()

    async def events() -> AsyncIterator[ServerSentEvent]:
        yield ServerSentEvent(event="display", id="1", data={"text": "x" * 4096})
        # Only a client that already got the first event lets the stream go on.
        await asyncio.wait_for(first_sent.wait(), 5)
        yield ServerSentEvent(comment="end")

    app.add_api_route("/test/sse", events, response_class=EventSourceResponse)
    sent: list[dict[str, Any]] = []

    asked: list[int] = []

    async def receive() -> dict[str, Any]:
        if not asked:  # the request's (empty) body, then a client that stays
            asked.append(1)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(10)
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
        if message["type"] == "http.response.body" and b"event: display" in message["body"]:
            first_sent.set()

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "GET", "scheme": "http", "path": "/test/sse", "raw_path": b"/test/sse",
             "root_path": "", "query_string": b"", "server": ("edge", 80),
             "client": ("127.0.0.1", 5), "headers": [(b"accept-encoding", b"gzip")]}
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 10))
    start = sent[0]
    headers = {k.decode(): v.decode() for k, v in start["headers"]}
    assert start["status"] == 200 and headers["content-type"].startswith("text/event-stream")
    assert "content-encoding" not in headers
    bodies = [m for m in sent if m["type"] == "http.response.body"]
    assert b"event: display" in bodies[0]["body"] and bodies[0].get("more_body")
    assert b": end" in b"".join(m["body"] for m in bodies)


# --- OpenAPI ---------------------------------------------------------------------------------


def test_every_ref_in_the_openapi_document_resolves(app: FastAPI) -> None:
    doc = client(app).get("/openapi.json").json()
    refs: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            if isinstance(node.get("$ref"), str):
                refs.append(node["$ref"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(doc)
    assert refs
    for ref in set(refs):
        assert ref.startswith("#/"), ref
        target: Any = doc
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            assert isinstance(target, dict) and part in target, f"unresolvable {ref}"
            target = target[part]
    chat = doc["paths"][CHAT]["post"]["responses"]["200"]["content"]["text/event-stream"]
    assert chat["schema"]["properties"]["data"]["contentSchema"]["title"] == "DisplayEventOut"


def test_gzip_bodies_decode(app: FastAPI) -> None:
    # The compressed bytes on the wire are a real gzip stream of the JSON.
    c = client(app)
    for _ in range(40):
        c.post("/me/conversations")

    async def get() -> tuple[httpx.Headers, bytes]:
        async with asgi(app) as a:
            async with a.stream("GET", "/me/conversations",
                                headers={**token(app), "Accept-Encoding": "gzip"}) as r:
                return r.headers, b"".join([b async for b in r.aiter_raw()])

    headers, raw = asyncio.run(get())
    assert headers["content-encoding"] == "gzip" and int(headers["content-length"]) == len(raw)
    assert len(json.loads(gzip.decompress(raw))) == 40
