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

Each conversation's last turn read is kept too (``LastRead``: the positions it read, their
roles and opened texts), so the next turn of the conversation reads and opens only the
positions after them. Finding 1,000 kept texts one by one, reading 1,000 held records and
joining them was over half the step thread's Python time at 1,000 entries, though one message
and one reply were new (docs/benchmarks.md, issue 14, twenty-fourth pass). The same check
comes before a last read is served, and ``forget`` drops it with the texts.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from schemas.base import Sealed
from streams.sealing import Sealer

MAX_CHARS = 8_000_000
"""At most this many characters of plaintext kept (a few tens of MB at the most)."""

MAX_READS = 1024
"""At most this many conversations' last reads kept (all of them within ``max_chars`` too)."""

_Key = tuple[str, str, int, str]


@dataclass(frozen=True)
class LastRead:
    """The messages and replies one turn of a conversation read: their positions on the
    log's ``partition`` (``(seq, offset)``, oldest first), roles and opened texts."""

    partition: int
    positions: list[tuple[int, int]]
    roles: list[str]
    texts: list[str]

    @property
    def chars(self) -> int:
        return sum(map(len, self.texts))

    def reuse(self, partition: int, positions: list[tuple[int, int]]
              ) -> tuple[list[str], list[str]]:
        """The roles and texts of the first of ``positions`` that this read has read already
        (as many as it has: the positions it ends with, or holds for an older turn's)."""
        mine = self.positions
        if (partition != self.partition or not positions or not mine
                or type(positions[0]) is not tuple):  # pairs of another type never match
            return [], []
        at = bisect_left(mine, positions[0])  # positions only grow along a log
        count = min(len(mine) - at, len(positions))
        if not count or mine[at:at + count] != positions[:count]:
            return [], []
        return self.roles[at:at + count], self.texts[at:at + count]


class OpenedTexts:
    """Opened transcript entries by (conversation, content id, key version, nonce); LRU."""

    def __init__(self, sealer: Sealer, max_chars: int = MAX_CHARS) -> None:
        self.sealer = sealer
        self.max_chars = max_chars
        self._texts: OrderedDict[_Key, str] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()  # steps open on their loop; erasures are read on Faust's
        self._reads: OrderedDict[str, tuple[LastRead, int]] = OrderedDict()
        """conversation → its last read and that read's characters."""
        self._read_chars = 0

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

    def last_read(self, conversation: str) -> LastRead | None:
        """What the last turn of ``conversation`` read (``keep_read``). Call ``check`` first."""
        with self._lock:
            kept = self._reads.get(conversation)
            if kept is None:
                return None
            self._reads.move_to_end(conversation)
            return kept[0]

    def keep_read(self, conversation: str, read: LastRead) -> None:
        """Keep ``read`` as the last of ``conversation`` (if it fits), instead of the one
        before; the least recently used conversations' go first past ``MAX_READS``."""
        chars = read.chars
        with self._lock:
            self._drop_read(conversation)
            if chars > self.max_chars:
                return
            self._reads[conversation] = (read, chars)
            self._read_chars += chars
            while self._read_chars > self.max_chars or len(self._reads) > MAX_READS:
                self._read_chars -= self._reads.popitem(last=False)[1][1]

    def _drop_read(self, conversation: str) -> None:
        """Drop ``conversation``'s last read, if kept (the lock held)."""
        kept = self._reads.pop(conversation, None)
        if kept is not None:
            self._read_chars -= kept[1]

    def forget(self, conversation: str) -> None:
        """Drop every text of ``conversation``, and its last read (its erasure was read)."""
        with self._lock:
            for key in [k for k in self._texts if k[0] == conversation]:
                self._chars -= len(self._texts.pop(key))
            self._drop_read(conversation)

    def __len__(self) -> int:
        return len(self._texts)
