"""The telemetry sink against a real Kafka broker (the session broker of tests/conftest.py).

Proves: every kind of record lands in its table; offsets are committed only after the insert
(a fresh reader of the group's committed offsets sees none after a failed insert); a sink that
dies between insert and commit, or is SIGKILLed, re-reads on restart without duplicating rows;
``voice sql`` reaches a running sink's store through its loopback endpoint, with a token (the
endpoint refuses a request without one).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from deploy.kafka_local import free_port
from schemas.agent import ModelCallRecorded, TelemetryEvent, ToolCallRecorded
from schemas.conversation import SendMessage
from schemas.workflow import StepStarted, StepSucceeded, WorkflowStarted
from streams.envelope import Envelope, encode
from streams.producer import RecordProducer, dlq_headers
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.topics import AGENT, COMMANDS, TELEMETRY, WORKFLOWS, topic_name
from telemetry.endpoint import EndpointDown, EndpointRefused, ask_endpoint
from telemetry.query import client_token, run_sql
from telemetry.rows import BLOB_THRESHOLD
from telemetry.sink import InsertFailed, Sink
from telemetry.store import TelemetrySettings, telemetry_settings
from tests.support import env_for, sink_committed, stop, wait_for

pytestmark = pytest.mark.integration

SECRET = "the caseworker said my benefit stops on Friday"
Item = tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]


def rec(settings: VoiceSettings, spec, record, key: str = "wf-1", **env) -> Item:
    k, v, h = encode(Envelope(record=record, key=key, source="/voice/test", **env))
    return topic_name(settings, spec), k, v, h


def produce(settings: VoiceSettings, items: list[Item]) -> dict[tuple[str, int], int]:
    """Produce and wait for the acks; returns the offset to commit per (topic, partition)."""

    async def go():  # noqa: ANN202
        producer = RecordProducer(settings)
        try:
            return await asyncio.gather(*(producer.produce_raw(*i) for i in items))
        finally:
            producer.close()

    ends: dict[tuple[str, int], int] = {}
    for m in asyncio.run(go()):
        ends[(m.topic(), m.partition())] = max(ends.get((m.topic(), m.partition()), 0),
                                               m.offset() + 1)
    return ends


def mixed_records(settings: VoiceSettings) -> list[Item]:
    sealer = Sealer(MemoryKeyStore())
    text = sealer.seal("cnv-1", "msg-1", SECRET)
    response = sealer.seal_json("cnv-1", "call-1", {"content": [{"type": "text",
                                                                  "text": SECRET}]})
    garbage = (topic_name(settings, COMMANDS), b"k", b"\xffnot a record", [])
    return [
        rec(settings, WORKFLOWS, WorkflowStarted(workflow="wf-1", kind="conversation-turn"),
            seq=1),
        rec(settings, WORKFLOWS, StepStarted(workflow="wf-1", step="agent", attempt=1), seq=2),
        rec(settings, WORKFLOWS, StepSucceeded(workflow="wf-1", step="agent", attempt=1), seq=3),
        rec(settings, AGENT, ModelCallRecorded(
            workflow="wf-1", call_id="call-1", agent_name="extractor", iteration=1,
            request_model="claude-x", input_tokens=1200, output_tokens=80,
            cache_read_input_tokens=1000, finish_reasons=["end_turn"], latency_ms=640.0,
            cost_usd=0.004, conversation_id="cnv-1", response=response)),
        rec(settings, AGENT, ToolCallRecorded(
            workflow="wf-1", tool_call_id="tc-1", tool_name="lookup_issue",
            agent_name="extractor", envelope="err", err_kind="not_found", duration_ms=12.5,
            arguments=text, result={"error": "no such issue"})),
        rec(settings, COMMANDS, SendMessage(conversation="cnv-1", message_id="msg-1",
                                            text=text), key="cnv-1"),
        rec(settings, TELEMETRY, TelemetryEvent(name="big",
                                                attributes={"x": "z" * (2 * BLOB_THRESHOLD)})),
        garbage,
        (topic_name(settings, COMMANDS) + ".dlq", b"k", b"\xffnot a record",
         dlq_headers([], "ce_specversion missing", garbage[0], 0, 0)),
    ]


def fast(settings: VoiceSettings, **kw) -> TelemetrySettings:
    return telemetry_settings(settings).model_copy(update={
        "telemetry_flush_ms": 300, "telemetry_query_port": 0, **kw})


def drain(sink: Sink, want: int, timeout: float = 60.0) -> None:
    """Poll until ``want`` events rows are visible (FINAL), flushing as the sink decides."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sink.poll_once(timeout=0.2)
        if sink.store.query("SELECT count() FROM voice.events FINAL").rows[0][0] >= want:
            return
    raise TimeoutError(f"sink did not store {want} events in {timeout}s")


