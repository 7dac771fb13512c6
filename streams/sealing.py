"""Sealed transcripts: per-conversation data keys (AES-256-GCM) behind a small key-store port.

Every piece of conversation content (messages, replies, proposals) travels and rests as a
``schemas.Sealed`` blob under its conversation's data key. Erasing a conversation destroys that
key, so every copy of its content on every topic, replica and backup becomes unreadable at once
(crypto-shredding) without rewriting the log.

This module must never log, print, repr or persist a plaintext or an unwrapped data key, and
must never reuse a nonce under one key. Data keys rest only wrapped by the master key.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import tempfile
import threading
from collections import OrderedDict
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from schemas.base import Sealed
from streams.settings import DEV_MASTER_KEY, VoiceSettings

_NONCE_BYTES = 12  # 96 bits: GCM's native nonce size, no GHASH-derived counter
_FORMAT = 1


class SealingError(Exception):
    """Root of every error of this module; messages name ids, never content."""

    plain_message = True


class KeyNotFound(SealingError):
    """The conversation (or that key version of it) never had a data key."""


class KeyErased(SealingError):
    """The conversation was erased: its data keys are destroyed, for good."""


class OpenFailed(SealingError):
    """A sealed blob did not authenticate: tampered, or sealed for another record."""


class KeyStore(Protocol):
    """Where conversations' data keys live. Erasure is final: ``get`` raises ``KeyErased``."""

    def create(self, conversation: str) -> int:
        """Make a fresh 256-bit data key unless a live one exists; return the live version."""

    def get(self, conversation: str, version: int) -> bytes:
        """The data key; ``KeyErased`` after ``destroy``, ``KeyNotFound`` if never created."""

    def destroy(self, conversation: str) -> None:
        """Delete every version and leave a tombstone, so the keys can never come back."""

    def current_version(self, conversation: str) -> int:
        """The version new content is sealed with."""


def master_key_from_env(env: str, value: str | None) -> bytes:
    """The master key from ``VOICE_MASTER_KEY``: base64 of 32 bytes, or else a passphrase.

    A passphrase goes through scrypt (not a bare hash) because people pick guessable ones.
    Surrounding whitespace is dropped (values often come from files ending in a newline).
    """
    value = (value or "").strip()
    if not value:
        if env in ("dev", "test"):
            return DEV_MASTER_KEY
        raise SealingError(f"VOICE_MASTER_KEY must be set when VOICE_ENV={env!r}")
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        raw = b""
    key = raw if len(raw) == 32 else _from_passphrase(value)
    if key == DEV_MASTER_KEY and env not in ("dev", "test"):
        raise SealingError(f"VOICE_MASTER_KEY is the public dev key, refused in {env!r}")
    return key


def _from_passphrase(passphrase: str) -> bytes:
    # A fixed salt keeps the derivation reproducible across processes; scrypt's cost still
    # makes guessing expensive. 2**15 × r=8 is ~32 MiB and ~0.1 s, once per process.
    kdf = Scrypt(salt=b"voice-master-key", length=32, n=2**15, r=8, p=1)
    return kdf.derive(passphrase.encode("utf-8"))


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text, validate=True)


class MemoryKeyStore:
    """A ``KeyStore`` in a dict, for unit tests; same contract as ``LocalKeyStore``."""

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

    def create(self, conversation: str) -> int:
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

    def destroy(self, conversation: str) -> None:
        with self._lock:
            self._keys.pop(conversation, None)
            self._erased.add(conversation)

    def current_version(self, conversation: str) -> int:
        with self._lock:
            return max(self._live(conversation))


