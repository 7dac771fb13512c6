"""Kafka record → telemetry rows: each record type lands in the right table and columns."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime

from schemas.agent import DisplayEventRecorded, ModelCallRecorded, TelemetryEvent, ToolCallRecorded
from schemas.conversation import SendMessage
from schemas.workflow import (
    StepFailed,
    StepStarted,
    StepSucceeded,
    WorkflowCompleted,
    WorkflowPaused,
    WorkflowStarted,
)
from streams.envelope import Envelope, encode
from streams.sealing import MemoryKeyStore, Sealer
from telemetry.rows import BLOB_THRESHOLD, KindCache, RawRecord, map_record

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
SECRET = "my landlord ignores the mould in flat 4B"


def raw(record, topic="voice.agent", offset=7, key="wf-1", **env) -> RawRecord:
    k, v, h = encode(Envelope(record=record, key=key, source="/voice/test", time=T0, **env))
    return RawRecord(topic, 2, offset, k, v, h, 1_700_000_000_000)


def model_call(**kw) -> ModelCallRecorded:
    values = dict(workflow="wf-1", call_id="call-1", agent_name="extractor", iteration=1,
                  request_model="claude-x", response_model="claude-x-2025", input_tokens=120,
                  output_tokens=30, cache_read_input_tokens=100, cache_creation_input_tokens=5,
                  finish_reasons=["tool_use"], latency_ms=812.5, cost_usd=0.0123,
                  fallback_used=True, conversation_id="cnv-1", trace_id="t" * 32,
                  span_id="s" * 16)
    values.update(kw)
    return ModelCallRecorded(**values)


def test_model_call_maps_to_events_and_model_calls_with_otel_columns():
    r = raw(model_call(), seq=4, tenant="acme", correlation="req-1", causation="c-0")
    rows = map_record(r)
    [ev] = rows.as_dicts("events")
    assert ev["ce_type"] == "voice.agent.model_call.v1"
    assert (ev["topic"], ev["partition"], ev["offset"]) == ("voice.agent", 2, 7)
    assert (ev["aggregate_key"], ev["seq"], ev["tenant"]) == ("wf-1", 4, "acme")
    assert (ev["correlation"], ev["causation"], ev["source"]) == ("req-1", "c-0", "/voice/test")
    assert ev["time"] == T0 and ev["decode_error"] is None
    assert ev["payload"] == r.value.decode() and ev["payload_encoding"] == "json"
    assert ev["payload_bytes"] == len(r.value) and ev["payload_blob_id"] is None
    assert ev["headers"]["ce_type"] == "voice.agent.model_call.v1"
    [mc] = rows.as_dicts("model_calls")
    assert mc["event_id"] == ev["event_id"] and mc["time"] == T0
    assert (mc["operation_name"], mc["provider_name"]) == ("chat", "anthropic")
    assert (mc["request_model"], mc["response_model"]) == ("claude-x", "claude-x-2025")
    assert (mc["input_tokens"], mc["output_tokens"]) == (120, 30)
    assert (mc["cache_read_input_tokens"], mc["cache_creation_input_tokens"]) == (100, 5)
    assert mc["finish_reasons"] == ["tool_use"] and mc["fallback_used"] is True
    assert (mc["latency_ms"], mc["cost_usd"]) == (812.5, 0.0123)
    assert (mc["conversation_id"], mc["agent_name"], mc["workflow"]) == ("cnv-1", "extractor",
                                                                         "wf-1")
    assert (mc["trace_id"], mc["span_id"], mc["tenant"]) == ("t" * 32, "s" * 16, "acme")
    assert set(rows.tables) == {"events", "model_calls"}


def test_tool_call_maps_envelope_and_kinds():
    rec = ToolCallRecorded(workflow="wf-1", tool_call_id="tc-9", tool_name="lookup_issue",
                           agent_name="extractor", envelope="hint", hint_kind="ambiguous",
                           duration_ms=42.0, conversation_id="cnv-1",
                           arguments={"q": "x"}, result={"hint": "narrow it"})
    [tc] = map_record(raw(rec)).as_dicts("tool_calls")
    assert (tc["tool_name"], tc["tool_call_id"], tc["operation_name"]) == (
        "lookup_issue", "tc-9", "execute_tool")
    assert (tc["envelope"], tc["hint_kind"], tc["err_kind"]) == ("hint", "ambiguous", None)
    assert tc["duration_ms"] == 42.0 and tc["workflow"] == "wf-1"


def test_workflow_records_map_to_steps_and_kind_is_learnt():
    kinds = KindCache()
    recs = [
        WorkflowStarted(workflow="wf-1", kind="conversation-turn"),
        StepStarted(workflow="wf-1", step="agent", attempt=1, worker="w1"),
        StepFailed(workflow="wf-1", step="agent", attempt=1, error="boom", error_type="Timeout"),
        StepSucceeded(workflow="wf-1", step="agent", attempt=2),
        WorkflowPaused(workflow="wf-1", step="review", waiting_for="review"),
        WorkflowCompleted(workflow="wf-1"),
    ]
    out = [map_record(raw(r, topic="voice.workflows", offset=i, seq=i + 1), kinds)
           .as_dicts("workflow_steps")[0] for i, r in enumerate(recs)]
    assert [(o["scope"], o["status"], o["step"]) for o in out] == [
        ("workflow", "started", ""), ("step", "started", "agent"), ("step", "failed", "agent"),
        ("step", "succeeded", "agent"), ("step", "paused", "review"),
        ("workflow", "completed", ""),
    ]
    assert {o["kind"] for o in out} == {"conversation-turn"}
    assert out[2]["error"] == "boom" and out[2]["error_type"] == "Timeout"
    assert out[2]["retryable"] is True and out[3]["attempt"] == 2
    assert out[1]["worker"] == "w1" and out[4]["waiting_for"] == "review"
    assert [o["seq"] for o in out] == [1, 2, 3, 4, 5, 6]
    # Without the start seen (a restarted sink), the kind is left for the views to join in.
    [o] = map_record(raw(recs[1], topic="voice.workflows"), KindCache()).as_dicts("workflow_steps")
    assert o["kind"] == ""


def test_other_records_are_events_only():
    for rec in (TelemetryEvent(name="label", attributes={"k": 1}),
                DisplayEventRecorded(workflow="wf-1", event_id="e1", type="done")):
        rows = map_record(raw(rec))
        assert set(rows.tables) == {"events"}


def test_dead_lettered_copy_is_counted_in_events_only():
    rows = map_record(raw(model_call(), topic="voice.agent.dlq"))
    assert set(rows.tables) == {"events"}


def test_garbage_is_an_undecodable_event_row_never_an_exception():
    bad = RawRecord("voice.commands", 0, 3, b"k", b"\xff\x00garbage", [], 1_700_000_000_000)
    [ev] = map_record(bad).as_dicts("events")
    assert ev["ce_type"] == "undecodable" and "ce_specversion" in ev["decode_error"]
    assert ev["payload_encoding"] == "base64"
    assert base64.b64decode(ev["payload"]) == b"\xff\x00garbage"  # nothing lost
    assert ev["time"] == datetime.fromtimestamp(1_700_000_000, UTC)
    # CloudEvents headers but an unknown type: the reason says so.
    k, v, h = encode(Envelope(record=TelemetryEvent(name="x"), key="k", source="/s"))
    h = [(n, b"voice.nope.v1" if n == "ce_type" else val) for n, val in h]
    [ev] = map_record(RawRecord("voice.telemetry", 0, 1, k, v, h)).as_dicts("events")
    assert ev["ce_type"] == "undecodable" and "unknown record type" in ev["decode_error"]
    assert ev["event_id"] and ev["payload_encoding"] == "text"
    # No key, no value, no headers at all.
    [ev] = map_record(RawRecord("voice.acks", 0, 0, None, None)).as_dicts("events")
    assert ev["ce_type"] == "undecodable" and ev["payload_bytes"] == 0


def test_big_payload_goes_to_a_blob_row_untruncated():
    rec = TelemetryEvent(name="big", attributes={"blob": "x" * BLOB_THRESHOLD})
    r = raw(rec, offset=11)
    rows = map_record(r)
    [ev], [blob] = rows.as_dicts("events"), rows.as_dicts("event_blobs")
    assert ev["payload_blob_id"] == blob["blob_id"] == "voice.agent/2/11"
    assert blob["payload"] == r.value.decode() and blob["payload_bytes"] == len(r.value)
    assert blob["event_id"] == ev["event_id"]
    pointer = json.loads(ev["payload"])
    assert pointer["blob_id"] == blob["blob_id"] and pointer["payload_bytes"] == len(r.value)
    assert ev["payload_encoding"] == "blob" and len(ev["payload"]) < 400
    # Just under the threshold stays inline.
    small = TelemetryEvent(name="b", attributes={"blob": "x" * (BLOB_THRESHOLD - 200)})
    assert set(map_record(raw(small)).tables) == {"events"}


def sealed_records() -> list[RawRecord]:
    """Records whose sealed parts hold ``SECRET``: a message, a model response, tool I/O."""
    sealer = Sealer(MemoryKeyStore())
    text = sealer.seal("cnv-1", "msg-1", SECRET)
    response = sealer.seal_json("cnv-1", "call-1", {"content": [{"type": "text",
                                                                  "text": SECRET}]})
    return [
        raw(SendMessage(conversation="cnv-1", message_id="msg-1", text=text),
            topic="voice.commands", key="cnv-1"),
        raw(model_call(response=response)),
        raw(ToolCallRecorded(workflow="wf-1", tool_call_id="t", tool_name="n", agent_name="a",
                             envelope="ok", arguments=text, result=response)),
    ]


def test_sealed_content_stays_sealed():
    for r in sealed_records():
        dump = json.dumps(map_record(r).tables, default=str)
        assert SECRET not in dump and SECRET.encode().hex() not in dump
        sealed = json.loads(r.value)
        blob = sealed.get("text") or sealed.get("response") or sealed.get("arguments")
        assert blob["ciphertext"] in dump  # the ciphertext is stored as produced
