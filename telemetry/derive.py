"""The telemetry rows, derived inside ClickHouse from the Kafka records as they were produced.

The sink inserts each record once, as it is, into ``voice.envelopes`` (engine ``Null``: it keeps
nothing): its place, key, raw value, raw headers, Kafka timestamp, and the three things only the
sink can say — the decode verdict (``decode_error``, NULL when the record is a valid Voice
record), ``seq`` (the ``voice_seq`` header it checked) and the workflow ``kind`` it has seen
start. Materialized views turn every inserted block into the rows of ``events``,
``event_blobs``, ``model_calls``, ``tool_calls`` and ``workflow_steps``, with ClickHouse's JSON
and map functions: what ``telemetry.rows.map_record`` computes in Python, row for row (the
contract test ``tests/unit/test_telemetry_derive.py`` holds the two side by side).

Only the non-content fields of a record are extracted: ``response``, ``arguments``,
``result``, sealed errors stay in the payload (sealed there) and nowhere else.

Everything here is plain ClickHouse SQL documented for both a server and chDB: a ``Null``
table, ``CREATE MATERIALIZED VIEW … TO``, ``JSONExtract`` (into a named ``Tuple``),
``mapFilter``/``mapApply``, ``parseDateTime64BestEffortOrNull``, ``toValidUTF8``,
``isValidUTF8``, ``base64Encode``, ``SHA256``. A retried insert carries
``insert_deduplication_token`` with ``deduplicate_blocks_in_dependent_materialized_views = 1``
(``telemetry.store``), so each target table drops the block it already has.
"""

from __future__ import annotations

from schemas.agent import ModelCallRecorded, ModelCallWithDisplay, ToolCallRecorded
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

DATABASE = "voice"
LANDING = "envelopes"
BLOB_THRESHOLD = 32 * 1024
"""Payloads of this many bytes or more go to ``event_blobs``; the ``events`` row points there."""

LANDING_COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "LowCardinality(String)"),
    ("partition", "UInt32"),
    ("offset", "UInt64"),
    ("key", "Nullable(String)"),
    ("value", "String"),  # bytes as produced ('' for a record without a value)
    ("headers", "Map(String, Nullable(String))"),  # bytes as produced
    ("kafka_ms", "Nullable(Int64)"),
    ("decode_error", "Nullable(String)"),  # NULL: a valid Voice record
    ("seq", "Nullable(Int64)"),
    ("kind", "String"),  # the workflow's kind, '' unless the sink saw it start
)


def landing_table_sql() -> str:
    cols = ",\n  ".join(f"`{n}` {t}" for n, t in LANDING_COLUMNS)
    return f"CREATE TABLE IF NOT EXISTS {DATABASE}.{LANDING} (\n  {cols}\n) ENGINE = Null"


