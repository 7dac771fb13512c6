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
import json
import threading
from collections import OrderedDict
from typing import Literal, NamedTuple

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.keys import DataKeyWrapped, KekVersions
from streams.kek import Kek, KekError
from streams.sealing import KeyErased, KeyNotFound, SealingError

Applied = Literal["new", "rewrap", "same", "lost", "erased"]
"""What a ``DataKeyWrapped`` did to the ring: a new key, a re-wrap of the held one, the held
record again, a losing proposal (ignored), or a record for an erased id (ignored)."""


CIPHERS_KEPT = 1024
"""Ready ciphers the ring keeps (the ids used last): building one from its key cost a seal or
an open ~7 µs of CPU in a running worker (a seal ~20), and a turn seals ~17 times (issue 14,
thirty-sixth pass). Each is ~2.5 KB, so a ring of every conversation an edge opened would
outgrow the edge's memory."""


def wrap_aad(id_: str, version: int, key_id: str, kek_version: int) -> bytes:
    """The AAD of a wrapped data key: a wrap copied under another id or version does not open."""
    return f"voice/key/v2|{id_}|{version}|{key_id}|{kek_version}".encode()


class Held(NamedTuple):
    """One id's winning record, compact: a tuple of atoms, which the garbage collector stops
    tracking, so a ring of 100,000 ids costs no collection time. Parsed in full only when its
    key is first unwrapped."""

    key_id: str
    kek_version: int
    version: int
    raw: bytes
    """The record's JSON as it was on the topic."""


class KeyRing:
    """Ids → data keys, erased ids, and the KEK versions in force. Thread-safe."""

    def __init__(self, kek: Kek) -> None:
        self._kek = kek
        self._held: dict[str, Held] = {}
        self._plain: dict[str, bytes] = {}
        """Unwrapped keys, filled at each id's first lookup (so a start unwraps nothing)."""
        self._ciphers: OrderedDict[str, AESGCM] = OrderedDict()
        """A ready cipher of each id used lately (``CIPHERS_KEPT``), dropped with its key."""
        self._erased: set[str] = set()
        self.kek_current = 1
        """The KEK version new keys are wrapped under."""
        self.kek_retired: frozenset[int] = frozenset()
        self._lock = threading.Lock()

    # -- folding records in ----------------------------------------------------------------

    def apply_key(self, rec: DataKeyWrapped) -> Applied:
        """Fold one ``DataKeyWrapped`` in (the rules in the module docstring)."""
        return self._apply(rec.id, Held(rec.key_id, rec.kek_version, rec.version,
                                        rec.model_dump_json().encode()))

    def apply_json(self, id_: str, raw: bytes) -> Applied:
        """Fold one ``DataKeyWrapped`` as its JSON, checking only what the rules read (the
        startup path: a full validation per record would cost most of the start)."""
        doc = json.loads(raw)
        key_id, kek_version, version = doc["key_id"], doc["kek_version"], doc.get("version", 1)
        if doc.get("id") != id_:
            raise ValueError(f"record of id {doc.get('id')!r} under key {id_!r}")
        if not (isinstance(key_id, str) and 8 <= len(key_id) <= 64
                and type(kek_version) is int and kek_version >= 1
                and type(version) is int and version >= 1):
            raise ValueError(f"not a wrapped data key of {id_!r}")
        return self._apply(id_, Held(key_id, kek_version, version, raw))

    def _apply(self, id_: str, new: Held) -> Applied:
        with self._lock:
            if id_ in self._erased:
                return "erased"
            held = self._held.get(id_)
            if held is None:
                self._held[id_] = new
                return "new"
            if held.key_id != new.key_id:
                return "lost"
            if held.kek_version == new.kek_version:
                return "same"
            # A re-wrap of the key already held: the unwrapped key, if any, stays valid.
            self._held[id_] = new
            return "rewrap"

    def apply_tombstone(self, id_: str) -> None:
        """Erase ``id_``: drop its key for good (in this process)."""
        with self._lock:
            self._held.pop(id_, None)
            self._plain.pop(id_, None)
            self._ciphers.pop(id_, None)
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
            return "live" if id_ in self._held else "absent"

    def version(self, id_: str) -> int:
        """The data key version of ``id_`` (``KeyErased`` / ``KeyNotFound`` otherwise)."""
        with self._lock:
            return self._get(id_).version

    def record(self, id_: str) -> DataKeyWrapped:
        """The winning record of ``id_`` (``KeyErased`` / ``KeyNotFound`` otherwise)."""
        with self._lock:
            raw = self._get(id_).raw
        return DataKeyWrapped.model_validate_json(raw)

    def key(self, id_: str, version: int) -> bytes:
        """The data key of ``id_`` at ``version``: a dict hit once unwrapped."""
        with self._lock:
            return self._key(id_, version)

    def cipher(self, id_: str, version: int) -> AESGCM:
        """The data key of ``id_`` at ``version`` as a ready cipher, kept among the
        ``CIPHERS_KEPT`` used last (in the ring, so an erasure drops it with the key)."""
        with self._lock:
            kept = self._ciphers.get(id_)
            if kept is not None and self._get(id_).version == version:
                self._ciphers.move_to_end(id_)
                return kept
            cipher = self._ciphers[id_] = AESGCM(self._key(id_, version))
            if len(self._ciphers) > CIPHERS_KEPT:
                self._ciphers.popitem(last=False)
            return cipher

    def _key(self, id_: str, version: int) -> bytes:
        plain = self._plain.get(id_)
        held = self._get(id_)
        if held.version != version:
            raise KeyNotFound(f"conversation {id_!r} has no key version {version}")
        if plain is None:
            plain = self._plain[id_] = self._unwrap(held)
        return plain

    def key_to_rewrap(self, id_: str) -> bytes:
        """The live key of ``id_`` for a rotation, even under a retired KEK version (a key
        created under the old version while a rotation ran is rescued by the next one)."""
        with self._lock:
            held = self._get(id_)
            plain = self._plain.get(id_)
            if plain is None:
                plain = self._plain[id_] = self._unwrap(held, allow_retired=True)
            return plain

    def live_ids(self) -> list[str]:
        """Every id holding a key."""
        with self._lock:
            return list(self._held)

    def erased_ids(self) -> list[str]:
        """Every id this process saw erased."""
        with self._lock:
            return list(self._erased)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)

    def _get(self, id_: str) -> Held:
        if id_ in self._erased:
            raise KeyErased(f"conversation {id_!r} was erased")
        held = self._held.get(id_)
        if held is None:
            raise KeyNotFound(f"conversation {id_!r} has no data key")
        return held

    def _unwrap(self, held: Held, allow_retired: bool = False) -> bytes:
        rec = DataKeyWrapped.model_validate_json(held.raw)
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
