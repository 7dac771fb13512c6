"""The ClickHouse schema of telemetry: database ``voice``, its tables and views, and migrations.

Column lists live here once (``COLUMNS``): the DDL is generated from them and the sink inserts
by the same names, so the two cannot drift apart.

Every table is a ``ReplacingMergeTree`` whose sorting key is the identity of what a row
describes — ``(topic, partition, offset)`` for a Kafka record, the event id for a fact derived
from one — with ``non_replicated_deduplication_window`` set so an insert retried with the same
``insert_deduplication_token`` is dropped by the engine. Rows that still arrive twice (a sink
that crashed between insert and commit and re-reads in differently cut batches) are merged away
by the engine in the background; the views read with ``FINAL`` so they never count them twice.
No table is partitioned: a ReplacingMergeTree only merges duplicates within one partition.
"""

from __future__ import annotations

from telemetry.derive import (
    DATABASE,
    DERIVATIONS,
    landing_table_sql,
    materialized_view_sql,
    view_name,
)
from telemetry.store import TelemetryStore

DEDUP_WINDOW = 10_000
"""Recent insert blocks per table whose tokens the engine remembers."""

_TS = "DateTime64(6, 'UTC')"
_NS = "Nullable(String)"

COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "events": (
        ("event_id", "String"),  # ce_id; '' when the record had none
        ("ce_type", "LowCardinality(String)"),  # 'undecodable' when decode() refused it
        ("source", "String"),
        ("subject", _NS),
        ("aggregate_key", "String"),  # the Kafka key
        ("seq", "Nullable(Int64)"),
        ("tenant", _NS),
        ("correlation", _NS),
        ("causation", _NS),
        ("time", _TS),  # ce_time, or the Kafka timestamp of an undecodable record
        ("topic", "LowCardinality(String)"),
        ("partition", "UInt32"),
        ("offset", "UInt64"),
        ("headers", "Map(String, String)"),
        ("payload", "String"),  # the record's JSON as produced, or a pointer to event_blobs
        ("payload_encoding", "LowCardinality(String)"),  # json | text | base64 | blob
        ("payload_blob_id", _NS),
        ("payload_bytes", "UInt64"),
        ("decode_error", _NS),
        # Of the record's ``traceparent`` header: the span it was produced in (migration 2).
        ("trace_id", _NS),
        ("span_id", _NS),
    ),
    "event_blobs": (
        ("blob_id", "String"),
        ("event_id", "String"),
        ("topic", "LowCardinality(String)"),
        ("partition", "UInt32"),
        ("offset", "UInt64"),
        ("payload_encoding", "LowCardinality(String)"),
        ("payload", "String"),
        ("payload_bytes", "UInt64"),
    ),
    "model_calls": (
        ("event_id", "String"),
        ("time", _TS),
        ("operation_name", "LowCardinality(String)"),
        ("provider_name", "LowCardinality(String)"),
        ("request_model", "LowCardinality(String)"),
        ("response_model", _NS),
        ("input_tokens", "UInt64"),  # includes cache reads and writes (OTel GenAI)
        ("output_tokens", "UInt64"),
        ("cache_read_input_tokens", "UInt64"),
        ("cache_creation_input_tokens", "UInt64"),
        ("finish_reasons", "Array(String)"),
        ("error_type", _NS),
        ("conversation_id", _NS),
        ("agent_name", "LowCardinality(String)"),
        ("trace_id", _NS),
        ("span_id", _NS),
        ("latency_ms", "Float64"),
        ("cost_usd", "Float64"),
        ("fallback_used", "Bool"),
        ("workflow", "String"),
        ("call_id", "String"),
        ("iteration", "UInt32"),
        ("tenant", _NS),
    ),
    "tool_calls": (
        ("event_id", "String"),
        ("time", _TS),
        ("operation_name", "LowCardinality(String)"),  # 'execute_tool' (OTel GenAI)
        ("tool_name", "LowCardinality(String)"),
        ("tool_call_id", "String"),
        ("envelope", "LowCardinality(String)"),  # ok | hint | err
        ("hint_kind", _NS),
        ("err_kind", _NS),
        ("duration_ms", "Float64"),
        ("conversation_id", _NS),
        ("agent_name", "LowCardinality(String)"),
        ("workflow", "String"),
        ("trace_id", _NS),
        ("span_id", _NS),
        ("tenant", _NS),
    ),
    "workflow_steps": (
        ("event_id", "String"),
        ("time", _TS),
        ("workflow", "String"),
        ("kind", "LowCardinality(String)"),  # '' unless the sink saw the workflow start
        ("scope", "LowCardinality(String)"),  # workflow | step
        ("step", "String"),
        ("attempt", "Nullable(UInt32)"),
        ("status", "LowCardinality(String)"),  # started|succeeded|failed|paused|resumed|completed
        ("error", _NS),
        ("error_type", _NS),
        ("retryable", "Nullable(Bool)"),
        ("waiting_for", _NS),
        ("worker", _NS),
        ("seq", "Nullable(Int64)"),
    ),
}

