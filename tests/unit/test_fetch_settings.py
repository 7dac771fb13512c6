"""Every confluent-kafka consumer of Voice that may read more than its local queue holds sets
``streams.fetch.READING`` (directly or through ``TAILING``): at librdkafka's default
``fetch.queue.backoff.ms`` (1 s) such a consumer paused a second each time its queue filled —
a windowed edge skipping 727,272 workflow records at start was ready in 6.4 s, not 2.6, and a
first read of an old conversation took 2.1 s, not 0.13 (issue 14)."""

from __future__ import annotations

import ast
from pathlib import Path

from streams.fetch import QUEUE_BACKOFF_MS, READING, TAILING
from streams.settings import VoiceSettings
from telemetry.sink import consumer_config

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("api", "consumers", "streams", "telemetry", "deploy")
ONE_RECORD = {"consumers/assistant/datasets.py"}
"""Consumers that read one record at an offset: no queue to fill."""


def consumer_calls() -> list[tuple[str, ast.Call]]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                        and node.func.id == "Consumer"):
                    out.append((str(path.relative_to(ROOT)), node))
    return out


def sets_reading(call: ast.Call) -> bool:
    """The config is a dict literal unpacking READING or TAILING, or a function's result
    (checked below by calling it)."""
    if not call.args:
        return False
    config = call.args[0]
    if isinstance(config, ast.Dict):
        return any(key is None and isinstance(value, ast.Name)
                   and value.id in {"READING", "TAILING"}
                   for key, value in zip(config.keys, config.values, strict=True))
    return isinstance(config, ast.Call)


def test_reading_puts_off_a_full_queue_s_next_fetch_briefly() -> None:
    assert READING == {"fetch.queue.backoff.ms": QUEUE_BACKOFF_MS} and QUEUE_BACKOFF_MS <= 50
    assert TAILING["fetch.queue.backoff.ms"] == QUEUE_BACKOFF_MS


def test_every_consumer_that_reads_through_a_log_sets_it() -> None:
    calls = consumer_calls()
    assert len(calls) >= 8, "the scan found Voice's consumers"
    missing = [f"{path}:{call.lineno}" for path, call in calls
               if path not in ONE_RECORD and not sets_reading(call)]
    assert missing == []


def test_the_telemetry_sink_and_the_key_store_set_it_through_their_config_functions() -> None:
    settings = VoiceSettings(kafka_bootstrap="127.0.0.1:1")
    assert consumer_config(settings)["fetch.queue.backoff.ms"] == QUEUE_BACKOFF_MS
    source = (ROOT / "streams" / "keyservice.py").read_text()
    assert "**TAILING" in source
