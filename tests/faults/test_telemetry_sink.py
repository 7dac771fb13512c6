"""Fault 9: the telemetry sink killed mid-batch, and its store failing for 60 s → no row lost
or duplicated, counted by record id.

Real processes (``voice telemetry``, the embedded ClickHouse) against the real broker:

* **killed mid-batch**: records flow steadily while the sink is SIGKILLed three times at
  random points of its batches (taken, inserting, inserted-not-committed) and started again.
  Every record is then in ``voice.events`` exactly once by its id, and once the engine has
  merged (``OPTIMIZE … FINAL``) there is one row per id even without ``FINAL``.
* **the store failing for 60 s**: the sink's store lives on a small tmpfs that the test fills
  (a full disk: ClickHouse answers ``NOT_ENOUGH_SPACE``) while records keep coming, then
  frees. The sink waits (paused, retrying the same batch with the same dedupe token,
  committing nothing), stays up and dead-letters nothing; afterwards every record is stored
  once. Before the sink took a store failing as a whole for a refusal of the rows, it
  dead-lettered the batch and committed past it — those rows never reached ClickHouse.

Not run here: a ClickHouse *server* made unreachable (server mode). No usable server exists
on this machine (Debian's ``clickhouse-server`` is 18.16: no ``DateTime64``, no ``Map``, and
clickhouse-connect cannot even open a session on it). The sink's path for it is the same as
for the full disk — ``telemetry.store.unavailable`` → pause, back off, retry the same token —
with a connection error in place of code 243 (``tests/unit/test_telemetry_sink.py``).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException

from schemas.agent import TelemetryEvent
from streams.settings import VoiceSettings
from streams.topics import AGENT, TELEMETRY, WORKFLOWS, all_specs, topic_name
from telemetry.store import open_store, telemetry_settings
from tests.integration.test_telemetry_sink import Item, produce, rec
from tests.support import read_all, sink_caught_up, sink_committed, spawn_voice, stop, wait_for

pytestmark = [pytest.mark.faults, pytest.mark.integration]

OUTAGE_S = 60
SINK_ENV = {"VOICE_TELEMETRY_QUERY_PORT": "0", "VOICE_TELEMETRY_FLUSH_MS": "300",
            "VOICE_TELEMETRY_BATCH_ROWS": "150"}


def records(settings: VoiceSettings, tag: str, n: int) -> list[Item]:
    """``n`` records with ids ``{tag}-{i}`` over three topics and every partition."""
    specs = (TELEMETRY, AGENT, WORKFLOWS)
    return [rec(settings, specs[i % 3], TelemetryEvent(name=f"{tag}-{i}"), key=f"k{i % 17}",
                id=f"{tag}-{i}") for i in range(n)]


class Stream:
    """Produces records in bursts from a thread, so they keep arriving while the sink works."""

    def __init__(self, settings: VoiceSettings, items: list[Item], bursts: int,
                 every_s: float) -> None:
        self.settings, self.items, self.bursts, self.every_s = settings, items, bursts, every_s
        self.done = threading.Event()
        self.failed: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            size = -(-len(self.items) // self.bursts)
            for start in range(0, len(self.items), size):
                produce(self.settings, self.items[start:start + size])
                time.sleep(self.every_s)
        except BaseException as exc:  # reported by join()
            self.failed.append(exc)
        finally:
            self.done.set()

    def __enter__(self) -> Stream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(120)
        assert not self._thread.is_alive() and not self.failed, self.failed


def committed_total(settings: VoiceSettings) -> int | None:
    """Records the sink's group has committed, over every topic it reads; None while the
    broker cannot say (its group coordinator moving, as it does under a killed member)."""
    try:
        return sum(max(offset, 0) for offset in sink_committed(settings).values())
    except KafkaException:
        return None


def known(value: int | None) -> tuple[int] | None:
    """``value`` in a (truthy) tuple once it is known, for ``wait_for``."""
    return None if value is None else (value,)


def stored_ids(settings: VoiceSettings) -> tuple[list[str], int]:
    """Event ids in ``voice.events`` (``FINAL``), and its row count once merged without it."""
    store = open_store(telemetry_settings(settings))
    try:
        ids = [r[0] for r in store.query("SELECT event_id FROM voice.events FINAL").rows]
        store.command("OPTIMIZE TABLE voice.events FINAL")
        (merged,), = store.query("SELECT count() FROM voice.events").rows
        return ids, merged
    finally:
        store.close()


def dead_letters(settings: VoiceSettings) -> list[str]:
    """``topic@offset`` of every record on a dead-letter topic of the stack."""
    return [f"{m.topic()}@{m.offset()}" for s in all_specs() if s.name.endswith(".dlq")
            for m in read_all(settings, topic_name(settings, s))]


def assert_each_stored_once(settings: VoiceSettings, items: list[Item]) -> None:
    ids, merged = stored_ids(settings)
    want = {dict(h)["ce_id"].decode() for _t, _k, _v, h in items}
    assert len(want) == len(items)
    missing, extra = want - set(ids), set(ids) - want
    assert not missing, f"{len(missing)} records lost, e.g. {sorted(missing)[:3]}"
    assert not extra, f"rows of no produced record: {sorted(extra)[:3]}"
    assert len(ids) == len(want), "a record id twice (FINAL)"
    assert merged == len(want), "a duplicate row left after the merge"


def test_a_sink_killed_mid_batch_loses_and_duplicates_nothing(settings: VoiceSettings,
                                                             tmp_path: Path) -> None:
    items = records(settings, "kill", 3000)
    sink = spawn_voice(settings, "telemetry", log=tmp_path / "sink0.log", **SINK_ENV)
    kills = 0
    try:
        with Stream(settings, items, bursts=30, every_s=0.4) as stream:
            while kills < 3:
                (before,) = wait_for(lambda: known(committed_total(settings)), timeout=60,
                                     interval=0.5, what="the committed offsets")

                def working(b: int = before) -> bool:
                    now = committed_total(settings)
                    return now is not None and now > b

                # It is working (taking, inserting, committing): kill it somewhere in a batch.
                wait_for(working, timeout=90, interval=0.2, what="the sink committing a batch")
                time.sleep(random.uniform(0.0, 0.3))
                os.kill(sink.pid, signal.SIGKILL)
                sink.wait(10)
                kills += 1
                sink = spawn_voice(settings, "telemetry", log=tmp_path / f"sink{kills}.log",
                                   **SINK_ENV)
            stream.done.wait(120)
        wait_for(lambda: sink_caught_up(settings), timeout=180, interval=1,
                 what="the restarted sink storing every record")
        assert sink.poll() is None
    finally:
        stop(sink)
    assert kills == 3
    assert_each_stored_once(settings, items)
    assert not dead_letters(settings)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 128 MiB tmpfs for the store's folder, to fill (needs root with CAP_SYS_ADMIN)."""
    where = tmp_path / "disk"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=128m", "tmpfs", str(where)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs to fill: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """Fill ``disk`` to the last byte; returns the file to delete to free it."""
    filler = disk / "filler"
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler


def test_a_store_failing_for_60s_loses_and_duplicates_nothing(settings: VoiceSettings,
                                                              tmp_path: Path,
                                                              small_disk: Path) -> None:
    on_disk = settings.model_copy(update={"state_dir": small_disk})
    env = {**SINK_ENV, "VOICE_STATE_DIR": str(small_disk)}
    log = tmp_path / "sink.log"
    sink = spawn_voice(settings, "telemetry", log=log, **env)
    first, during = records(settings, "before", 300), records(settings, "during", 600)
    try:
        produce(settings, first)
        wait_for(lambda: sink_caught_up(settings), timeout=90, interval=0.5,
                 what="the first records stored")
        filler = fill(small_disk)
        try:
            with Stream(settings, during, bursts=20, every_s=1.0):
                pass  # records keep arriving through the first 20 s of the outage
            deadline = time.monotonic() + OUTAGE_S
            while time.monotonic() < deadline:
                assert sink.poll() is None, "the sink stayed up through the outage"
                assert not dead_letters(settings), "nothing is dead-lettered for a full disk"
                time.sleep(5)
            assert "(ClickHouse code 243)" in log.read_text(), "the disk was full for the sink"
            assert not sink_caught_up(settings), "nothing committed past what is not stored"
        finally:
            filler.unlink()
        wait_for(lambda: sink_caught_up(settings), timeout=120, interval=1,
                 what="the sink storing everything once the disk has room")
        assert sink.poll() is None
    finally:
        stop(sink)
    assert_each_stored_once(on_disk, first + during)
    assert not dead_letters(settings)
