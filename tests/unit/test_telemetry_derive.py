"""The contract: ClickHouse's derivation (``telemetry.derive``, fed by the sink's raw columns)
gives the same rows as the Python mapping (``telemetry.rows.map_record``), table by table, for
a sample of every record kind — decodable or not, big or small, sealed or plain, dead-lettered
copies and workflows whose start the sink saw or did not see.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from schemas.agent import (
    DisplayEventRecorded,
    ModelCallRecorded,
    ModelCallWithDisplay,
    TelemetryEvent,
    ToolCallRecorded,
)
from schemas.conversation import SendMessage
from schemas.workflow import (
    LastStepSucceeded,
    StepFailed,
    StepStarted,
    StepSucceeded,
    WorkflowCompleted,
    WorkflowFailed,
    WorkflowPaused,
    WorkflowResumed,
    WorkflowStarted,
)
from streams.envelope import Envelope, encode
from streams.sealing import MemoryKeyStore, Sealer
from telemetry.envelopes import Columns, verdict
from telemetry.rows import BLOB_THRESHOLD, KindCache, RawRecord, map_record
from telemetry.schema import column_names, ensure_schema
from telemetry.sink import TABLES
from telemetry.store import ClickHouseStore, TelemetrySettings, open_store

T0 = datetime(2025, 3, 1, 12, 0, 0, 123456, tzinfo=UTC)
SECRET = "the damp in the back bedroom of number 12"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[ClickHouseStore]:
    s = open_store(TelemetrySettings(state_dir=tmp_path, env="test", telemetry_query_port=0))
    ensure_schema(s)
    yield s
    s.close()


def samples() -> list[RawRecord]:
    """Every kind of record the sink meets, at distinct offsets."""
    sealer = Sealer(MemoryKeyStore())
    text = sealer.seal("cnv-1", "msg-1", SECRET)
    response = sealer.seal_json("cnv-1", "call-1", {"content": [{"type": "text",
                                                                  "text": SECRET}]})
    mc = dict(workflow="wf-1", call_id="call-1", agent_name="extractor", iteration=2,
              request_model="claude-x", response_model="claude-x-2025", input_tokens=120,
              output_tokens=30, cache_read_input_tokens=100, cache_creation_input_tokens=5,
              finish_reasons=["tool_use", "end_turn"], latency_ms=812.5, cost_usd=0.0123,
              fallback_used=True, conversation_id="cnv-1", trace_id="t" * 32, span_id="s" * 16)
    out: list[tuple[str, Any, dict[str, Any]]] = [
        ("voice.agent", ModelCallRecorded(**mc, response=response),
         {"seq": 4, "tenant": "acme", "correlation": "req-1", "causation": "c-0",
          "subject": "cnv-1"}),
        ("voice.agent", ModelCallRecorded(workflow="wf-2", call_id="c", agent_name="a",
                                          iteration=1, request_model="m", latency_ms=3,
                                          error_type="overloaded"), {}),
        ("voice.agent", ToolCallRecorded(workflow="wf-1", tool_call_id="tc-9",
                                         tool_name="lookup_issue", agent_name="extractor",
                                         envelope="hint", hint_kind="ambiguous",
                                         duration_ms=42.0, conversation_id="cnv-1",
                                         arguments=text, result=response), {"tenant": "acme"}),
        ("voice.agent", ToolCallRecorded(workflow="wf-1", tool_call_id="tc-10", tool_name="t",
                                         agent_name="a", envelope="err", err_kind="not_found"),
         {}),
        ("voice.workflows", StepStarted(workflow="wf-0", step="agent", attempt=1), {"seq": 1}),
        ("voice.workflows", WorkflowStarted(workflow="wf-1", kind="conversation-turn"),
         {"seq": 1}),
        ("voice.workflows", StepStarted(workflow="wf-1", step="agent", attempt=1, worker="w1"),
         {"seq": 2}),
        ("voice.workflows", StepFailed(workflow="wf-1", step="agent", attempt=1, error="boom",
                                       error_type="Timeout", retryable=False,
                                       sealed_error=text), {"seq": 3}),
        ("voice.workflows", StepSucceeded(workflow="wf-1", step="agent", attempt=2),
         {"seq": 4}),
        ("voice.workflows", WorkflowPaused(workflow="wf-1", step="review",
                                           waiting_for="review"), {"seq": 5}),
        ("voice.workflows", WorkflowResumed(workflow="wf-1", step="review"), {"seq": 6}),
        ("voice.workflows", WorkflowCompleted(workflow="wf-1"), {"seq": 7}),
        ("voice.workflows", WorkflowFailed(workflow="wf-3", step="agent", error="WorkerLost",
                                           attempts=3, error_type="WorkerLost"), {}),
        ("voice.agent.dlq", ModelCallRecorded(**mc), {}),
        ("voice.agent", TelemetryEvent(name="label", attributes={"k": 1}), {}),
        ("voice.agent", DisplayEventRecorded(workflow="wf-1", event_id="e1", type="done"), {}),
        ("voice.commands", SendMessage(conversation="cnv-1", message_id="msg-1", text=text),
         {"tenant": "acme"}),
        ("voice.agent", TelemetryEvent(name="big", attributes={"blob": "é" * BLOB_THRESHOLD}),
         {}),
        # Trace ids: a call's own, else its traceparent's; the header's only when valid.
        ("voice.agent", ModelCallRecorded(**{**mc, "trace_id": None, "span_id": None}),
         {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}),
        ("voice.agent", ToolCallRecorded(workflow="wf-1", tool_call_id="tc-11", tool_name="t",
                                         agent_name="a", envelope="ok"),
         {"traceparent": f"00-{'0' * 32}-{'cd' * 8}-01"}),
        ("voice.agent", ToolCallRecorded(workflow="wf-1", tool_call_id="tc-12", tool_name="t",
                                         agent_name="a", envelope="ok", trace_id="e" * 32),
         {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01"}),
        ("voice.agent", TelemetryEvent(name="tp-ff"),
         {"traceparent": f"ff-{'ab' * 16}-{'cd' * 8}-01"}),
        ("voice.agent", TelemetryEvent(name="tp-extra"),
         {"traceparent": f"00-{'ab' * 16}-{'cd' * 8}-01-more"}),
        ("voice.agent", TelemetryEvent(name="tp-future"),
         {"traceparent": f"01-{'ab' * 16}-{'cd' * 8}-01-more"}),
        ("voice.agent", TelemetryEvent(name="tp-upper"),
         {"traceparent": f"00-{'AB' * 16}-{'cd' * 8}-01"}),
        # A model call carrying display events: its model_calls row, its events row.
        ("voice.agent", ModelCallWithDisplay(
            **{**mc, "call_id": "call-2"}, response=response,
            display_before=[DisplayEventRecorded(workflow="wf-1", event_id="e0", type="busy")],
            display_after=[DisplayEventRecorded(workflow="wf-1", event_id="e2", type="done",
                                                data=text)]), {"tenant": "acme"}),
        # The last step's success and the workflow's end in one record: their two rows.
        ("voice.workflows", WorkflowStarted(workflow="wf-4", kind="conversation-turn"),
         {"seq": 1, "id": "wf-4:1"}),
        ("voice.workflows", LastStepSucceeded(workflow="wf-4", step="reply", attempt=1,
                                              output={"end_reason": "completed"}),
         {"seq": 2, "id": "wf-4:2"}),
    ]
    raws = []
    for i, (topic, record, env) in enumerate(out):
        k, v, h = encode(Envelope(record=record, key=f"key-{i}", source="/voice/test",
                                  time=T0, **env))
        raws.append(RawRecord(topic, i % 3, 100 + i, k, v, h, 1_700_000_000_000 + i))
    unknown = [(n, b"voice.nope.v1" if n == "ce_type" else val) for n, val in raws[14].headers]
    unknown.append(("traceparent", f"00-{'ab' * 16}-{'cd' * 8}-01".encode()))
    bad_payload = ModelCallRecorded(**mc).model_dump_json().replace('"iteration":2',
                                                                    '"iteration":0')
    n = len(raws)
    raws += [
        RawRecord("voice.commands", 0, n, b"k\xff", b"\xff\x00garbage", [], 1_700_000_000_000),
        RawRecord("voice.telemetry", 1, n + 1, raws[14].key, raws[14].value, unknown, 1),
        RawRecord("voice.acks", 0, n + 2, None, None, (), 1_700_000_000_002),
        RawRecord("voice.agent", 2, n + 3, b"k", bad_payload.encode(), raws[0].headers, 3),
        RawRecord("voice.agent", 2, n + 4, b"k", b"\xfe" * (BLOB_THRESHOLD + 1),
                  [("ce_specversion", b"1.0"), ("x", None), ("y", b"\xffz")], 4),
        RawRecord("voice.agent", 2, n + 5, raws[0].key, raws[0].value,
                  [(n, b"later" if n == "ce_time" else val) for n, val in raws[0].headers], 5),
        # A header repeated without a value: decode() reads the one with a value, and so
        # must the sink's quick check (a bad time stays bad; a seq stays the first one's).
        RawRecord("voice.agent", 2, n + 6, raws[0].key, raws[0].value,
                  [(n, b"later" if n == "ce_time" else val) for n, val in raws[0].headers]
                  + [("ce_time", None)], 6),
        # Two header values, each invalid UTF-8, that would make one valid character joined.
        RawRecord("voice.agent", 1, n + 8, raws[14].key, raws[14].value,
                  [*raws[14].headers, ("half", b"\xc3"), ("other-half", b"\xa9")], 8),
        RawRecord("voice.workflows", 2, n + 7, raws[4].key, raws[4].value,
                  [(n, b"id-seq-twice" if n == "ce_id" else val) for n, val in raws[4].headers]
                  + [("voice_seq", None)], 7),
    ]
    return raws


def python_rows(raws: list[RawRecord]) -> dict[str, list[dict[str, Any]]]:
    kinds = KindCache()
    out: dict[str, list[dict[str, Any]]] = {t: [] for t in TABLES}
    for raw in raws:
        rows = map_record(raw, kinds)
        for table in TABLES:
            out[table] += rows.as_dicts(table)
    return out


def clickhouse_rows(store: ClickHouseStore, raws: list[RawRecord]
                    ) -> dict[str, list[dict[str, Any]]]:
    kinds, cols = KindCache(), Columns()
    for raw in raws:
        cols.add_raw(raw, verdict(raw.topic, raw.key, raw.value, raw.headers, kinds))
    store.insert_arrow("voice.envelopes", cols.arrow(), token="contract")
    out = {}
    for table in TABLES:
        names = column_names(table)
        res = store.query(f"SELECT {', '.join(f'`{c}`' for c in names)} FROM voice.{table}")
        out[table] = [dict(zip(names, r, strict=True)) for r in res.rows]
    return out


def _normal(table: str, row: dict[str, Any]) -> dict[str, Any]:
    row = dict(row)
    t = row.get("time")
    if t is not None:
        row["time"] = t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)
    return row


def _sorted(table: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    key = "offset" if table in ("events", "event_blobs") else "event_id"
    return sorted((_normal(table, r) for r in rows), key=lambda r: str(r[key]))


def test_clickhouse_derives_the_rows_the_python_mapping_makes(store):
    raws = samples()
    expected, got = python_rows(raws), clickhouse_rows(store, raws)
    for table in TABLES:
        want, have = _sorted(table, expected[table]), _sorted(table, got[table])
        assert len(have) == len(want), table
        for w, h in zip(want, have, strict=True):
            assert h == w, f"{table}: {set(k for k in w if w[k] != h.get(k))}"
    # Every kind was there to compare.
    assert {len(expected[t]) > 0 for t in TABLES} == {True}
    assert sum(1 for r in expected["events"] if r["ce_type"] == "undecodable") == 7
    assert sum(1 for r in expected["events"] if r["trace_id"]) == 4  # the views' share too
    # A LastStepSucceeded makes the rows its two v1 records made, under two ids.
    wf4 = sorted((r["scope"], r["step"], r["attempt"], r["status"], r["event_id"])
                 for r in got["workflow_steps"] if r["workflow"] == "wf-4")
    assert wf4 == [("step", "reply", 1, "succeeded", "wf-4:2"),
                   ("workflow", "", None, "completed", "wf-4:2/completed"),
                   ("workflow", "", None, "started", "wf-4:1")], wf4


def test_the_derivation_keeps_sealed_content_sealed(store):
    raws = samples()
    got = clickhouse_rows(store, raws)
    for table in ("model_calls", "tool_calls", "workflow_steps"):
        assert SECRET not in json.dumps(got[table], default=str)
    dump = json.dumps(got, default=str)
    assert SECRET not in dump and SECRET.encode().hex() not in dump


def test_migration_4_gives_a_version_3_store_the_rows_of_the_new_workflow_records(store):
    """A store whose views predate ``LastStepSucceeded`` and ``ModelCallWithDisplay``
    (migration 3) gets the views that read them, and then their rows."""
    from telemetry.derive import DERIVATIONS, view_name

    for table, new in (("workflow_steps", LastStepSucceeded), ("model_calls",
                                                              ModelCallWithDisplay)):
        old = DERIVATIONS[table].replace(new.ce_type, "voice.none.v1")
        store.command(f"DROP VIEW {view_name(table)}")
        store.command(f"CREATE MATERIALIZED VIEW {view_name(table)} TO voice.{table} AS {old}")
    store.command("ALTER TABLE voice.schema_migrations DELETE WHERE version = 4")
    assert ensure_schema(store) == [4]
    env = Envelope(record=LastStepSucceeded(workflow="wf-9", step="reply", attempt=2),
                   key="wf-9", source="/voice/test", seq=3, id="wf-9:3", time=T0)
    call = Envelope(record=ModelCallWithDisplay(workflow="wf-9", call_id="c", agent_name="a",
                                                iteration=1, request_model="m"),
                    key="wf-9", source="/voice/test", id="wf-9/a1/c", time=T0)
    got = clickhouse_rows(store, [RawRecord("voice.workflows", 0, 1, *encode(env), 1),
                                  RawRecord("voice.agent", 0, 1, *encode(call), 1)])
    assert sorted((r["event_id"], r["status"]) for r in got["workflow_steps"]) == [
        ("wf-9:3", "succeeded"), ("wf-9:3/completed", "completed")]
    assert [r["event_id"] for r in got["model_calls"]] == ["wf-9/a1/c"]


def test_migration_5_swaps_the_fact_views_in_place(store):
    """A version-4 store's fact views (one ``JSONExtract`` a field) take the views of the code
    (one parse a payload) in place: ``MODIFY QUERY``, no view dropped meanwhile."""
    from telemetry.derive import DERIVATIONS, view_name

    facts = ("model_calls", "tool_calls", "workflow_steps")
    for table in facts:  # views that take none of the samples: the migration must replace them
        old = DERIVATIONS[table].replace("decode_error IS NULL", "decode_error = 'never'")
        store.command(f"ALTER TABLE {view_name(table)} MODIFY QUERY {old}")
    store.command("ALTER TABLE voice.schema_migrations DELETE WHERE version = 5")
    assert ensure_schema(store) == [5]
    raws = samples()
    expected, got = python_rows(raws), clickhouse_rows(store, raws)
    for table in facts:
        assert _sorted(table, got[table]) == _sorted(table, expected[table]), table
