"""The key ring: one process's view of the key topic, in memory, and the rules that fold the
topic's records into it. Pure (no I/O): ``streams.keyservice`` feeds it from the broker.

The rules, applied in partition order (an id's records are all on one partition):

- the first ``DataKeyWrapped`` of an id wins; a later one with another ``key_id`` lost a
  creation race and is ignored (its writer adopts the winner and writes the winner again, so
  compaction, which keeps the last record, keeps the winner);
- a later one with the same ``key_id`` is a re-wrap (rotation): it replaces the wrapping;
- a tombstone erases the id for the life of the process: its key is dropped and nothing that
  follows for that id is taken;
- ``KekVersions`` says which KEK wraps new keys; a retired version never unwraps again.

This module must never log, print or repr an unwrapped data key.
"""

from __future__ import annotations

import base64
import threading
from dataclasses import dataclass
from typing import Literal

from schemas.keys import DataKeyWrapped, KekVersions
from streams.kek import Kek, KekError
from streams.sealing import KeyErased, KeyNotFound, SealingError

Applied = Literal["new", "rewrap", "same", "lost", "erased"]
"""What a ``DataKeyWrapped`` did to the ring: a new key, a re-wrap of the held one, the held
record again, a losing proposal (ignored), or a record for an erased id (ignored)."""


def wrap_aad(id_: str, version: int, key_id: str, kek_version: int) -> bytes:
    """The AAD of a wrapped data key: a wrap copied under another id or version does not open."""
    return f"voice/key/v2|{id_}|{version}|{key_id}|{kek_version}".encode()


@dataclass
class Entry:
    """One id's key as the ring holds it: the winning record and, once used, the key."""

    record: DataKeyWrapped
    plain: bytes | None = None
    """The unwrapped key, filled at its first lookup (so startup unwraps nothing)."""


class KeyRing:
    """Ids → data keys, erased ids, and the KEK versions in force. Thread-safe."""

    def __init__(self, kek: Kek) -> None:
        self._kek = kek
        self._entries: dict[str, Entry] = {}
        self._erased: set[str] = set()
        self.kek_current = 1
        """The KEK version new keys are wrapped under."""
        self.kek_retired: frozenset[int] = frozenset()
        self._lock = threading.Lock()

    # -- folding records in ----------------------------------------------------------------

    def apply_key(self, rec: DataKeyWrapped) -> Applied:
        """Fold one ``DataKeyWrapped`` in (the rules in the module docstring)."""
        with self._lock:
            if rec.id in self._erased:
                return "erased"
            held = self._entries.get(rec.id)
            if held is None:
                self._entries[rec.id] = Entry(rec)
                return "new"
            if held.record.key_id != rec.key_id:
                return "lost"
            if held.record.kek_version == rec.kek_version:
                return "same"
            # A re-wrap of the key already held: the unwrapped key, if any, stays valid.
            held.record = rec
            return "rewrap"

    def apply_tombstone(self, id_: str) -> None:
        """Erase ``id_``: drop its key for good (in this process)."""
        with self._lock:
            self._entries.pop(id_, None)
            self._erased.add(id_)

    def apply_kek(self, rec: KekVersions) -> None:
        """Take the KEK versions in force; a retired version is never unretired."""
        with self._lock:
            self.kek_current = max(self.kek_current, rec.current)
            self.kek_retired = self.kek_retired | frozenset(rec.retired)

    # -- reading -----------------------------------------------------------------------------

    def state(self, id_: str) -> Literal["live", "erased", "absent"]:
        """Whether the ring holds a key for ``id_``, knows it erased, or knows nothing."""
        with self._lock:
            if id_ in self._erased:
                return "erased"
            return "live" if id_ in self._entries else "absent"

    def record(self, id_: str) -> DataKeyWrapped:
        """The winning record of ``id_`` (``KeyErased`` / ``KeyNotFound`` otherwise)."""
        with self._lock:
            return self._entry(id_).record

    def key(self, id_: str, version: int) -> bytes:
        """The data key of ``id_`` at ``version``: a dict hit once unwrapped."""
        with self._lock:
            entry = self._entry(id_)
            if entry.record.version != version:
                raise KeyNotFound(f"conversation {id_!r} has no key version {version}")
            if entry.plain is None:
                entry.plain = self._unwrap(entry.record)
            return entry.plain

    def key_to_rewrap(self, id_: str) -> bytes:
        """The live key of ``id_`` for a rotation, even under a retired KEK version (a key
        created under the old version while a rotation ran is rescued by the next one)."""
        with self._lock:
            entry = self._entry(id_)
            if entry.plain is None:
                entry.plain = self._unwrap(entry.record, allow_retired=True)
            return entry.plain

    def live_ids(self) -> list[str]:
        """Every id holding a key."""
        with self._lock:
            return list(self._entries)

    def erased_ids(self) -> list[str]:
        """Every id this process saw erased."""
        with self._lock:
            return list(self._erased)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _entry(self, id_: str) -> Entry:
        if id_ in self._erased:
            raise KeyErased(f"conversation {id_!r} was erased")
        entry = self._entries.get(id_)
        if entry is None:
            raise KeyNotFound(f"conversation {id_!r} has no data key")
        return entry

    def _unwrap(self, rec: DataKeyWrapped, allow_retired: bool = False) -> bytes:
        if rec.kek_version in self.kek_retired and not allow_retired:
            raise SealingError(f"the key of {rec.id!r} is wrapped under KEK version "
                               f"{rec.kek_version}, which is retired: run `voice keys rotate`")
        try:
            return self._kek.unwrap(rec.kek_version, base64.b64decode(rec.nonce),
                                    base64.b64decode(rec.wrapped),
                                    wrap_aad(rec.id, rec.version, rec.key_id, rec.kek_version))
        except ValueError:  # bad base64
            raise KekError(f"the wrapped key of {rec.id!r} is not base64") from None


def wrap_record(kek: Kek, id_: str, key: bytes, key_id: str, kek_version: int,
                tenant: str | None = None, version: int = 1) -> DataKeyWrapped:
    """``key`` wrapped under KEK ``kek_version`` as the record the key topic carries."""
    nonce, wrapped = kek.wrap(kek_version, key, wrap_aad(id_, version, key_id, kek_version))
    return DataKeyWrapped(id=id_, tenant=tenant, key_id=key_id, version=version,
                          kek_version=kek_version, nonce=base64.b64encode(nonce).decode(),
                          wrapped=base64.b64encode(wrapped).decode())
