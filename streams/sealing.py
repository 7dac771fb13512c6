"""Sealed transcripts: per-id data keys (AES-256-GCM) behind a small key-store port.

Every piece of content (messages, replies, proposals, chats, contributions, datasets) travels
and rests as a ``schemas.Sealed`` blob under its id's data key. Erasing an id destroys that key,
so every copy of its content on every topic, replica and backup becomes unreadable at once
(crypto-shredding) without rewriting the log.

The production store is ``streams.keyservice.ClusterKeyStore`` (the key topic, held in memory
by every process, docs/keys.md); ``MemoryKeyStore`` is the unit tests' adapter of the same port.

This module must never log, print, repr or persist a plaintext or an unwrapped data key, and
must never reuse a nonce under one key.
"""

from __future__ import annotations

import base64
import contextlib
import json
import threading
from contextlib import suppress
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.base import Sealed
from streams.entropy import random_bytes
from streams.settings import VoiceSettings

_NONCE_BYTES = 12  # 96 bits: GCM's native nonce size, no GHASH-derived counter


class SealingError(Exception):
    """Root of every error of this module; messages name ids, never content."""

    plain_message = True


class KeyNotFound(SealingError):
    """The conversation (or that key version of it) never had a data key."""


class KeyErased(SealingError):
    """The conversation was erased: its data keys are destroyed, for good."""

    retryable = False
    """A workflow step failing on it fails at once: the key never comes back."""


class OpenFailed(SealingError):
    """A sealed blob did not authenticate: tampered, or sealed for another record."""


class KeyStore(Protocol):
    """Where data keys live. Erasure is final: ``get`` raises ``KeyErased``."""

    def create(self, conversation: str, tenant: str | None = None) -> int:
        """Make a fresh 256-bit data key unless a live one exists; return the live version."""

    def get(self, conversation: str, version: int) -> bytes:
        """The data key; ``KeyErased`` after ``destroy``, ``KeyNotFound`` if never created."""

    def cipher(self, conversation: str, version: int) -> AESGCM:
        """The data key as a cipher to seal and open with; raises as ``get`` does."""

    def destroy(self, conversation: str) -> None:
        """Delete every version and leave a tombstone, so the keys can never come back."""

    def current_version(self, conversation: str) -> int:
        """The version new content is sealed with."""

    def close(self) -> None:
        """Release what the store holds (threads, clients)."""


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


class MemoryKeyStore:
    """A ``KeyStore`` in a dict, for unit tests; same contract as ``ClusterKeyStore``."""

    def __init__(self, keys: dict[str, dict[int, bytes]] | None = None) -> None:
        self._keys: dict[str, dict[int, bytes]] = {c: dict(v) for c, v in (keys or {}).items()}
        """Preloaded keys are for recorded test histories, whose keys travel with them."""
        self._erased: set[str] = set()
        self._lock = threading.Lock()

    def _live(self, conversation: str) -> dict[int, bytes]:
        if conversation in self._erased:
            raise KeyErased(f"conversation {conversation!r} was erased")
        if conversation not in self._keys:
            raise KeyNotFound(f"conversation {conversation!r} has no data key")
        return self._keys[conversation]

    def create(self, conversation: str, tenant: str | None = None) -> int:
        with self._lock:
            with suppress(KeyNotFound):
                return max(self._live(conversation))
            self._keys[conversation] = {1: AESGCM.generate_key(bit_length=256)}
            return 1

    def get(self, conversation: str, version: int) -> bytes:
        with self._lock:
            keys = self._live(conversation)
            if version not in keys:
                raise KeyNotFound(f"conversation {conversation!r} has no key version {version}")
            return keys[version]

    def cipher(self, conversation: str, version: int) -> AESGCM:
        return AESGCM(self.get(conversation, version))

    def destroy(self, conversation: str) -> None:
        with self._lock:
            self._keys.pop(conversation, None)
            self._erased.add(conversation)

    def current_version(self, conversation: str) -> int:
        with self._lock:
            return max(self._live(conversation))

    def close(self) -> None:
        pass


def check_id(name: str, value: str) -> None:
    # '|' separates the AAD's fields; refusing it keeps the AAD unambiguous.
    if not value or "|" in value:
        raise SealingError(f"{name} must be non-empty and free of '|': {value!r}")


def _aad(conversation: str, content_id: str, key_version: int) -> bytes:
    return f"voice/v1|{conversation}|{content_id}|{key_version}".encode()


