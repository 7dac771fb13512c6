"""Fault 11: erasure after a ``CouldNotInterpret`` whose reason quoted the participant.

Through a real edge, worker and telemetry sink (embedded ClickHouse): a participant sends a
message the model cannot interpret; the model's ``COULD_NOT_INTERPRET: …`` reason quotes it
(the simulator does, as real models do). The owner reads that reason (the edge opens it). Then
the participant erases the conversation. Afterwards the participant's marker is in plain text
on no topic of the stack (read raw: key, value, headers — dead-letter topics and the worker's
changelogs included), in no ClickHouse table, and in no log line of the Voice processes.

Before reasons were sealed, ``TurnStateChanged.reason`` carried the quote in plain text on
``voice.commands``, ``voice.conversations`` and in ClickHouse's ``events.payload``: erasure
destroyed the key of the message, and the model's copy of it survived.
"""

from __future__ import annotations

import random
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from streams.settings import VoiceSettings
from streams.tokens import mint_token
from telemetry.store import open_store, telemetry_settings
from tests.faults.test_long_conversation import stack_topics
from tests.support import read_all, sink_caught_up, spawn_voice, stop, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.integration]


def a_marker() -> str:
    """A word no one else writes, that the simulator takes for gibberish (no vowels)."""
    return "qz" + "".join(random.choice("bcdfghjklmnpqrstvwxz") for _ in range(14))


def where_on_kafka(settings: VoiceSettings, marker: bytes) -> list[str]:
    """``topic[partition]@offset`` of every record of the stack holding ``marker`` in plain."""
    found = []
    for topic in stack_topics(settings):
        for m in read_all(settings, topic, timeout=30):
            raw = (m.key() or b"") + (m.value() or b"") + b"".join(
                (v or b"") + k.encode() for k, v in (m.headers() or []))
            if marker in raw:
                found.append(f"{topic}[{m.partition()}]@{m.offset()}")
    return found


def where_in_clickhouse(settings: VoiceSettings, marker: str) -> list[str]:
    """Tables of the telemetry store holding ``marker`` in any column (opened by the test
    itself, after the sink stopped: the embedded store allows one process)."""
    store = open_store(telemetry_settings(settings))
    try:
        tables = [r[0] for r in store.query(
            "SELECT name FROM system.tables WHERE database = 'voice' "
            "AND engine LIKE '%MergeTree%'").rows]
        assert "events" in tables, tables
        (events,), = store.query("SELECT count() FROM voice.events").rows
        assert events > 0, "the sink stored the stack's records"
        rows = {t: store.query(f"SELECT * FROM voice.`{t}`").rows for t in tables}
        return [t for t, found in rows.items() if any(marker in repr(r) for r in found)]
    finally:
        store.close()


def test_after_erasure_the_participants_words_are_on_no_topic_table_or_log_line(
    settings: VoiceSettings, start_worker: Callable[..., subprocess.Popen[bytes]],
    start_edge: Callable[..., str], tmp_path: Path,
) -> None:
    marker = a_marker()
    start_worker()
    sink = spawn_voice(settings, "telemetry", log=tmp_path / "telemetry.log",
                       VOICE_TELEMETRY_QUERY_PORT="0", VOICE_TELEMETRY_FLUSH_MS="200")
    try:
        url = start_edge()
        auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
        with httpx.Client(base_url=url, headers=auth, timeout=30) as client:
            r = client.post("/me/conversations")
            assert r.status_code == 201, r.text
            cnv = r.json()["conversation"]
            r = client.post(f"/me/conversations/{cnv}/messages",
                            json={"text": f"{marker} brrzzkt pfffkt"})
            assert r.status_code == 202, r.text
            turn = r.json()["turn"]

            def ended() -> dict | None:
                t = client.get(f"/me/conversations/{cnv}/turns/{turn}")
                assert t.status_code == 200, t.text
                return t.json() if t.json()["state"] != "Thinking" else None

            out = wait_for(ended, timeout=120, interval=0.5, what="the turn's end")
            # The owner reads why, in the model's words, which quote the participant.
            assert out["state"] == "CouldNotInterpret", out
            assert out["reason_code"] == "could_not_interpret"
            assert marker in out["reason"], out

            assert client.delete(f"/me/conversations/{cnv}").status_code == 204
            assert client.get(f"/me/conversations/{cnv}").status_code == 404

        wait_for(lambda: sink_caught_up(settings), timeout=120, interval=1,
                 what="the sink storing every record")
        assert sink.poll() is None, "the sink stayed up"
    finally:
        stop(sink)

    assert not where_on_kafka(settings, marker.encode()), "the marker is on no topic"
    assert not where_in_clickhouse(settings, marker), "the marker is in no table"
    logs = sorted(tmp_path.glob("*.log"))
    assert {p.name for p in logs} >= {"worker0.log", "edge0.log", "telemetry.log"}
    leaked = [p.name for p in logs if marker in p.read_text(errors="replace")]
    assert not leaked, f"the marker is in the log of {leaked}"
