"""Voice's benchmark harness: ``python -m bench`` (or ``make bench``) prints one JSON object.

Every Voice figure is reported beside a plain-Kafka baseline measured in the same run, on the
same broker, with the stack's own producer settings (``streams.producer.PRODUCER_CONFIG``), and
with the ratio figure / baseline; a figure without its baseline is never reported. See
``docs/benchmarks.md`` for what each figure means.

Modules: ``bench.harness`` (registry, percentiles, the figure/baseline rule),
``bench.kafka_baseline`` (the benchmarks), ``bench.__main__`` (the entry point).
"""