ORDER_BY = {
    "events": "(topic, partition, offset)",
    "event_blobs": "blob_id",
    "model_calls": "event_id",
    "tool_calls": "event_id",
    "workflow_steps": "event_id",
}

INDEXES = {
    # Finding an event by id is common (from a trace, a DLQ header); the sorting key is position.
    "events": ["INDEX idx_event_id event_id TYPE bloom_filter GRANULARITY 4"],
}


def column_names(table: str) -> tuple[str, ...]:
    return tuple(name for name, _ in COLUMNS[table])


def create_table_sql(table: str) -> str:
    cols = [f"`{n}` {t}" for n, t in COLUMNS[table]] + INDEXES.get(table, [])
    body = ",\n  ".join(cols)
    return (
        f"CREATE TABLE IF NOT EXISTS {DATABASE}.{table} (\n  {body}\n)\n"
        f"ENGINE = ReplacingMergeTree ORDER BY {ORDER_BY[table]}\n"
        f"SETTINGS non_replicated_deduplication_window = {DEDUP_WINDOW}"
    )


# Workflow kinds as far as the sink has seen them start; step rows whose kind the sink did not
# know (it started before a restart) still get it through this lookup.
_KINDS = (
    f"(SELECT workflow, any(kind) AS wf_kind FROM {DATABASE}.workflow_steps FINAL "
    "WHERE kind != '' GROUP BY workflow)"
)

VIEWS: dict[str, str] = {
    "turns_per_hour": f"""
SELECT hour, t.turns AS turns, t.turn_p50_ms AS turn_p50_ms, t.turn_p95_ms AS turn_p95_ms,
       t.turn_p99_ms AS turn_p99_ms, m.model_calls AS model_calls,
       m.model_p50_ms AS model_p50_ms, m.model_p95_ms AS model_p95_ms
FROM (
    SELECT toStartOfHour(started) AS hour, uniqExact(workflow) AS turns,
           quantile(0.5)(ms) AS turn_p50_ms, quantile(0.95)(ms) AS turn_p95_ms,
           quantile(0.99)(ms) AS turn_p99_ms
    FROM (
        SELECT s.workflow AS workflow,
               if(countIf(s.scope = 'step' AND s.status = 'started') > 0,
                  minIf(s.time, s.scope = 'step' AND s.status = 'started'),
                  minIf(s.time, s.status = 'started')) AS started,
               maxIf(s.time, s.status = 'succeeded') AS succeeded,
               dateDiff('microsecond', started, succeeded) / 1000.0 AS ms
        FROM {DATABASE}.workflow_steps AS s FINAL
        LEFT JOIN {_KINDS} AS k ON k.workflow = s.workflow
        WHERE (s.scope = 'step' OR s.status = 'started')
          AND if(s.kind != '', s.kind, k.wf_kind) = 'conversation-turn'
        -- A turn has one step. Its first attempt starts with the workflow (no StepStarted
        -- since issue 14: the workflow's 'started' row, attempt NULL), a later one with its
        -- own StepStarted; logs from before hold both for the first, the step's counts.
        GROUP BY s.workflow, ifNull(s.attempt, 1)
        HAVING countIf(s.status = 'started') > 0 AND countIf(s.status = 'succeeded') > 0
    )
    GROUP BY hour
) AS t
FULL OUTER JOIN (
    SELECT toStartOfHour(mc.time) AS hour, count() AS model_calls,
           quantile(0.5)(mc.latency_ms) AS model_p50_ms,
           quantile(0.95)(mc.latency_ms) AS model_p95_ms
    FROM {DATABASE}.model_calls AS mc FINAL
    GROUP BY hour
) AS m USING hour
ORDER BY hour""",
    "tokens_cost_per_model_day": f"""
SELECT toDate(m.time) AS day, m.provider_name AS provider_name,
       m.request_model AS request_model, count() AS calls,
       sum(m.input_tokens) AS input_tokens, sum(m.output_tokens) AS output_tokens,
       sum(m.cache_read_input_tokens) AS cache_read_input_tokens,
       sum(m.cache_creation_input_tokens) AS cache_creation_input_tokens,
       sum(m.cost_usd) AS cost_usd, countIf(m.error_type IS NOT NULL) AS errors,
       countIf(m.fallback_used) AS fallbacks,
       quantile(0.5)(m.latency_ms) AS p50_latency_ms,
       quantile(0.95)(m.latency_ms) AS p95_latency_ms
FROM {DATABASE}.model_calls AS m FINAL
GROUP BY day, provider_name, request_model
ORDER BY day, provider_name, request_model""",
    "tool_envelopes_per_tool": f"""
SELECT tool_name, envelope, kind, calls,
       round(calls / sum(calls) OVER (PARTITION BY tool_name), 4) AS share_of_tool,
       p50_ms, p95_ms
FROM (
    SELECT tc.tool_name AS tool_name, tc.envelope AS envelope,
           coalesce(tc.hint_kind, tc.err_kind, '') AS kind, count() AS calls,
           quantile(0.5)(tc.duration_ms) AS p50_ms, quantile(0.95)(tc.duration_ms) AS p95_ms
    FROM {DATABASE}.tool_calls AS tc FINAL
    GROUP BY tool_name, envelope, kind
)
ORDER BY tool_name, envelope, kind""",
    "workflow_failures": f"""
SELECT s.time AS time, s.workflow AS workflow, if(s.kind != '', s.kind, k.wf_kind) AS kind,
       s.scope AS scope, s.step AS step, s.attempt AS attempt, s.error_type AS error_type,
       s.error AS error, s.retryable AS retryable
FROM {DATABASE}.workflow_steps AS s FINAL
LEFT JOIN {_KINDS} AS k ON k.workflow = s.workflow
WHERE s.status = 'failed'
ORDER BY time""",
}

