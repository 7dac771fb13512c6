"""Telemetry: the consumer group that reads every Voice topic into ClickHouse, and ``voice sql``.

The sink (``voice telemetry``) batches every Kafka record, raw, into ``voice.envelopes``, from
which ClickHouse derives ``voice.events`` (payloads of 32 KiB or more in ``voice.event_blobs``,
nothing truncated) and the facts it records into ``voice.model_calls``, ``voice.tool_calls`` and
``voice.workflow_steps`` (OpenTelemetry GenAI column names), in the order flush batch → insert →
commit offsets, with retried inserts deduplicated. The store is ClickHouse embedded through chDB
(``<state_dir>/clickhouse``) or a server at ``VOICE_CLICKHOUSE_URL``. Sealed conversation
content stays sealed. See ``docs/telemetry.md``.

Public names:

* ``telemetry.sink``: ``run_sink(settings) -> int``, ``Sink`` (``poll_once``, ``flush``,
  ``close``), ``group_id``, ``InsertFailed``.
* ``telemetry.query``: ``run_sql(settings, sql, fmt, token) -> str``, ``client_token``,
  ``render``, ``check_read_only``, ``SqlRefused``, ``QueryFailed``.
* ``telemetry.endpoint``: ``QueryServer`` (the sink's ``POST /query`` on loopback: bearer token
  with ``telemetry.query``, JSON only, never from a web page), ``ask_endpoint``,
  ``EndpointDown``, ``EndpointRefused``, ``result_json``.
* ``telemetry.store``: ``TelemetrySettings``, ``telemetry_settings``, ``TelemetryStore``
  (the port), ``ClickHouseStore``, ``open_store``, ``embedded_path``, ``StoreUnavailable``.
* ``telemetry.schema``: ``ensure_schema``, ``COLUMNS``, ``VIEWS``, ``MIGRATIONS``.
* ``telemetry.derive``: ``DERIVATIONS`` (the materialized views that derive every table from
  ``voice.envelopes``), ``LANDING_COLUMNS``, ``BLOB_THRESHOLD``.
* ``telemetry.envelopes``: ``verdict``, ``Verdict``, ``Columns`` (a batch as one Arrow table).
* ``telemetry.batch``: ``Batch`` (records, offsets, dedupe token, dead letters owed),
  ``DeadLetters``, ``token_of``, ``ranges_of``.
* ``telemetry.rows``: ``map_record`` (the same derivation in Python: the reference the views
  are tested against), ``RawRecord``, ``Rows``, ``BLOB_THRESHOLD``.

Modules import confluent-kafka and clickhouse-connect, so this package imports nothing eagerly.
"""
