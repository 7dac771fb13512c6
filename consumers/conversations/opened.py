"""The plaintexts of transcript entries a worker has opened, kept for its conversations' next turns.

Why: a turn hands the model the conversation's messages and replies since its summary, and each
turn opened every one of them again — parse, key lookup, base64, AES-GCM — though only the last
message and reply were new: ~13 % of the step thread's Python time at 60 turns a conversation
(docs/benchmarks.md, issue 14, twentieth pass). A turn now opens what it has not opened before.

An entry is known by its conversation, content id, key version and nonce: the same sealed blob.
The texts kept are bounded by characters (``MAX_CHARS``), the least recently used dropped first.

Erasure is obeyed as the sealer obeys it: ``open`` checks that the conversation's key is live
before serving a kept text (``Sealer.check_live``: an erasure learnt from any process is seen at
the next read), and ``forget`` drops a conversation's texts when its erasure is read. It must
never serve a text without that check, nor keep anything but what ``Sealer.open_text`` returned.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

from schemas.base import Sealed
from streams.sealing import Sealer

MAX_CHARS = 8_000_000
"""At most this many characters of plaintext kept (a few tens of MB at the most)."""

_Key = tuple[str, str, int, str]


class OpenedTexts:
    """Opened transcript entries by (conversation, content id, key version, nonce); LRU."""

    def __init__(self, sealer: Sealer, max_chars: int = MAX_CHARS) -> None:
        self.sealer = sealer
        self.max_chars = max_chars
        self._texts: OrderedDict[_Key, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # steps open on their loop; erasures are read on Faust's

    def check(self, conversation: str) -> None:
        """``KeyErased`` if the conversation was erased: call it before a read that may use
        kept texts (``open`` does not ask the key store again for each)."""
        self.sealer.check_live(conversation)

    def open(self, conversation: str, content_id: str, sealed: Sealed) -> str:
        """The entry's plaintext: kept, or opened now (and kept). Call ``check`` first."""
        return self.open_all(conversation, [(content_id, sealed)])[0]

    def open_all(self, conversation: str, blobs: Sequence[tuple[str, Sealed]]) -> list[str]:
        """Each (content id, blob)'s plaintext, as ``open`` gives it, with the lock taken once
        to find the kept ones and once to keep the others. Call ``check`` first."""
        keys = [(conversation, content_id, sealed.key_version, sealed.nonce)
                for content_id, sealed in blobs]
        with self._lock:
            found = [self._texts.get(key) for key in keys]
            for key, text in zip(keys, found, strict=True):
                if text is not None:
                    self._texts.move_to_end(key)
        if None not in found:
            return found  # type: ignore[return-value]
        texts = [text if text is not None else self.sealer.open_text(conversation, *blob)
                 for text, blob in zip(found, blobs, strict=True)]
        with self._lock:
            for key, text, was in zip(keys, texts, found, strict=True):
                if was is None and len(text) <= self.max_chars and key not in self._texts:
                    self._texts[key] = text
                    self._chars += len(text)
            while self._chars > self.max_chars:
                _, dropped = self._texts.popitem(last=False)
                self._chars -= len(dropped)
        return texts

    def forget(self, conversation: str) -> None:
        """Drop every text of ``conversation`` (its erasure was read)."""
        with self._lock:
            for key in [k for k in self._texts if k[0] == conversation]:
                self._chars -= len(self._texts.pop(key))

    def __len__(self) -> int:
        return len(self._texts)