def _q(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _opt(name: str) -> str:
    """A header as ``Nullable(String)``: NULL when the record did not carry it."""
    return f"if(mapContains(h, {_q(name)}), h[{_q(name)}], NULL)"


# The W3C ``traceparent`` header's trace and span ids, NULL unless valid — the rules of
# OpenTelemetry's propagator (``streams.tracing.ids_of``): the format, a version other than
# 'ff', nothing after the flags in version '00', ids not all zeros.
_TRACEPARENT = r"""extractGroups(h['traceparent'],
           '^[ \t]*([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?[ \t]*$'
         ) AS tp,
         tp[2] != '' AND tp[1] != 'ff' AND NOT (tp[1] = '00' AND tp[5] != '')
           AND tp[2] != repeat('0', 32) AND tp[3] != repeat('0', 16) AS tp_valid,
         if(tp_valid, tp[2], NULL) AS tp_trace_id,
         if(tp_valid, tp[3], NULL) AS tp_span_id"""


# One inner SELECT that every view reads from: header bytes as text (invalid UTF-8 replaced,
# as Python's ``decode('utf-8', 'replace')``; NULL values dropped), the time and payload size.
# A view that keeps few of the records filters them first, on the raw columns, so the rest
# are never parsed; ``payload`` adds the parsed payload's tuple (``_Payload``).
def _source(where: str = "1", payload: str = "") -> str:
    return f"""(
  SELECT topic, partition, offset, value, decode_error, seq, kind,{payload}
         CAST(mapApply((k, v) -> (k, toValidUTF8(assumeNotNull(v))),
                       mapFilter((k, v) -> v IS NOT NULL, headers)),
              'Map(String, String)') AS h,
         toValidUTF8(ifNull(key, '')) AS aggregate_key,
         length(value) AS size,
         decode_error IS NULL AS decoded,
         h['ce_type'] AS type,
         if(decoded,
            ifNull(parseDateTime64BestEffortOrNull(h['ce_time'], 6, 'UTC'), now64(6, 'UTC')),
            if(kafka_ms IS NOT NULL, fromUnixTimestamp64Milli(assumeNotNull(kafka_ms), 'UTC'),
               now64(6, 'UTC'))) AS ce_time,
         multiIf(decoded, 'json', isValidUTF8(value), 'text', 'base64') AS encoding,
         if(encoding = 'base64', base64Encode(value), value) AS text,
         concat(topic, '/', toString(partition), '/', toString(offset)) AS blob_id,
         {_TRACEPARENT}
  FROM {DATABASE}.{LANDING}
  WHERE {where}
)"""


_SOURCE = _source()

_EVENTS = f"""
SELECT h['ce_id'] AS event_id,
       if(decoded, type, 'undecodable') AS ce_type,
       h['ce_source'] AS source,
       {_opt('ce_subject')} AS subject,
       aggregate_key,
       if(decoded, seq, NULL) AS seq,
       {_opt('voice_tenant')} AS tenant,
       {_opt('voice_correlation')} AS correlation,
       {_opt('voice_causation')} AS causation,
       ce_time AS time,
       topic, partition, offset,
       h AS headers,
       if(size >= {BLOB_THRESHOLD},
          concat('{{"blob_id": "', blob_id, '", "payload_bytes": ', toString(size),
                 ', "payload_encoding": "', encoding, '", "sha256": "', lower(hex(SHA256(value))),
                 '", "table": "{DATABASE}.event_blobs"}}'),
          text) AS payload,
       if(size >= {BLOB_THRESHOLD}, 'blob', encoding) AS payload_encoding,
       if(size >= {BLOB_THRESHOLD}, blob_id, NULL) AS payload_blob_id,
       size AS payload_bytes,
       decode_error,
       tp_trace_id AS trace_id,
       tp_span_id AS span_id
FROM {_SOURCE}"""

_BLOBS = f"""
SELECT blob_id, h['ce_id'] AS event_id, topic, partition, offset,
       encoding AS payload_encoding, text AS payload, size AS payload_bytes
FROM {_source(f"length(value) >= {BLOB_THRESHOLD}")}"""

class _Payload:
    """The payload fields one view reads, parsed once a row: a single ``JSONExtract`` into a
    named tuple (``p``), whose elements the view takes by name — not one ``JSONExtract`` (a
    parse of the whole payload) per field: ~25 parses of a 1.3–5.5 KB model call's record
    cost ~40 µs of its row (docs/benchmarks.md, issue 14, telemetry views' JSON).

    ``field(name, type, default)``: the element; ``default`` stands in when the field is absent
    (a pydantic default other than the type's zero value: its element is then Nullable, and a
    null in the payload cannot reach here — the record would not be decodable)."""

    def __init__(self) -> None:
        self.types: dict[str, str] = {}

    def field(self, name: str, ch_type: str, default: str | None = None) -> str:
        if default is not None and not ch_type.startswith("Nullable("):
            ch_type = f"Nullable({ch_type})"
        assert self.types.setdefault(name, ch_type) == ch_type, name
        element = f"tupleElement(p, {_q(name)})"
        return f"ifNull({element}, {default})" if default is not None else element

    def trace_ids(self) -> str:
        """A call's record carries its own trace and span when it has them; else those of its
        ``traceparent`` header (the engine produces each call's record inside its span)."""
        own_trace = self.field("trace_id", "Nullable(String)")
        own_span = self.field("span_id", "Nullable(String)")
        return (f"if({own_trace} IS NULL AND {own_span} IS NULL, tp_trace_id, {own_trace}) "
                "AS trace_id,\n       "
                f"if({own_trace} IS NULL AND {own_span} IS NULL, tp_span_id, {own_span}) "
                "AS span_id")

    def facts(self, *models: type) -> str:
        """The records of ``models`` (decoded, and not a dead-lettered copy: that is the same
        fact as the original, counted once, in events only), each with its payload's tuple."""
        types = ", ".join(_q(m.ce_type) for m in models)
        spec = ", ".join(f"{n} {t}" for n, t in self.types.items())
        return _source(f"decode_error IS NULL AND NOT endsWith(topic, '.dlq') "
                       f"AND headers['ce_type'] IN ({types})",
                       f"\n         JSONExtract(value, {_q(f'Tuple({spec})')}) AS p,")


def _model_calls() -> str:
    pl = _Payload()
    j = pl.field
    columns = f"""h['ce_id'] AS event_id, ce_time AS time,
       {j('operation_name', 'String', "'chat'")} AS operation_name,
       {j('provider_name', 'String', "'anthropic'")} AS provider_name,
       {j('request_model', 'String')} AS request_model,
       {j('response_model', 'Nullable(String)')} AS response_model,
       {j('input_tokens', 'UInt64')} AS input_tokens,
       {j('output_tokens', 'UInt64')} AS output_tokens,
       {j('cache_read_input_tokens', 'UInt64')} AS cache_read_input_tokens,
       {j('cache_creation_input_tokens', 'UInt64')} AS cache_creation_input_tokens,
       {j('finish_reasons', 'Array(String)')} AS finish_reasons,
       {j('error_type', 'Nullable(String)')} AS error_type,
       {j('conversation_id', 'Nullable(String)')} AS conversation_id,
       {j('agent_name', 'String')} AS agent_name,
       {pl.trace_ids()},
       {j('latency_ms', 'Float64')} AS latency_ms,
       {j('cost_usd', 'Float64')} AS cost_usd,
       {j('fallback_used', 'Bool')} AS fallback_used,
       {j('workflow', 'String')} AS workflow,
       {j('call_id', 'String')} AS call_id,
       {j('iteration', 'UInt32')} AS iteration,
       {_opt('voice_tenant')} AS tenant"""
    return f"""
SELECT {columns}
FROM {pl.facts(ModelCallRecorded, ModelCallWithDisplay)}"""


def _tool_calls() -> str:
    pl = _Payload()
    j = pl.field
    columns = f"""h['ce_id'] AS event_id, ce_time AS time, 'execute_tool' AS operation_name,
       {j('tool_name', 'String')} AS tool_name,
       {j('tool_call_id', 'String')} AS tool_call_id,
       {j('envelope', 'String')} AS envelope,
       {j('hint_kind', 'Nullable(String)')} AS hint_kind,
       {j('err_kind', 'Nullable(String)')} AS err_kind,
       {j('duration_ms', 'Float64')} AS duration_ms,
       {j('conversation_id', 'Nullable(String)')} AS conversation_id,
       {j('agent_name', 'String')} AS agent_name,
       {j('workflow', 'String')} AS workflow,
       {pl.trace_ids()},
       {_opt('voice_tenant')} AS tenant"""
    return f"""
SELECT {columns}
FROM {pl.facts(ToolCallRecorded)}"""


_MODEL_CALLS = _model_calls()
_TOOL_CALLS = _tool_calls()


_STARTED, _STEP_STARTED, _SUCCEEDED = (_q(m.ce_type) for m in
                                       (WorkflowStarted, StepStarted, StepSucceeded))
_STEP_FAILED, _PAUSED, _RESUMED = (_q(m.ce_type) for m in
                                   (StepFailed, WorkflowPaused, WorkflowResumed))
_COMPLETED, _WF_FAILED, _LAST = (_q(m.ce_type) for m in
                                 (WorkflowCompleted, WorkflowFailed, LastStepSucceeded))
WORKFLOW_TYPES = (WorkflowStarted, StepStarted, StepSucceeded, StepFailed, WorkflowPaused,
                  WorkflowResumed, WorkflowCompleted, WorkflowFailed, LastStepSucceeded)
"""The records that make a ``workflow_steps`` row (the sink tells their workflow's kind)."""

COMPLETED_ROW = "/completed"
"""The ``event_id`` suffix of the workflow's ``completed`` row a ``LastStepSucceeded`` makes
beside its step's ``succeeded`` row (the record's own id): the rows its two v1 records made."""

# ``error`` is plain (a code, Voice's own words); a message that may quote someone is sealed in
# the payload (``sealed_error``) and never extracted. ``part`` is '' but for a
# ``LastStepSucceeded``, which makes two rows: its step's ('step') and its workflow's ('end').
def _workflow_steps() -> str:
    pl = _Payload()
    j = pl.field
    columns = f"""if(part = 'end', concat(h['ce_id'], {_q(COMPLETED_ROW)}), h['ce_id']) AS event_id,
       ce_time AS time,
       {j('workflow', 'String')} AS workflow,
       kind,
       if(part = 'end' OR type IN ({_STARTED}, {_COMPLETED}, {_WF_FAILED}), 'workflow', 'step'
          ) AS scope,
       if(part = 'end' OR type IN ({_STARTED}, {_COMPLETED}), '', {j('step', 'String')}
          ) AS step,
       multiIf(part = 'end', NULL,
               type IN ({_STEP_STARTED}, {_SUCCEEDED}, {_STEP_FAILED}, {_LAST}),
               {j('attempt', 'Nullable(UInt32)')},
               type = {_WF_FAILED}, {j('attempts', 'Nullable(UInt32)')},
               NULL) AS attempt,
       multiIf(part = 'end', 'completed',
               type IN ({_STARTED}, {_STEP_STARTED}), 'started',
               type IN ({_SUCCEEDED}, {_LAST}), 'succeeded',
               type IN ({_STEP_FAILED}, {_WF_FAILED}), 'failed', type = {_PAUSED}, 'paused',
               type = {_RESUMED}, 'resumed', 'completed') AS status,
       if(type IN ({_STEP_FAILED}, {_WF_FAILED}), {j('error', 'Nullable(String)')}, NULL
          ) AS error,
       if(type = {_STEP_FAILED}, {j('error_type', 'Nullable(String)')}, NULL) AS error_type,
       if(type = {_STEP_FAILED}, CAST({j('retryable', 'Bool', 'true')}, 'Nullable(Bool)'),
          NULL) AS retryable,
       if(type = {_PAUSED}, {j('waiting_for', 'Nullable(String)')}, NULL) AS waiting_for,
       if(type = {_STEP_STARTED}, {j('worker', 'Nullable(String)')}, NULL) AS worker,
       seq"""
    return f"""
SELECT {columns}
FROM {pl.facts(*WORKFLOW_TYPES)}
ARRAY JOIN if(type = {_LAST}, ['step', 'end'], ['']) AS part"""


_WORKFLOW_STEPS = _workflow_steps()

DERIVATIONS: dict[str, str] = {
    "events": _EVENTS,
    "event_blobs": _BLOBS,
    "model_calls": _MODEL_CALLS,
    "tool_calls": _TOOL_CALLS,
    "workflow_steps": _WORKFLOW_STEPS,
}
"""Target table → the SELECT its materialized view runs on each block of ``envelopes``."""


def view_name(table: str) -> str:
    return f"{DATABASE}.{table}_from_{LANDING}"


def materialized_view_sql(table: str) -> str:
    return (f"CREATE MATERIALIZED VIEW IF NOT EXISTS {view_name(table)} "
            f"TO {DATABASE}.{table} AS {DERIVATIONS[table].strip()}")
