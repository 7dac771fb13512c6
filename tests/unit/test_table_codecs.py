"""How the worker's tables encode their changelog records: values by orjson (through Faust's
JSON codec), keys as the standard library writes them, so a key's bytes never change."""

from __future__ import annotations

import json
from contextlib import closing
from typing import Any

from faust.serializers import codecs
from faust.utils import json as faust_json

from consumers.frame.bounded import TABLE_KEYS, changelog_key, changelog_record
from consumers.frame.context import WorkerContext
from streams.settings import VoiceSettings


def settings(**kw: Any) -> VoiceSettings:
    return VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", **kw)


def test_faust_encodes_json_with_orjson() -> None:
    # The dependency, not an accident of one machine: without it Faust falls back to the
    # standard library's encoder, 7 % of the worker's loop (docs/benchmarks.md, twentieth pass).
    assert faust_json.orjson is not None


def test_a_key_is_written_as_the_standard_library_wrote_it_before_orjson() -> None:
    with closing(WorkerContext(settings())) as ctx:
        table = ctx.table("keys")
        for key in ("cnv-0193ab", "acme/zoë", "t/用户", "a\"b\\c", "cnv-1:turn-7"):
            assert changelog_key(table, key) == json.dumps(key, separators=(",", ":")).encode()
        assert changelog_key(table, "acme/zoë") == b'"acme/zo\\u00eb"'
        assert table.key_serializer is TABLE_KEYS


def test_a_record_round_trips_through_the_table_s_codecs() -> None:
    with closing(WorkerContext(settings())) as ctx:
        table = ctx.table("values")
        value = {"seq": 12, "text": "zoë 用户", "items": [1, 2.5, None, True], "nested": {"a": []}}
        key_bytes, value_bytes = changelog_record(table, "acme/zoë", value)
        # Recovery decodes with the changelog topic's JSON codec: the same key and value.
        assert codecs.loads("json", key_bytes) == "acme/zoë"
        assert codecs.loads("json", value_bytes) == value