class Sealer:
    """Seals and opens content under its id's data key, which the store holds in memory.

    The AAD binds id, content id and key version (docs/decisions/0002), so a blob moved to
    another record or id does not open. Nonces are 96 random bits from the OS's CSPRNG
    (``streams.entropy``); keep a key under 2**32 seals so a nonce collision stays negligible
    (NIST SP 800-38D) — far above any conversation's length.

    No cache of its own: the store is the one place a key lives in a process, so an erasure
    the store learns of (from any process, on the key topic) is obeyed by the next call.
    """

    def __init__(self, store: KeyStore) -> None:
        self._store = store

    @property
    def store(self) -> KeyStore:
        """The key store this sealer seals with."""
        return self._store

    def _current_cipher(self, conversation: str) -> tuple[int, AESGCM]:
        version = self._store.create(conversation)  # lazily, at the first content
        return version, self._store.cipher(conversation, version)

    def create(self, conversation: str, tenant: str | None = None) -> int:
        """Make sure the id has a data key (before its first content); its version."""
        check_id("conversation", conversation)
        return self._store.create(conversation, tenant)

    def seal(self, conversation: str, content_id: str, plaintext: bytes | str) -> Sealed:
        """Seal content under the conversation's current data key (created if none yet)."""
        check_id("conversation", conversation)
        check_id("content_id", content_id)
        data = plaintext.encode("utf-8") if isinstance(plaintext, str) else bytes(plaintext)
        version, cipher = self._current_cipher(conversation)
        nonce = random_bytes(_NONCE_BYTES)
        ciphertext = cipher.encrypt(nonce, data, _aad(conversation, content_id, version))
        return Sealed(key_version=version, nonce=_b64(nonce), ciphertext=_b64(ciphertext))

    def open(self, conversation: str, content_id: str, sealed: Sealed) -> bytes:
        """The plaintext; ``KeyErased`` if the conversation was erased, ``OpenFailed`` if the
        blob is tampered or belongs to another conversation or content id."""
        check_id("conversation", conversation)
        check_id("content_id", content_id)
        cipher = self._store.cipher(conversation, sealed.key_version)
        aad = _aad(conversation, content_id, sealed.key_version)
        try:
            return cipher.decrypt(_unb64(sealed.nonce), _unb64(sealed.ciphertext), aad)
        except (InvalidTag, ValueError):  # binascii.Error is a ValueError
            raise OpenFailed(
                f"cannot open content {content_id!r} of conversation {conversation!r}: "
                "tampered, or sealed for another record"
            ) from None

    def open_text(self, conversation: str, content_id: str, sealed: Sealed) -> str:
        return self.open(conversation, content_id, sealed).decode("utf-8")

    def seal_json(self, conversation: str, content_id: str, payload: dict[str, Any]) -> Sealed:
        # Canonical form: one payload always yields one plaintext, whatever order it was built in.
        text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return self.seal(conversation, content_id, text)

    def open_json(self, conversation: str, content_id: str, sealed: Sealed) -> dict[str, Any]:
        payload = json.loads(self.open(conversation, content_id, sealed))
        if not isinstance(payload, dict):
            raise OpenFailed(f"content {content_id!r} of {conversation!r} is not a JSON object")
        return payload

    def check_live(self, conversation: str) -> None:
        """``KeyErased`` unless the id's key is still live: for plaintext kept opened (a
        cache), so that an erasure learnt from any process is obeyed by the next read."""
        self._store.current_version(conversation)

    def holds(self, conversation: str) -> bool:
        """Whether the store already knows the id's key (or its erasure), so opening its
        content asks nothing of the key service. A store without that notion always does."""
        holds = getattr(self._store, "holds", None)
        return True if holds is None else bool(holds(conversation))

    def warm(self, conversation: str) -> None:
        """Learn the id's key from the key service (blocking: call it off the event loop);
        an id the service has no key for, or an erased one, is left for the opener to find."""
        with contextlib.suppress(KeyNotFound, KeyErased):
            self.check_live(conversation)

    def erase(self, conversation: str) -> None:
        """Destroy the id's keys in the store: every process drops them (docs/keys.md)."""
        self._store.destroy(conversation)

    def close(self) -> None:
        """Release the store."""
        self._store.close()


def sealer_for(settings: VoiceSettings) -> Sealer:
    """The process's sealer over the key service on the cluster (no local state)."""
    from streams.keyservice import key_store_for

    return Sealer(key_store_for(settings))