# Versioned, append-only: a later change to a table is a new entry (e.g. ALTER TABLE … ADD
# COLUMN IF NOT EXISTS). Statements are idempotent, so a crash mid-migration is re-run safely.
MIGRATIONS: list[tuple[int, list[str]]] = [
    (1, [create_table_sql(t) for t in COLUMNS]),
    (2, [f"ALTER TABLE {DATABASE}.events ADD COLUMN IF NOT EXISTS {name} Nullable(String)"
         for name in ("trace_id", "span_id")]),
    # The sink inserts raw records into a Null table; views derive every table (issue 14).
    (3, [landing_table_sql()] + [materialized_view_sql(t) for t in DERIVATIONS]),
    # New record shapes (issue 14, third pass: ``voice.workflow.completed.v2``,
    # ``voice.agent.model_call.v2``): their views follow the code. A view holds no data; the
    # sink inserts nothing until this has run.
    (4, [sql for table in ("workflow_steps", "model_calls")
         for sql in (f"DROP VIEW IF EXISTS {view_name(table)}", materialized_view_sql(table))]),
    # Each fact view parses a payload once (one ``JSONExtract`` into a tuple), not once per
    # field: the same rows. ``MODIFY QUERY`` swaps a view's SELECT in place, so a sink
    # inserting meanwhile (a server's other sinks) loses no rows to a dropped view.
    (5, [f"ALTER TABLE {view_name(table)} MODIFY QUERY {DERIVATIONS[table].strip()}"
         for table in ("model_calls", "tool_calls", "workflow_steps")]),
]


def ensure_schema(store: TelemetryStore) -> list[int]:
    """Create or migrate database, tables and views; returns the migration versions applied."""
    store.command(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    store.command(
        f"CREATE TABLE IF NOT EXISTS {DATABASE}.schema_migrations "
        "(version UInt32, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) "
        "ENGINE = ReplacingMergeTree ORDER BY version"
    )
    done = {r[0] for r in store.query(f"SELECT version FROM {DATABASE}.schema_migrations").rows}
    applied = []
    for version, statements in MIGRATIONS:
        if version in done:
            continue
        for sql in statements:
            store.command(sql)
        store.insert(f"{DATABASE}.schema_migrations", ["version"], [[version]])
        applied.append(version)
    # Views hold no data, so they are simply replaced: their definitions follow the code.
    for name, select in VIEWS.items():
        store.command(f"CREATE OR REPLACE VIEW {DATABASE}.{name} AS {select.strip()}")
    return applied
