"""Tracing across the real stack: a ``traceparent`` sent to the edge reaches the worker's model
calls, their spans are exported over OTLP/HTTP, and ClickHouse's ``trace_id``/``span_id``
columns name them.

The edge and the worker are ``voice`` processes on the session broker; the worker's
``OTEL_EXPORTER_OTLP_ENDPOINT`` points at a small OTLP/HTTP receiver in this test (the
protobuf decoded with ``opentelemetry-proto``); the telemetry sink runs in-process on its
embedded ClickHouse.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from api.frame.commands import EDGE_SOURCE
from streams.envelope import Envelope, decode
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, topic_name
from streams.tracing import ids_of
from telemetry.sink import Sink
from telemetry.store import telemetry_settings
from tests.support import read_all, wait_for

pytestmark = pytest.mark.integration

TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPANS = ("b7ad6b7169203331", "c7ad6b7169203332")


class Collector:
    """An OTLP/HTTP trace receiver: every span it is sent, as (trace id, span id, name)."""

    def __init__(self) -> None:
        self.spans: list[tuple[str, str, str, str]] = []
        self._lock = threading.Lock()
        collector = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                request = ExportTraceServiceRequest.FromString(body)
                with collector._lock:
                    for rs in request.resource_spans:
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                collector.spans.append((s.trace_id.hex(), s.span_id.hex(),
                                                        s.parent_span_id.hex(), s.name))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def of_trace(self, trace_id: str) -> list[tuple[str, str, str, str]]:
        with self._lock:
            return [s for s in self.spans if s[0] == trace_id]


@pytest.fixture
def collector() -> Iterator[Collector]:
    c = Collector()
    yield c
    c.server.shutdown()


def headers(settings: VoiceSettings, traceparent: str | None) -> dict[str, str]:
    h = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    if traceparent is not None:
        h["traceparent"] = traceparent
    return h


def test_a_requests_trace_reaches_the_model_calls_their_spans_and_clickhouse(
        settings: VoiceSettings, start_worker, start_edge, collector: Collector) -> None:  # noqa: ANN001
    start_worker(OTEL_EXPORTER_OTLP_ENDPOINT=collector.url, OTEL_BSP_SCHEDULE_DELAY="200")
    url = start_edge()
    r = httpx.post(f"{url}/me/conversations", timeout=20,
                   headers=headers(settings, f"00-{TRACE}-{CALLER_SPANS[0]}-01"))
    assert r.status_code == 201, r.text
    cnv = r.json()["conversation"]
    r = httpx.post(f"{url}/me/conversations/{cnv}/messages", json={
        "text": "The streetlights on Oak Street have been out for a week."}, timeout=20,
        headers=headers(settings, f"00-{TRACE}-{CALLER_SPANS[1]}-01"))
    assert r.status_code == 202, r.text

    # The edge's commands carry the caller's trace, each under the edge's own request span.
    # (The worker may already have submitted its own commands for the turn: only the edge's
    # two are counted, and the worker's too must be of the request's trace.)
    cmds = [decode(m.key(), m.value(), m.headers())
            for m in read_all(settings, topic_name(settings, COMMANDS))
            if m.key() == cnv.encode()]
    assert len([c for c in cmds if c.source == EDGE_SOURCE]) == 2, cmds
    for cmd in cmds:
        trace_id, span_id = ids_of(cmd.traceparent)
        assert trace_id == TRACE and span_id not in CALLER_SPANS, cmd

    # The worker continues it down to each model call, and exports the spans.
    def exported() -> list[tuple[str, str, str, str]] | None:
        spans = collector.of_trace(TRACE)
        names = {s[3] for s in spans}
        chats = any(n.startswith("chat ") for n in names)
        return spans if chats and any(n.startswith("invoke_agent ") for n in names) else None

    spans = wait_for(exported, timeout=120, what="the worker's spans of the request's trace")
    by_id = {s[1]: s for s in spans}
    chats = [s for s in spans if s[3].startswith("chat ")]
    for chat in chats:  # under an agent span, itself under a ``process`` span of a record
        agent = by_id.get(chat[2])
        assert agent is not None and agent[3].startswith("invoke_agent "), (chat, spans)
    assert any(s[3].startswith("process ") for s in spans)

    # The sink fills the columns from the records' headers: each row names its call's span.
    sink = Sink(telemetry_settings(settings).model_copy(update={
        "telemetry_flush_ms": 300, "telemetry_query_port": 0}))
    try:
        def rows() -> list[tuple] | None:
            sink.poll_once(timeout=0.2)
            sink.flush()
            found = sink.store.query(
                "SELECT trace_id, span_id, request_model FROM voice.model_calls FINAL "
                f"WHERE conversation_id = '{cnv}'").rows
            return found or None

        found = wait_for(rows, timeout=120, what="the turn's model_calls rows")
        assert {t for t, _s, _m in found} == {TRACE}, found
        want = {span_id: model for _t, span_id, model in found}

        def all_exported() -> dict[str, str] | None:
            names = {x[1]: x[3] for x in collector.of_trace(TRACE)}
            return names if set(want) <= set(names) else None

        names = wait_for(all_exported, timeout=60, what="the exported spans of the rows")
        assert all(names[span_id] == f"chat {model}" for span_id, model in want.items())
        tools = sink.store.query("SELECT trace_id, span_id FROM voice.tool_calls FINAL "
                                 f"WHERE conversation_id = '{cnv}'").rows
        assert all(t == TRACE and s for t, s in tools), tools
        # Every kind of record of the request is found by its trace id: the commands, the
        # conversation's log, the workflow's, the turn's calls.
        traced = {r[0] for r in sink.store.query(
            f"SELECT ce_type FROM voice.events FINAL WHERE trace_id = '{TRACE}'").rows}
        assert {"voice.conversation.send_message.v1", "voice.workflow.started.v1"} <= traced, traced
        # The message is recorded alone, or (since the folded records) opening its turn.
        assert {"voice.conversation.message_recorded.v1",
                "voice.conversation.turn_opened.v1"} & traced, traced
        assert {"voice.agent.model_call.v1", "voice.agent.model_call.v2"} & traced, traced
    finally:
        sink.close()

    # A request without a traceparent, or with one that is not valid, starts a new trace.
    for traceparent in (None, "00-not-a-trace-01"):
        r = httpx.post(f"{url}/me/conversations", headers=headers(settings, traceparent),
                       timeout=20)
        assert r.status_code == 201, r.text
        fresh = decode_command(settings, r.json()["conversation"])
        trace_id, span_id = ids_of(fresh.traceparent)
        assert trace_id is not None and span_id is not None and trace_id != TRACE


def decode_command(settings: VoiceSettings, key: str) -> Envelope:
    [cmd] = [decode(m.key(), m.value(), m.headers())
             for m in read_all(settings, topic_name(settings, COMMANDS))
             if m.key() == key.encode()]
    return cmd