class LocalKeyStore:
    """A ``KeyStore`` in ``<state_dir>/keys/``: one JSON file per conversation.

    Each data key is wrapped with AES-GCM under the master key, the AAD naming conversation and
    version, so a wrapped key copied into another conversation's file does not unwrap.
    Processes may share the folder: live keys are re-read from the file on every ``get`` (the
    ``Sealer`` above caches), so an erasure by another process is seen; only erasure, which is
    forever, is remembered here. Creation is ``os.link`` of a complete temp file, which fails if
    the file exists, so two processes creating at once never overwrite each other's key.
    """

    def __init__(self, state_dir: Path | str, master_key: bytes) -> None:
        if len(master_key) != 32:
            raise SealingError("the master key must be 32 bytes")
        self._dir = Path(state_dir) / "keys"
        self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._master = AESGCM(master_key)
        self._erased: set[str] = set()
        self._lock = threading.Lock()

    def _path(self, conversation: str) -> Path:
        # Hashed: a conversation id is untrusted text and must not be able to name a path.
        return self._dir / f"{hashlib.sha256(conversation.encode('utf-8')).hexdigest()}.json"

    def _load(self, conversation: str) -> dict[str, Any]:
        if conversation in self._erased:
            raise KeyErased(f"conversation {conversation!r} was erased")
        path = self._path(conversation)
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise KeyNotFound(f"conversation {conversation!r} has no data key") from None
        except ValueError:
            raise SealingError(f"key file of {conversation!r} is unreadable: {path}") from None
        if doc.get("conversation") != conversation:
            raise SealingError(f"key file {path} does not belong to {conversation!r}")
        if doc.get("state") == "erased":
            self._erased.add(conversation)
            raise KeyErased(f"conversation {conversation!r} was erased")
        return doc

    def _wrap_aad(self, conversation: str, version: int) -> bytes:
        return f"voice/key/v1|{conversation}|{version}".encode()

    def _write(self, path: Path, doc: dict[str, Any], *, exclusive: bool) -> None:
        fd, tmp = tempfile.mkstemp(dir=self._dir, prefix=".tmp-", suffix=".json")  # mode 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f)
                f.flush()
                os.fsync(f.fileno())
            if exclusive:
                os.link(tmp, path)  # FileExistsError if another writer got there first
            else:
                os.replace(tmp, path)
        finally:
            with suppress(FileNotFoundError):
                os.unlink(tmp)
        # The rename/link itself must survive a crash, not only the file's bytes.
        dir_fd = os.open(self._dir, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def create(self, conversation: str) -> int:
        with self._lock:
            with suppress(KeyNotFound):
                return int(self._load(conversation)["current"])
            key, nonce = AESGCM.generate_key(bit_length=256), os.urandom(_NONCE_BYTES)
            wrapped = self._master.encrypt(nonce, key, self._wrap_aad(conversation, 1))
            doc = {
                "format": _FORMAT,
                "conversation": conversation,
                "state": "live",
                "current": 1,
                "keys": {"1": {"nonce": _b64(nonce), "wrapped": _b64(wrapped)}},
            }
            try:
                self._write(self._path(conversation), doc, exclusive=True)
            except FileExistsError:
                # Another process created (or erased) it meanwhile: its file wins.
                return int(self._load(conversation)["current"])
            return 1

    def get(self, conversation: str, version: int) -> bytes:
        with self._lock:
            entry = self._load(conversation)["keys"].get(str(version))
        if entry is None:
            raise KeyNotFound(f"conversation {conversation!r} has no key version {version}")
        try:
            return self._master.decrypt(
                _unb64(entry["nonce"]),
                _unb64(entry["wrapped"]),
                self._wrap_aad(conversation, version),
            )
        except (InvalidTag, ValueError, KeyError):
            raise SealingError(
                f"cannot unwrap key version {version} of {conversation!r}: "
                "wrong VOICE_MASTER_KEY, or the key file was altered"
            ) from None

    def destroy(self, conversation: str) -> None:
        with self._lock:
            path = self._path(conversation)
            try:
                old = os.open(path, os.O_RDWR)
            except FileNotFoundError:
                old = None
            try:
                tombstone = {
                    "format": _FORMAT,
                    "conversation": conversation,
                    "state": "erased",
                    "erased_at": datetime.now(UTC).isoformat(),
                }
                # Tombstone first (atomic, durable), so a crash never leaves the key readable.
                self._write(path, tombstone, exclusive=False)
                self._erased.add(conversation)
                if old is not None:
                    # Best effort: zero the old file's blocks through the still-open inode.
                    # Journaling, copy-on-write file systems and SSDs may keep copies; the
                    # wrapped key is still useless without the master key.
                    os.pwrite(old, b"\0" * os.fstat(old).st_size, 0)
                    os.fsync(old)
            finally:
                if old is not None:
                    os.close(old)

    def current_version(self, conversation: str) -> int:
        with self._lock:
            return int(self._load(conversation)["current"])


def _check_id(name: str, value: str) -> None:
    # '|' separates the AAD's fields; refusing it keeps the AAD unambiguous.
    if not value or "|" in value:
        raise SealingError(f"{name} must be non-empty and free of '|': {value!r}")


def _aad(conversation: str, content_id: str, key_version: int) -> bytes:
    return f"voice/v1|{conversation}|{content_id}|{key_version}".encode()


class Sealer:
    """Seals and opens conversation content, caching opened data keys (LRU, per conversation).

    The AAD binds conversation, content id and key version (docs/decisions/0002), so a blob
    moved to another record or conversation does not open. Nonces are 96 random bits from
    ``os.urandom``; keep a key under 2**32 seals so a nonce collision stays negligible (NIST
    SP 800-38D) — far above any conversation's length.

    Cached keys outlive an erasure made elsewhere (another process or ``Sealer``) until
    ``purge`` is called, e.g. on ``ConversationErased``; ``erase`` here purges itself.
    """

    def __init__(self, store: KeyStore, cache_size: int = 1024) -> None:
        if cache_size < 1:
            raise ValueError("cache_size must be at least 1")
        self._store = store
        self._cache_size = cache_size
        self._cache: OrderedDict[str, dict[int, bytes]] = OrderedDict()
        self._current: dict[str, int] = {}
        # Held across store calls on a miss: otherwise a key fetched just before an erasure
        # could be cached just after its purge, and opens would keep working.
        self._lock = threading.Lock()

    def _remember(self, conversation: str, version: int, key: bytes) -> None:
        self._cache.setdefault(conversation, {})[version] = key
        self._cache.move_to_end(conversation)
        while len(self._cache) > self._cache_size:
            evicted, _ = self._cache.popitem(last=False)
            self._current.pop(evicted, None)

    def _key(self, conversation: str, version: int) -> bytes:
        with self._lock:
            keys = self._cache.get(conversation, {})
            if version in keys:
                self._cache.move_to_end(conversation)
                return keys[version]
            key = self._store.get(conversation, version)
            self._remember(conversation, version, key)
            return key

    def _current_key(self, conversation: str) -> tuple[int, bytes]:
        with self._lock:
            version = self._current.get(conversation)
            if version is None or version not in self._cache.get(conversation, {}):
                version = self._store.create(conversation)  # lazily, at the first content
                self._remember(conversation, version, self._store.get(conversation, version))
                self._current[conversation] = version
            self._cache.move_to_end(conversation)
            return version, self._cache[conversation][version]

    def create(self, conversation: str) -> int:
        """Make sure the conversation has a data key (before its first content); its version."""
        return self._current_key(conversation)[0]

    def seal(self, conversation: str, content_id: str, plaintext: bytes | str) -> Sealed:
        """Seal content under the conversation's current data key (created if none yet)."""
        _check_id("conversation", conversation)
        _check_id("content_id", content_id)
        data = plaintext.encode("utf-8") if isinstance(plaintext, str) else bytes(plaintext)
        version, key = self._current_key(conversation)
        nonce = os.urandom(_NONCE_BYTES)
        ciphertext = AESGCM(key).encrypt(nonce, data, _aad(conversation, content_id, version))
        return Sealed(key_version=version, nonce=_b64(nonce), ciphertext=_b64(ciphertext))

    def open(self, conversation: str, content_id: str, sealed: Sealed) -> bytes:
        """The plaintext; ``KeyErased`` if the conversation was erased, ``OpenFailed`` if the
        blob is tampered or belongs to another conversation or content id."""
        _check_id("conversation", conversation)
        _check_id("content_id", content_id)
        key = self._key(conversation, sealed.key_version)
        aad = _aad(conversation, content_id, sealed.key_version)
        try:
            return AESGCM(key).decrypt(_unb64(sealed.nonce), _unb64(sealed.ciphertext), aad)
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

    def purge(self, conversation: str) -> None:
        """Forget the conversation's cached keys (the next use asks the store)."""
        with self._lock:
            self._cache.pop(conversation, None)
            self._current.pop(conversation, None)

    def erase(self, conversation: str) -> None:
        """Destroy the conversation's keys in the store and forget them here."""
        with self._lock:  # one critical section: no open can re-cache the key in between
            self._store.destroy(conversation)
            self._cache.pop(conversation, None)
            self._current.pop(conversation, None)


def sealer_for(settings: VoiceSettings) -> Sealer:
    """The process's sealer over the local key store under ``<state_dir>/keys``."""
    secret = settings.master_key.get_secret_value() if settings.master_key else None
    store = LocalKeyStore(settings.state_dir, master_key_from_env(settings.env, secret))
    return Sealer(store)
