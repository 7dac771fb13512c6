"""Images a turn shows the model: fetched from ``voice.datasets`` by position, opened, and put
into the messages as Messages API ``image`` blocks.

There is no shared filesystem: an image is uploaded through the edge (``ImageRecorded``,
sealed with its own key) and a chat's request names it by position, as for datasets. The
request and history carry a *reference block* per image (``image_ref``, built by
``consumers.assistant.agent``), which says where the image is and never its bytes, so the
sealed transcript stays small. ``resolve_images`` turns each reference into a base64 ``image``
block just before the model is called, for this turn's message and for every earlier request
its history rebuilds; an image that can no longer be read (erased, compacted away, another
owner's) becomes a short text saying so. A reference block never reaches a model.
"""

from __future__ import annotations

import base64
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Protocol

from consumers.assistant.datasets import DatasetUnavailable, fetch_record
from schemas.assistant import ImageRecorded
from streams.sealing import Sealer, SealingError
from streams.settings import VoiceSettings
from streams.topics import DATASETS, topic_name

REF_SOURCE = "voice_upload"
"""``source.type`` of a reference block (the Messages API has no such type: never sent)."""


@dataclass(frozen=True)
class LoadedImage:
    image_id: str
    owner: str
    media_type: str
    data: bytes
    namespace: str | None = None


class ImageSource(Protocol):
    """Where a turn's images come from (Kafka in the worker; memory in tests)."""

    def load(self, ref: dict[str, Any]) -> LoadedImage: ...


class MemoryImages:
    """Images held in a dict by id (tests)."""

    def __init__(self, images: list[LoadedImage] | None = None) -> None:
        self.by_id = {i.image_id: i for i in images or []}

    def load(self, ref: dict[str, Any]) -> LoadedImage:
        try:
            return self.by_id[str(ref.get("image_id"))]
        except KeyError:
            raise DatasetUnavailable(f"no image {ref.get('image_id')!r}") from None


class KafkaImages:
    """Reads images from ``voice.datasets`` and keeps the opened ones (LRU by bytes)."""

    def __init__(self, settings: VoiceSettings, sealer: Sealer, cache_bytes: int) -> None:
        self.settings, self.sealer = settings, sealer
        self.topic = topic_name(settings, DATASETS)
        self.cache_bytes = cache_bytes
        self._cache: OrderedDict[str, LoadedImage] = OrderedDict()
        self._size = 0
        self._lock = threading.Lock()

    def _evict(self, key: str) -> None:
        with self._lock:
            gone = self._cache.pop(key, None)
            if gone is not None:
                self._size -= len(gone.data)

    def load(self, ref: dict[str, Any]) -> LoadedImage:
        image_id = str(ref.get("image_id"))
        with self._lock:
            hit = self._cache.get(image_id)
            if hit is not None:
                self._cache.move_to_end(image_id)
        if hit is not None:
            try:  # erased since it was opened? Then it is no longer there to read.
                self.sealer.check_live(image_id)
            except SealingError as exc:
                self._evict(image_id)
                raise DatasetUnavailable(f"image {image_id!r} cannot be opened: "
                                         f"{type(exc).__name__}") from None
            return hit
        rec = fetch_record(self.settings, self.topic, int(ref["partition"]), int(ref["offset"]),
                           kind=ImageRecorded)
        if rec.image_id != image_id:
            raise DatasetUnavailable(f"{self.topic}[{ref['partition']}]@{ref['offset']} holds "
                                     f"image {rec.image_id!r}, not {image_id!r}")
        try:
            data = self.sealer.open(rec.image_id, "image", rec.image)
        except SealingError as exc:
            raise DatasetUnavailable(f"image {image_id!r} cannot be opened: "
                                     f"{type(exc).__name__}") from None
        loaded = LoadedImage(rec.image_id, rec.owner, rec.media_type, data, rec.namespace)
        with self._lock:
            if image_id not in self._cache:
                self._cache[image_id] = loaded
                self._size += len(data)
            while self._size > self.cache_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._size -= len(old.data)
        return loaded


def is_ref(block: Any) -> bool:
    """Whether ``block`` is an image reference block (to be resolved before the model)."""
    return (isinstance(block, dict) and block.get("type") == "image"
            and isinstance(block.get("source"), dict)
            and block["source"].get("type") == REF_SOURCE)


def _resolved(block: dict[str, Any], source: ImageSource, owner: str) -> dict[str, Any]:
    ref = block["source"]
    name = ref.get("name") or ref.get("image_id")
    try:
        image = source.load(ref)
    except DatasetUnavailable:
        return {"type": "text", "text": f"[image {name!r} is no longer available]"}
    if image.owner != owner:
        return {"type": "text", "text": f"[image {name!r} is not available]"}
    return {"type": "image", "source": {
        "type": "base64", "media_type": image.media_type,
        "data": base64.b64encode(image.data).decode("ascii")}}


def resolve_images(content: Any, source: ImageSource, owner: str) -> Any:
    """``content`` (a message's content, or a list of messages) with every image reference
    block replaced by the image itself, or by a text saying it is gone. Blocking (it may fetch
    from Kafka): run it off the event loop."""
    if isinstance(content, list):
        if any(isinstance(m, dict) and "role" in m for m in content):
            return [{**m, "content": resolve_images(m.get("content"), source, owner)}
                    if isinstance(m, dict) else m for m in content]
        if not any(is_ref(b) for b in content):
            return content
        return [_resolved(b, source, owner) if is_ref(b) else b for b in content]
    return content
