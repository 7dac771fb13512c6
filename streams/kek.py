"""The key-encryption key (KEK) port: what wraps every data key on the key topic.

A ``Kek`` wraps and unwraps a data key under a numbered version. The default adapter,
``MasterKek``, derives version ``n`` from ``VOICE_MASTER_KEY`` with HKDF-SHA256 (info
``voice/kek/v<n>``), so every process holding the master secret has every version without
storing one; which version is current and which are retired is a record on the key topic
(``schemas.keys.KekVersions``). A KMS adapter (AWS KMS ``Encrypt``/``Decrypt`` with the
version as a key alias, Vault transit ``encrypt``/``decrypt`` with ``key_version``) implements
the same two calls; ``docs/keys.md`` says how.

This module must never log, print or repr a KEK, the master secret or an unwrapped data key.
"""

from __future__ import annotations

import base64
import binascii
import threading
from typing import Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt

from streams.entropy import random_bytes
from streams.sealing import SealingError
from streams.settings import DEV_MASTER_KEY

_NONCE_BYTES = 12


class KekError(SealingError):
    """A wrap or unwrap failed: wrong master secret, altered record, or unknown version."""


class Kek(Protocol):
    """Wraps data keys under numbered KEK versions. Implementations must be thread-safe."""

    def wrap(self, version: int, key: bytes, aad: bytes) -> tuple[bytes, bytes]:
        """``(nonce, wrapped)`` of ``key`` under KEK ``version``, bound to ``aad``."""

    def unwrap(self, version: int, nonce: bytes, wrapped: bytes, aad: bytes) -> bytes:
        """The data key; ``KekError`` if it does not authenticate under ``version``."""


class MasterKek:
    """KEK versions derived from one 32-byte master secret (``VOICE_MASTER_KEY``).

    Derivation, not storage: a KEK is never written anywhere, so retiring a version is a
    policy every process obeys (it refuses to unwrap under it), and destroying it for good
    means changing the master secret — or using a KMS adapter, which can destroy a version.
    """

    def __init__(self, master: bytes, versions: dict[int, bytes] | None = None) -> None:
        """``versions`` gives some versions a master secret of their own
        (``VOICE_MASTER_KEYS``): how a rotation moves to a new secret, after which the old one
        can be destroyed and every version derived from it with it (docs/keys.md)."""
        for secret in (master, *(versions or {}).values()):
            if len(secret) != 32:
                raise KekError("a master key must be 32 bytes")
        self._master = master
        self._versions = dict(versions or {})
        self._aeads: dict[int, AESGCM] = {}
        self._lock = threading.Lock()

    def _aead(self, version: int) -> AESGCM:
        if version < 1:
            raise KekError(f"KEK version must be at least 1: {version!r}")
        with self._lock:
            aead = self._aeads.get(version)
            if aead is None:
                secret = self._versions.get(version, self._master)
                kek = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                           info=f"voice/kek/v{version}".encode()).derive(secret)
                aead = self._aeads[version] = AESGCM(kek)
            return aead

    def wrap(self, version: int, key: bytes, aad: bytes) -> tuple[bytes, bytes]:
        nonce = random_bytes(_NONCE_BYTES)
        return nonce, self._aead(version).encrypt(nonce, key, aad)

    def unwrap(self, version: int, nonce: bytes, wrapped: bytes, aad: bytes) -> bytes:
        try:
            return self._aead(version).decrypt(nonce, wrapped, aad)
        except (InvalidTag, ValueError):
            raise KekError(f"the data key does not unwrap under KEK version {version}: "
                           "wrong VOICE_MASTER_KEY, or the record was altered") from None


def master_key_from_env(env: str, value: str | None) -> bytes:
    """The master key from ``VOICE_MASTER_KEY``: base64 of 32 bytes, or else a passphrase.

    A passphrase goes through scrypt (not a bare hash) because people pick guessable ones.
    Surrounding whitespace is dropped (values often come from files ending in a newline).
    """
    value = (value or "").strip()
    if not value:
        if env in ("dev", "test"):
            return DEV_MASTER_KEY
        raise KekError(f"VOICE_MASTER_KEY must be set when VOICE_ENV={env!r}")
    try:
        raw = base64.b64decode(value, validate=True)
    except binascii.Error:
        raw = b""
    key = raw if len(raw) == 32 else _from_passphrase(value)
    if key == DEV_MASTER_KEY and env not in ("dev", "test"):
        raise KekError(f"VOICE_MASTER_KEY is the public dev key, refused in {env!r}")
    return key


def master_keys_from_env(env: str, value: str | None) -> dict[int, bytes]:
    """``VOICE_MASTER_KEYS``: ``N=secret[,N=secret…]``, KEK version → its own master secret
    (each as ``VOICE_MASTER_KEY`` takes it); empty when unset."""
    out: dict[int, bytes] = {}
    for n, item in enumerate(filter(None, (p.strip() for p in (value or "").split(","))), 1):
        version, sep, secret = item.partition("=")
        if not sep or not version.strip().isdigit() or int(version) < 1 or not secret.strip():
            raise KekError(f"VOICE_MASTER_KEYS item {n} is not VERSION=SECRET (VERSION ≥ 1)")
        out[int(version)] = master_key_from_env(env, secret)
    return out


def _from_passphrase(passphrase: str) -> bytes:
    # A fixed salt keeps the derivation reproducible across processes; scrypt's cost still
    # makes guessing expensive. 2**15 × r=8 is ~32 MiB and ~0.1 s, once per process.
    kdf = Scrypt(salt=b"voice-master-key", length=32, n=2**15, r=8, p=1)
    return kdf.derive(passphrase.encode("utf-8"))
