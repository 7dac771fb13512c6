"""Datasets a turn may read: fetched from ``voice.datasets`` by position, opened, cached.

The edge records each uploaded CSV once on the compacted ``voice.datasets`` (sealed with the
dataset's own data key) and hands turns a ``DatasetRef`` (partition, offset), so a worker on any
machine fetches exactly that record: no table of every dataset on every worker. Opened datasets
are kept in memory (least recently used first out, bounded in bytes); never on disk.
"""

from __future__ import annotations

import csv
import io
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol, TypeVar

from confluent_kafka import Consumer, TopicPartition

from schemas.assistant import DatasetRecorded, DatasetRef
from schemas.base import Record
from streams.envelope import DecodeError, decode
from streams.sealing import Sealer, SealingError
from streams.settings import VoiceSettings
from streams.topics import DATASETS, topic_name

R = TypeVar("R", bound=Record)


class DatasetUnavailable(Exception):
    """The dataset cannot be read (gone from the log, erased, or not the caller's)."""


@dataclass(frozen=True)
class LoadedDataset:
    """An opened dataset: its CSV text and what the header says."""

    dataset_id: str
    owner: str
    name: str
    columns: tuple[str, ...]
    rows: int
    csv_text: str
    namespace: str | None = None
    """The namespace it was uploaded into (``None``: the default one)."""

    def records(self) -> list[dict[str, str]]:
        """The rows as dicts of text (the csv module's reading)."""
        return list(csv.DictReader(io.StringIO(self.csv_text)))


class DatasetSource(Protocol):
    """Where a turn's datasets come from (Kafka in the worker; memory in tests)."""

    def load(self, ref: DatasetRef) -> LoadedDataset: ...


class MemoryDatasets:
    """Datasets held in a dict by id (tests)."""

    def __init__(self, datasets: list[LoadedDataset] | None = None) -> None:
        self.by_id = {d.dataset_id: d for d in datasets or []}

    def load(self, ref: DatasetRef) -> LoadedDataset:
        try:
            return self.by_id[ref.dataset_id]
        except KeyError:
            raise DatasetUnavailable(f"no dataset {ref.dataset_id!r}") from None


def from_csv(dataset_id: str, owner: str, name: str, text: str) -> LoadedDataset:
    """A dataset from CSV text (its header names the columns)."""
    rows = list(csv.reader(io.StringIO(text)))
    header = tuple(rows[0]) if rows else ()
    return LoadedDataset(dataset_id, owner, name, header, max(0, len(rows) - 1), text)


def fetch_record(settings: VoiceSettings, topic: str, partition: int, offset: int,
                 timeout: float = 10.0, kind: type[R] = DatasetRecorded  # type: ignore[assignment]
                 ) -> R:
    """The record of type ``kind`` (``DatasetRecorded`` or ``ImageRecorded``) at
    ``topic[partition]@offset``; ``DatasetUnavailable`` if that offset holds something else or
    no longer exists (compacted away)."""
    c = Consumer({"bootstrap.servers": settings.bootstrap,
                  "group.id": f"voice-dataset-{uuid.uuid4().hex}", "enable.auto.commit": False,
                  "fetch.message.max.bytes": 2 * 1024 * 1024})
    try:
        c.assign([TopicPartition(topic, partition, offset)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                if msg.error().fatal():
                    raise DatasetUnavailable(f"cannot read {topic}[{partition}]: {msg.error()}")
                continue
            if msg.offset() != offset:
                break
            try:
                env = decode(msg.key(), msg.value(), msg.headers())
            except DecodeError as exc:
                raise DatasetUnavailable(f"{topic}[{partition}]@{offset}: {exc.reason}") from None
            if not isinstance(env.record, kind):
                break
            return env.record
    finally:
        c.close()
    raise DatasetUnavailable(f"no dataset record at {topic}[{partition}]@{offset}")


class KafkaDatasets:
    """Reads datasets from ``voice.datasets`` and keeps the opened ones (LRU by bytes)."""

    def __init__(self, settings: VoiceSettings, sealer: Sealer, cache_bytes: int) -> None:
        self.settings = settings
        self.sealer = sealer
        self.topic = topic_name(settings, DATASETS)
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, LoadedDataset] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def _evict(self, key: str) -> None:
        with self._lock:
            gone = self._cache.pop(key, None)
            if gone is not None:
                self._size -= len(gone.csv_text)

    def load(self, ref: DatasetRef) -> LoadedDataset:
        with self._lock:
            hit = self._cache.get(ref.dataset_id)
            if hit is not None:
                self._cache.move_to_end(ref.dataset_id)
        if hit is not None:
            try:  # erased since it was opened? Then it is no longer there to read.
                self.sealer.check_live(ref.dataset_id)
            except SealingError as exc:
                self._evict(ref.dataset_id)
                raise DatasetUnavailable(f"dataset {ref.dataset_id!r} cannot be opened: "
                                         f"{type(exc).__name__}") from None
            return hit
        rec = fetch_record(self.settings, self.topic, ref.partition, ref.offset)
        if rec.dataset_id != ref.dataset_id:
            raise DatasetUnavailable(f"{self.topic}[{ref.partition}]@{ref.offset} holds "
                                     f"dataset {rec.dataset_id!r}, not {ref.dataset_id!r}")
        try:
            meta = self.sealer.open_json(rec.dataset_id, "meta", rec.meta)
            text = self.sealer.open_text(rec.dataset_id, "csv", rec.csv)
        except SealingError as exc:
            raise DatasetUnavailable(f"dataset {rec.dataset_id!r} cannot be opened: "
                                     f"{type(exc).__name__}") from None
        loaded = LoadedDataset(rec.dataset_id, rec.owner, str(meta.get("name") or "dataset"),
                               tuple(meta.get("columns") or ()), rec.rows, text, rec.namespace)
        with self._lock:
            if rec.dataset_id not in self._cache:
                self._cache[rec.dataset_id] = loaded
                self._size += len(text)
            while self._size > self.cache_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._size -= len(old.csv_text)
        return loaded
