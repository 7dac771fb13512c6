"""Voice's benchmark harness: ``python -m bench`` (or ``make bench``) prints one JSON object.

Every Voice figure is reported beside a baseline measured in the same run (plain Kafka on the
same broker with the stack's own producer settings, ``streams.producer.PRODUCER_CONFIG``; a bare
ClickHouse insert; a bare Python call), with the ratio figure / baseline; a figure without its
baseline is never reported. See ``docs/benchmarks.md`` for what each figure means.

Modules: ``bench.harness`` (registry, percentiles, the figure/baseline rule),
``bench.kafka_baseline`` (Kafka baselines, Voice's send), ``bench.turns`` (turns through the
whole stack), ``bench.stack`` (that stack of child processes), ``bench.engine`` (the agent
loop), ``bench.ingest`` (telemetry sink and replay), ``bench.settings`` (``VOICE_BENCH_*``) and
``bench.__main__`` (the entry point).
"""
