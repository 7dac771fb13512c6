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
from dataclasses import dataclass
from typing import Any, Protocol

from consumers.assistant.datasets import (
    DatasetUnavailable,
    OpenedCache,
    fetch_record,
    unopenable,
)
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
    """Reads images from ``voice.datasets`` and keeps the opened ones (``OpenedCache``)."""

    def __init__(self, settings: VoiceSettings, sealer: Sealer, cache_bytes: int) -> None:
        self.settings, self.sealer = settings, sealer
        self.topic = topic_name(settings, DATASETS)
        self.opened: OpenedCache[LoadedImage] = OpenedCache(
            sealer, cache_bytes, lambda i: len(i.data), "image")

    def load(self, ref: dict[str, Any]) -> LoadedImage:
        image_id = str(ref.get("image_id"))
        hit = self.opened.get(image_id)
        if hit is not None:
            return hit
        rec = fetch_record(self.settings, self.topic, int(ref["partition"]), int(ref["offset"]),
                           kind=ImageRecorded)
        if rec.image_id != image_id:
            raise DatasetUnavailable(f"{self.topic}[{ref['partition']}]@{ref['offset']} holds "
                                     f"image {rec.image_id!r}, not {image_id!r}")
        try:
            data = self.sealer.open(rec.image_id, "image", rec.image)
        except SealingError as exc:
            raise unopenable("image", image_id, exc) from None
        loaded = LoadedImage(rec.image_id, rec.owner, rec.media_type, data, rec.namespace)
        self.opened.put(image_id, loaded)
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