def take(sink: Sink, n: int, timeout: float = 60.0) -> None:
    """Poll until the sink has taken ``n`` records, then flush them."""
    deadline, taken = time.monotonic() + timeout, 0
    while taken < n and time.monotonic() < deadline:
        taken += sink.poll_once(timeout=0.2)
    assert taken == n, f"took {taken} of {n} records"
    sink.flush()


def one(sink: Sink, sql: str):  # noqa: ANN201
    return sink.store.query(sql).rows


def test_every_record_kind_lands_in_its_table(settings: VoiceSettings) -> None:
    items = mixed_records(settings)
    ends = produce(settings, items)
    sink = Sink(fast(settings))
    try:
        drain(sink, len(items))
        sink.flush()
        assert one(sink, "SELECT count() FROM voice.events") == [(len(items),)]
        assert one(sink, "SELECT ce_type, count() FROM voice.events GROUP BY ce_type "
                         "ORDER BY ce_type") == [
            ("undecodable", 2), ("voice.agent.model_call.v1", 1),
            ("voice.agent.tool_call.v1", 1), ("voice.conversation.send_message.v1", 1),
            ("voice.telemetry.event.v1", 1), ("voice.workflow.started.v1", 1),
            ("voice.workflow.step_started.v1", 1), ("voice.workflow.step_succeeded.v1", 1)]
        assert one(sink, "SELECT request_model, input_tokens, cache_read_input_tokens, "
                         "finish_reasons, conversation_id FROM voice.model_calls") == [
            ("claude-x", 1200, 1000, ["end_turn"], "cnv-1")]
        assert one(sink, "SELECT tool_name, envelope, err_kind, duration_ms "
                         "FROM voice.tool_calls") == [("lookup_issue", "err", "not_found", 12.5)]
        assert one(sink, "SELECT kind, scope, status FROM voice.workflow_steps ORDER BY seq"
                   ) == [("conversation-turn", "workflow", "started"),
                         ("conversation-turn", "step", "started"),
                         ("conversation-turn", "step", "succeeded")]
        assert one(sink, "SELECT turns FROM voice.turns_per_hour WHERE turns > 0") == [(1,)]
        dlq = one(sink, "SELECT decode_error, headers['voice_dlq_reason'] FROM voice.events "
                        "WHERE endsWith(topic, '.dlq')")
        assert dlq[0][1] == "ce_specversion missing" and "ce_specversion" in dlq[0][0]
        (n,), = one(sink, "SELECT count() FROM voice.event_blobs WHERE payload_bytes >= "
                          f"{2 * BLOB_THRESHOLD}")
        assert n == 1
        for table in ("events", "event_blobs", "model_calls", "tool_calls"):
            cols = [r[0] for r in one(sink, f"DESCRIBE TABLE voice.{table}")
                    if r[1] in ("String", "Nullable(String)")]
            hits = sum(one(sink, f"SELECT countIf(position(ifNull(`{c}`, ''), '{SECRET}') > 0)"
                                 f" FROM voice.{table}")[0][0] for c in cols)
            assert hits == 0, f"plaintext in {table}"
        assert sink_committed(settings, ends) == ends  # committed once the rows were in
    finally:
        sink.close()


class FailingStore:
    def __init__(self, inner) -> None:  # noqa: ANN001
        self.inner, self.location, self.down = inner, inner.location, True

    def command(self, sql):  # noqa: ANN001, ANN201
        return self.inner.command(sql)

    def query(self, sql):  # noqa: ANN001, ANN201
        return self.inner.query(sql)

    def insert(self, *a, **kw):  # noqa: ANN002, ANN003, ANN201
        if self.down:
            raise ConnectionError("ClickHouse unavailable")
        return self.inner.insert(*a, **kw)

    def insert_arrow(self, *a, **kw):  # noqa: ANN002, ANN003, ANN201
        if self.down:
            raise ConnectionError("ClickHouse unavailable")
        return self.inner.insert_arrow(*a, **kw)

    def close(self) -> None:
        self.inner.close()


def test_offsets_are_committed_only_after_the_insert(settings: VoiceSettings) -> None:
    from telemetry.store import open_store

    items = [rec(settings, AGENT, TelemetryEvent(name=f"e{i}")) for i in range(30)]
    ends = produce(settings, items)
    ts = fast(settings, telemetry_batch_rows=1000, telemetry_flush_ms=60_000)
    store = FailingStore(open_store(ts))
    store.down = False
    sink = Sink(ts, store=store, retry_initial_s=0.01)
    store.down = True
    deadline, taken = time.monotonic() + 60, 0
    while taken < len(items) and time.monotonic() < deadline:
        taken += sink.poll_once(timeout=0.2)
    assert taken == len(items)
    with pytest.raises(InsertFailed):
        sink.flush(max_attempts=3)
    assert one(sink, "SELECT count() FROM voice.events") == [(0,)]
    assert all(o < 0 for o in sink_committed(settings, ends).values())  # nothing committed
    sink.close(flush=False)  # the process dies with the batch in memory
    sink = Sink(fast(settings))  # restarted, it re-reads from the last commit (none)
    try:
        take(sink, len(items))
        assert one(sink, "SELECT count() FROM voice.events") == [(len(items),)]
        assert sink_committed(settings, ends) == ends
    finally:
        sink.close()


