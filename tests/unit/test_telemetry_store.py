"""The store contract on the embedded adapter (chDB in tmp_path), dedupe, and read-only SQL.

chDB hosts one engine path per process, so every store opened here is closed by its fixture
before the next test opens another folder.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from schemas.agent import ModelCallRecorded, TelemetryEvent
from schemas.workflow import StepStarted, StepSucceeded, WorkflowStarted
from streams.envelope import Envelope, encode
from streams.sealing import MemoryKeyStore, Sealer
from telemetry.endpoint import EndpointRefused, QueryServer, ask_endpoint
from telemetry.query import SqlRefused, check_read_only, client_token, render, run_sql
from telemetry.rows import BLOB_THRESHOLD, RawRecord, Rows, map_record
from telemetry.schema import COLUMNS, VIEWS, column_names, create_table_sql, ensure_schema
from telemetry.sink import TABLES
from telemetry.store import (
    ClickHouseStore,
    TelemetrySettings,
    embedded_path,
    open_store,
    telemetry_settings,
)

T0 = datetime(2025, 3, 1, 12, 0, 0, 250000, tzinfo=UTC)
SECRET = "the rent arrears letter from May"


@pytest.fixture
def tsettings(tmp_path: Path) -> TelemetrySettings:
    return TelemetrySettings(state_dir=tmp_path, env="test", telemetry_query_port=0)


@pytest.fixture
def store(tsettings: TelemetrySettings) -> Iterator[ClickHouseStore]:
    s = open_store(tsettings)
    ensure_schema(s)
    yield s
    s.close()


def raw(record, offset: int, topic: str = "voice.agent", key: str = "wf-1") -> RawRecord:
    k, v, h = encode(Envelope(record=record, key=key, source="/voice/test", time=T0))
    return RawRecord(topic, 0, offset, k, v, h, 1_700_000_000_000)


def model_call(i: int, **kw) -> ModelCallRecorded:
    return ModelCallRecorded(workflow=f"wf-{i}", call_id=f"c{i}", agent_name="extractor",
                             iteration=1, request_model="claude-x", input_tokens=100 + i,
                             output_tokens=10, cache_read_input_tokens=50,
                             finish_reasons=["end_turn"], latency_ms=100.0 + i, cost_usd=0.01,
                             **kw)


def insert(store: ClickHouseStore, rows: Rows, token: str | None) -> None:
    for table in TABLES:
        if rows.tables.get(table):
            store.insert(f"voice.{table}", column_names(table), rows.tables[table], token=token)


def count(store: ClickHouseStore, table: str, final: bool = False) -> int:
    return store.query(f"SELECT count() FROM voice.{table}{' FINAL' if final else ''}").rows[0][0]


def test_settings_extend_voice_settings(monkeypatch, tmp_path):
    from streams.settings import VoiceSettings

    monkeypatch.setenv("VOICE_TELEMETRY_BATCH_ROWS", "77")
    monkeypatch.setenv("VOICE_CLICKHOUSE_URL", "http://ch:8123")
    ts = telemetry_settings(VoiceSettings(state_dir=tmp_path, topic_prefix="p."))
    assert (ts.telemetry_batch_rows, ts.clickhouse_url, ts.topic_prefix) == (77, "http://ch:8123",
                                                                            "p.")
    assert (ts.telemetry_flush_ms, ts.telemetry_query_port) == (1000, 8124)
    assert embedded_path(ts) == tmp_path.resolve() / "clickhouse"


def test_schema_is_created_once_and_migrations_are_recorded(store):
    assert ensure_schema(store) == []  # the fixture applied version 1 already
    tables = {r[0] for r in store.query("SHOW TABLES FROM voice").rows}
    assert set(COLUMNS) | set(VIEWS) | {"schema_migrations"} <= tables
    for table, cols in COLUMNS.items():
        desc = store.query(f"DESCRIBE TABLE voice.{table}").rows
        assert [(d[0], d[1]) for d in desc] == list(cols)
    for view in VIEWS:
        res = store.query(f"SELECT * FROM voice.{view}")
        assert res.columns and res.rows == []  # empty, but the header is there


def test_migration_2_adds_the_trace_columns_to_a_version_1_events_table(store):
    # The store as version 1 left it: events without trace_id/span_id.
    v1 = tuple(c for c in COLUMNS["events"] if c[0] not in ("trace_id", "span_id"))
    store.command("DROP TABLE voice.events")
    store.command(create_table_sql("events").replace(
        ",\n  ".join(f"`{n}` {t}" for n, t in COLUMNS["events"]),
        ",\n  ".join(f"`{n}` {t}" for n, t in v1)))
    store.command("TRUNCATE TABLE voice.schema_migrations")
    store.insert("voice.schema_migrations", ["version"], [[1]])
    assert [d[0] for d in store.query("DESCRIBE TABLE voice.events").rows] == [n for n, _ in v1]
    # 3: the envelopes table and its views; 4: workflow_steps' view again (both idempotent)
    assert ensure_schema(store) == [2, 3, 4, 5]
    desc = store.query("DESCRIBE TABLE voice.events").rows
    assert [(d[0], d[1]) for d in desc] == list(COLUMNS["events"])
    assert ensure_schema(store) == []  # once


def test_rows_round_trip_through_the_store(store):
    rows = Rows()
    for i, rec in enumerate([model_call(1), WorkflowStarted(workflow="wf-1",
                                                            kind="conversation-turn")]):
        rows.extend(map_record(raw(rec, i)))
    insert(store, rows, token=None)
    ev = store.query("SELECT ce_type, time, offset, headers['ce_type'] FROM voice.events "
                     "ORDER BY offset").rows
    assert [e[0] for e in ev] == ["voice.agent.model_call.v1", "voice.workflow.started.v1"]
    assert ev[0][1].replace(tzinfo=UTC) == T0  # DateTime64(6, 'UTC') keeps microseconds
    mc = store.query("SELECT request_model, input_tokens, finish_reasons FROM voice.model_calls")
    assert mc.rows == [("claude-x", 101, ["end_turn"])]


def test_retried_insert_with_the_same_token_does_not_duplicate(store):
    rows = Rows()
    for i in range(50):
        rows.extend(map_record(raw(model_call(i), i)))
    insert(store, rows, token="batch-a")
    insert(store, rows, token="batch-a")  # the retry: engine drops it (raw counts, no FINAL)
    assert count(store, "events") == 50 and count(store, "model_calls") == 50
    # Without a matching token (a re-read cut into other batches) the sorting key collapses
    # them: FINAL sees each once at once, and merging removes the copies for good.
    insert(store, rows, token="batch-b")
    assert count(store, "events") == 100
    assert count(store, "events", final=True) == 50
    assert count(store, "model_calls", final=True) == 50
    assert store.query("SELECT sum(calls) FROM voice.tokens_cost_per_model_day").rows == [(50,)]
    store.command("OPTIMIZE TABLE voice.events FINAL")
    assert count(store, "events") == 50


def test_big_payload_round_trips_whole(store):
    rec = TelemetryEvent(name="big", attributes={"blob": "y" * (3 * BLOB_THRESHOLD)})
    r = raw(rec, 5)
    insert(store, map_record(r), token="t")
    (payload, blob_id), = store.query("SELECT payload, payload_blob_id FROM voice.events").rows
    (whole,), = store.query(f"SELECT payload FROM voice.event_blobs WHERE blob_id = '{blob_id}'"
                            ).rows
    assert whole == r.value.decode() and json.loads(payload)["blob_id"] == blob_id


def test_sealed_plaintext_never_reaches_clickhouse(store):
    sealer = Sealer(MemoryKeyStore())
    response = sealer.seal_json("cnv-1", "call-1", {"content": [{"type": "text",
                                                                  "text": SECRET}]})
    insert(store, map_record(raw(model_call(1, response=response, conversation_id="cnv-1"), 0)),
           token="s")
    hits = 0
    for table, cols in COLUMNS.items():
        for name, typ in cols:
            if "String" in typ and "Array" not in typ and "Map" not in typ:
                hits += store.query(f"SELECT countIf(position(ifNull(`{name}`, ''), "
                                    f"'{SECRET}') > 0) FROM voice.{table}").rows[0][0]
    assert hits == 0
    (n,), = store.query(f"SELECT countIf(position(payload, '{response.ciphertext}') > 0) "
                        "FROM voice.events").rows
    assert n == 1  # the sealed blob is stored as produced


def test_views_compute_turns_tokens_tools_failures(store):
    from schemas.agent import ToolCallRecorded
    from schemas.workflow import StepFailed

    recs = [WorkflowStarted(workflow="wf-1", kind="conversation-turn"),
            StepStarted(workflow="wf-1", step="agent", attempt=1)]
    rows = Rows()
    for i, rec in enumerate(recs):
        rows.extend(map_record(raw(rec, i, topic="voice.workflows")))
    k, v, h = encode(Envelope(record=StepSucceeded(workflow="wf-1", step="agent", attempt=1),
                              key="wf-1", source="/t", time=T0.replace(second=2)))
    rows.extend(map_record(RawRecord("voice.workflows", 0, 9, k, v, h)))
    rows.extend(map_record(raw(StepFailed(workflow="wf-2", step="s", attempt=1, error="x",
                                          error_type="Boom"), 10, topic="voice.workflows")))
    for i, env in enumerate(["ok", "ok", "err"]):
        rows.extend(map_record(raw(ToolCallRecorded(
            workflow="wf-1", tool_call_id=f"t{i}", tool_name="lookup", agent_name="a",
            envelope=env, err_kind="not_found" if env == "err" else None), 20 + i)))
    rows.extend(map_record(raw(model_call(1), 30)))
    insert(store, rows, token="v")
    (hour, turns, p50, *_), = store.query("SELECT * FROM voice.turns_per_hour").rows
    assert turns == 1 and p50 == pytest.approx(2000.0)  # 12:00:00.25 → 12:00:02.25
    tools = store.query("SELECT envelope, kind, calls, share_of_tool "
                        "FROM voice.tool_envelopes_per_tool").rows
    assert tools == [("err", "not_found", 1, pytest.approx(0.3333)), ("ok", "", 2,
                                                                      pytest.approx(0.6667))]
    fails = store.query("SELECT workflow, step, error_type FROM voice.workflow_failures").rows
    assert fails == [("wf-2", "s", "Boom")]
    (day, provider, model, calls, tin, *_), = store.query(
        "SELECT * FROM voice.tokens_cost_per_model_day").rows
    assert (provider, model, calls, tin) == ("anthropic", "claude-x", 1, 101)


def test_turns_per_hour_times_a_first_attempt_from_its_workflows_start(store):
    """Issue 14: a turn's first attempt has no StepStarted (its workflow's start is its start)
    and its success is a LastStepSucceeded; a retry keeps its StepStarted."""
    from schemas.workflow import LastStepSucceeded

    def at(record, offset: int, seconds: float) -> RawRecord:
        k, v, h = encode(Envelope(record=record, key=record.workflow, source="/t",
                                  time=T0 + timedelta(seconds=seconds), id=f"x{offset}"))
        return RawRecord("voice.workflows", 0, offset, k, v, h)

    rows = Rows()
    for r in (at(WorkflowStarted(workflow="wf-new", kind="conversation-turn"), 1, 0),
              at(LastStepSucceeded(workflow="wf-new", step="reply", attempt=1), 2, 3),
              at(WorkflowStarted(workflow="wf-retry", kind="conversation-turn"), 3, 0),
              at(StepStarted(workflow="wf-retry", step="reply", attempt=2), 4, 10),
              at(LastStepSucceeded(workflow="wf-retry", step="reply", attempt=2), 5, 11)):
        rows.extend(map_record(r))
    insert(store, rows, token="n")
    (_hour, turns, p50, *_), = store.query("SELECT * FROM voice.turns_per_hour").rows
    assert turns == 2 and p50 == pytest.approx(2000.0)  # 3 s and 1 s: the median of two
    done = store.query("SELECT workflow, scope, status FROM voice.workflow_steps FINAL "
                       "WHERE status IN ('succeeded', 'completed') ORDER BY workflow, scope"
                       ).rows
    assert done == [("wf-new", "step", "succeeded"), ("wf-new", "workflow", "completed"),
                    ("wf-retry", "step", "succeeded"), ("wf-retry", "workflow", "completed")]


def test_read_only_store_and_statement_check(tsettings, store):
    reader = open_store(tsettings, readonly=True)  # same process, same path: shared engine
    try:
        assert reader.query("SELECT count() FROM voice.events").rows == [(0,)]
        for sql in ("INSERT INTO voice.events (event_id) VALUES ('x')",
                    "DROP TABLE voice.events", "SELECT * FROM file('/etc/passwd', 'LineAsString')",
                    "SELECT 1 SETTINGS readonly = 0"):
            with pytest.raises(Exception, match="(?i)readonly"):
                reader.query(sql)
        store.insert("voice.schema_migrations", ["version"], [[99]])  # writer unaffected
    finally:
        reader.close()
    for ok in ("SELECT 1", "  with x AS (SELECT 1) SELECT * FROM x;", "SHOW TABLES",
               "-- note\nDESCRIBE voice.events", "(SELECT 1)", "/* c */ select 2"):
        assert check_read_only(ok)
    for bad in ("INSERT INTO t VALUES (1)", "DROP TABLE voice.events", "", "-- only comment",
                "OPTIMIZE TABLE voice.events", "SYSTEM SHUTDOWN", "ALTER TABLE x DELETE WHERE 1"):
        with pytest.raises(SqlRefused):
            check_read_only(bad)


def test_render_formats():
    res = {"columns": ["model", "calls", "reasons"],
           "rows": [["claude-x", 12, ["end_turn"]], ["c", 3, None]]}
    table = render(res, "table").splitlines()
    assert table[0] == "model     calls  reasons"
    assert table[2] == "claude-x     12  [\"end_turn\"]"
    assert table[3].startswith("c             3  NULL") and table[-1] == "(2 rows)"
    assert json.loads(render(res, "json")) == [
        {"model": "claude-x", "calls": 12, "reasons": ["end_turn"]},
        {"model": "c", "calls": 3, "reasons": None}]
    assert render(res, "csv").splitlines() == ["model,calls,reasons",
                                               'claude-x,12,"[""end_turn""]"', "c,3,"]
    assert render({"columns": ["x"], "rows": []}, "json") == "[]"


def test_run_sql_through_the_endpoint_and_without_it(tsettings, store):
    insert(store, map_record(raw(model_call(1), 0)), token="q")
    server = QueryServer(tsettings, open_store(tsettings, readonly=True)).start()
    ts = tsettings.model_copy(update={"telemetry_query_port": server.port})
    try:
        out = run_sql(ts, "SELECT request_model, input_tokens FROM voice.model_calls", "json")
        assert json.loads(out) == [{"request_model": "claude-x", "input_tokens": 101}]
        out = run_sql(ts, "SELECT time FROM voice.events", "csv")
        assert out.splitlines()[1] == "2025-03-01T12:00:00.250000+00:00"
        with pytest.raises(EndpointRefused) as err:  # the server checks too, not only run_sql
            ask_endpoint(ts, "DROP TABLE voice.events", client_token(ts))
        assert err.value.status == 400 and "only read statements" in str(err.value)
        with pytest.raises(SqlRefused):
            run_sql(ts, "TRUNCATE TABLE voice.events")
        assert count(store, "events") == 1
    finally:
        server.stop()
    store.close()  # no sink now: run_sql opens the folder itself
    t0 = time.monotonic()
    out = run_sql(ts, "SELECT count() AS n FROM voice.events", "table")
    assert out.splitlines()[:3] == ["n", "-", "1"], out
    assert time.monotonic() - t0 < 30


def test_server_adapter_unreachable_is_a_clear_error(tmp_path):
    from deploy.kafka_local import free_port
    from telemetry.store import StoreUnavailable

    url = f"http://voice:s3cret@127.0.0.1:{free_port()}"
    ts = TelemetrySettings(state_dir=tmp_path, env="test", clickhouse_url=url)
    with pytest.raises(StoreUnavailable) as err:
        run_sql(ts, "SELECT 1")
    assert "127.0.0.1" in str(err.value) and "s3cret" not in str(err.value)
    assert not embedded_path(ts).exists()  # the server URL wins: no embedded folder made


def test_a_store_failing_as_a_whole_is_unavailable_a_refusal_of_rows_is_not() -> None:
    """A full disk (as chDB and a server say it) is waited for: before, the sink took it for
    a refusal of the rows and dead-lettered every record of the batch."""
    from clickhouse_connect.driver.exceptions import DatabaseError

    from telemetry.store import store_error, unavailable

    full = DatabaseError("Code: 243. DB::Exception: Cannot reserve 1.00 MiB, not enough "
                         "space. (NOT_ENOUGH_SPACE)")
    assert unavailable(full) and store_error(full) == "DatabaseError (ClickHouse code 243)"
    refused = DatabaseError("Code: 27. DB::Exception: Cannot parse input: expected ',' "
                            "before: 'zqxsecret'. (CANNOT_PARSE_INPUT_ASSERTION_FAILED)")
    assert not unavailable(refused)
    assert store_error(refused) == "DatabaseError (ClickHouse code 27)"  # no quoted values
    assert unavailable(ConnectionError("refused"))
