"""Datasets a turn may read: fetched from ``voice.datasets`` by position, opened, cached.

The edge records each uploaded CSV once on the compacted ``voice.datasets`` (sealed with the
dataset's own data key) and hands turns a ``DatasetRef`` (partition, offset), so a worker on any
machine fetches exactly that record: no table of every dataset on every worker. Opened datasets
are kept in memory (least recently used first out, bounded in bytes: ``OpenedCache``, which
keeps opened images too); never on disk.
"""

from __future__ import annotations

import csv
import io
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from confluent_kafka import Consumer, TopicPartition

from schemas.assistant import DatasetRecorded, DatasetRef
from schemas.base import Record
from streams.envelope import DecodeError, decode
from streams.sealing import Sealer, SealingError
from streams.settings import VoiceSettings
from streams.topics import DATASETS, topic_name

R = TypeVar("R", bound=Record)
T = TypeVar("T")


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


def unopenable(what: str, item_id: str, exc: Exception) -> DatasetUnavailable:
    """The error for an item (a dataset, an image) whose key no longer opens it (erased)."""
    return DatasetUnavailable(f"{what} {item_id!r} cannot be opened: {type(exc).__name__}")


class OpenedCache(Generic[T]):
    """Opened items (datasets, images) kept in memory by id: least recently used out first,
    bounded in bytes (``size`` of each), never on disk. A hit is checked live before it is
    served: an item erased since it was opened is dropped, and unavailable as on the log."""

    def __init__(self, sealer: Sealer, cache_bytes: int, size: Callable[[T], int],
                 what: str) -> None:
        self.sealer = sealer
        self.cache_bytes = cache_bytes
        self.size = size
        self.what = what
        self._items: OrderedDict[str, T] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def __contains__(self, item_id: object) -> bool:
        with self._lock:
            return item_id in self._items

    def _evict(self, item_id: str) -> None:
        with self._lock:
            gone = self._items.pop(item_id, None)
            if gone is not None:
                self._size -= self.size(gone)

    def get(self, item_id: str) -> T | None:
        """The kept item (now the most recently used), or ``None``; ``DatasetUnavailable`` if
        it was erased since it was opened."""
        with self._lock:
            hit = self._items.get(item_id)
            if hit is not None:
                self._items.move_to_end(item_id)
        if hit is None:
            return None
        try:  # erased since it was opened? Then it is no longer there to read.
            self.sealer.check_live(item_id)
        except SealingError as exc:
            self._evict(item_id)
            raise unopenable(self.what, item_id, exc) from None
        return hit

    def put(self, item_id: str, item: T) -> None:
        """Keep ``item``, then drop the least recently used past the bound (never the last)."""
        with self._lock:
            if item_id not in self._items:
                self._items[item_id] = item
                self._size += self.size(item)
            while self._size > self.cache_bytes and len(self._items) > 1:
                _, old = self._items.popitem(last=False)
                self._size -= self.size(old)


class KafkaDatasets:
    """Reads datasets from ``voice.datasets`` and keeps the opened ones (``OpenedCache``)."""

    def __init__(self, settings: VoiceSettings, sealer: Sealer, cache_bytes: int) -> None:
        self.settings = settings
        self.sealer = sealer
        self.topic = topic_name(settings, DATASETS)
        self.opened: OpenedCache[LoadedDataset] = OpenedCache(
            sealer, cache_bytes, lambda d: len(d.csv_text), "dataset")

    def load(self, ref: DatasetRef) -> LoadedDataset:
        hit = self.opened.get(ref.dataset_id)
        if hit is not None:
            return hit
        rec = fetch_record(self.settings, self.topic, ref.partition, ref.offset)
        if rec.dataset_id != ref.dataset_id:
            raise DatasetUnavailable(f"{self.topic}[{ref.partition}]@{ref.offset} holds "
                                     f"dataset {rec.dataset_id!r}, not {ref.dataset_id!r}")
        try:
            meta = self.sealer.open_json(rec.dataset_id, "meta", rec.meta)
            text = self.sealer.open_text(rec.dataset_id, "csv", rec.csv)
        except SealingError as exc:
            raise unopenable("dataset", rec.dataset_id, exc) from None
        loaded = LoadedDataset(rec.dataset_id, rec.owner, str(meta.get("name") or "dataset"),
                               tuple(meta.get("columns") or ()), rec.rows, text, rec.namespace)
        self.opened.put(rec.dataset_id, loaded)
        return loaded