class Crash(Exception):
    pass


class CrashBeforeCommit(Sink):
    """Inserts, then 'dies' before committing (as if killed between the two)."""

    def _commit(self, batch) -> None:  # noqa: ANN001
        raise Crash


def test_crash_between_insert_and_commit_does_not_duplicate(settings: VoiceSettings) -> None:
    items = [rec(settings, AGENT, ModelCallRecorded(
        workflow=f"wf-{i}", call_id=f"c{i}", agent_name="a", iteration=1, request_model="m",
        input_tokens=i)) for i in range(40)]
    ends = produce(settings, items)
    ts = fast(settings)
    sink = CrashBeforeCommit(ts)
    with pytest.raises(Crash):
        drain(sink, 10**9, timeout=60)
    inserted = one(sink, "SELECT count() FROM voice.events")[0][0]
    assert inserted > 0 and all(o < 0 for o in sink_committed(settings, ends).values())
    sink.close(flush=False)
    sink = Sink(ts)
    try:
        take(sink, len(items))  # all of them again: none was committed
        assert one(sink, "SELECT count() FROM voice.events FINAL") == [(len(items),)]
        assert one(sink, "SELECT count() FROM voice.model_calls FINAL") == [(len(items),)]
        assert one(sink, "SELECT sum(calls), sum(input_tokens) FROM "
                         "voice.tokens_cost_per_model_day") == [(40, sum(range(40)))]
        sink.store.command("OPTIMIZE TABLE voice.events FINAL")
        assert one(sink, "SELECT count() FROM voice.events") == [(len(items),)]
        assert sink_committed(settings, ends) == ends
    finally:
        sink.close()


def spawn_sink(settings: VoiceSettings, port: int, log: Path) -> subprocess.Popen[bytes]:
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO); "
            "from telemetry.sink import run_sink; from telemetry.store import telemetry_settings;"
            " sys.exit(run_sink(telemetry_settings()))")
    env = env_for(settings, VOICE_TELEMETRY_QUERY_PORT=str(port), VOICE_TELEMETRY_FLUSH_MS="200")
    env.pop("VOICE_CLICKHOUSE_URL", None)
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=open(log, "ab"),
                            stderr=subprocess.STDOUT, cwd=settings.state_dir)


def endpoint_count(ts: TelemetrySettings) -> int:
    try:
        return ask_endpoint(ts, "SELECT count() FROM voice.events FINAL",
                            client_token(ts))["rows"][0][0]
    except EndpointDown:
        return -1
    except Exception:  # the schema is still being created
        return -1


def test_killed_sink_restarts_without_loss_or_duplicates(settings: VoiceSettings,
                                                         tmp_path: Path) -> None:
    port = free_port()
    ts = telemetry_settings(settings).model_copy(update={"telemetry_query_port": port})
    first = [rec(settings, AGENT, TelemetryEvent(name=f"a{i}")) for i in range(50)]
    produce(settings, first)
    proc = spawn_sink(settings, port, tmp_path / "sink1.log")
    try:
        wait_for(lambda: endpoint_count(ts) == 50, timeout=90, what="first 50 rows")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        produce(settings, [rec(settings, AGENT, TelemetryEvent(name=f"b{i}")) for i in range(30)]
                + mixed_records(settings))
        proc = spawn_sink(settings, port, tmp_path / "sink2.log")
        total = 50 + 30 + len(mixed_records(settings))
        wait_for(lambda: endpoint_count(ts) == total, timeout=90, what=f"{total} rows")
        out = json.loads(run_sql(ts, "SELECT count() AS n, uniqExact(topic, partition, offset) "
                                     "AS u FROM voice.events FINAL", "json"))
        assert out == [{"n": total, "u": total}]
        with pytest.raises(Exception, match="only read statements"):
            run_sql(ts, "DROP TABLE voice.events")
        with pytest.raises(EndpointRefused) as refused:  # the sink's endpoint wants a token
            ask_endpoint(ts, "SELECT count() FROM voice.events", None)
        assert refused.value.status == 401
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        stop(proc)
    # No sink now: voice sql opens the folder itself.
    table = run_sql(ts, "SELECT count() AS n FROM voice.events FINAL")
    assert table.splitlines()[2].strip() == str(total), table
