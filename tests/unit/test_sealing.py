"""Sealed transcripts: the KeyStore port's contract (run against every adapter), the Sealer,
the local key files' contents, and the master-key rules."""

from __future__ import annotations

import base64
import json
import os
import stat
import threading
from pathlib import Path

import pytest

from schemas.base import Sealed
from streams.sealing import (
    DEV_MASTER_KEY,
    KeyErased,
    KeyNotFound,
    KeyStore,
    LocalKeyStore,
    MemoryKeyStore,
    OpenFailed,
    Sealer,
    SealingError,
    master_key_from_env,
)

MASTER = bytes(range(32))
CNV = "cnv-0123abcd"
OTHER = "cnv-4567ef01"


class CountingStore:
    """Wraps a store to count ``get`` calls, to see what the Sealer caches."""

    def __init__(self, inner: KeyStore) -> None:
        self.inner, self.gets = inner, 0

    def create(self, conversation: str) -> int:
        return self.inner.create(conversation)

    def get(self, conversation: str, version: int) -> bytes:
        self.gets += 1
        return self.inner.get(conversation, version)

    def destroy(self, conversation: str) -> None:
        self.inner.destroy(conversation)

    def current_version(self, conversation: str) -> int:
        return self.inner.current_version(conversation)


def _flip(b64: str, at: int) -> str:
    raw = bytearray(base64.b64decode(b64))
    raw[at] ^= 0x01
    return base64.b64encode(bytes(raw)).decode()


class KeyStoreContract:
    """What every KeyStore adapter must do; subclasses provide the ``store`` fixture."""

    @pytest.fixture
    def store(self) -> KeyStore:
        raise NotImplementedError

    @pytest.fixture
    def sealer(self, store: KeyStore) -> Sealer:
        return Sealer(store)

    # --- the port ---

    def test_create_makes_a_256_bit_key_once(self, store: KeyStore) -> None:
        assert store.create(CNV) == 1
        key = store.get(CNV, 1)
        assert isinstance(key, bytes) and len(key) == 32
        assert store.create(CNV) == 1  # a live key exists: same version, same key
        assert store.get(CNV, 1) == key
        assert store.current_version(CNV) == 1

    def test_each_conversation_has_its_own_key(self, store: KeyStore) -> None:
        store.create(CNV)
        store.create(OTHER)
        assert store.get(CNV, 1) != store.get(OTHER, 1)

    def test_unknown_conversation_or_version_is_not_found(self, store: KeyStore) -> None:
        with pytest.raises(KeyNotFound):
            store.get(CNV, 1)
        with pytest.raises(KeyNotFound):
            store.current_version(CNV)
        store.create(CNV)
        with pytest.raises(KeyNotFound):
            store.get(CNV, 2)

    def test_destroy_is_forever(self, store: KeyStore) -> None:
        store.create(CNV)
        store.create(OTHER)
        store.destroy(CNV)
        with pytest.raises(KeyErased):
            store.get(CNV, 1)
        with pytest.raises(KeyErased):
            store.current_version(CNV)
        with pytest.raises(KeyErased):
            store.create(CNV)  # an erased conversation never gets a key again
        store.destroy(CNV)  # idempotent
        with pytest.raises(KeyErased):
            store.get(CNV, 1)
        assert len(store.get(OTHER, 1)) == 32  # others untouched

    def test_destroy_of_a_never_created_conversation_leaves_a_tombstone(
        self, store: KeyStore
    ) -> None:
        store.destroy(CNV)
        with pytest.raises(KeyErased):
            store.get(CNV, 1)
        with pytest.raises(KeyErased):
            store.create(CNV)

    def test_errors_share_one_root(self) -> None:
        for error in (KeyErased, KeyNotFound, OpenFailed):
            assert issubclass(error, SealingError)

    # --- the Sealer on this store ---

    def test_roundtrip(self, sealer: Sealer) -> None:
        sealed = sealer.seal(CNV, "msg-1", b"\x00bytes\xff")
        assert isinstance(sealed, Sealed) and sealed.key_version == 1
        assert b"bytes" not in base64.b64decode(sealed.ciphertext)
        assert sealer.open(CNV, "msg-1", sealed) == b"\x00bytes\xff"
        text = sealer.seal(CNV, "msg-2", "héllo ✓")
        assert sealer.open_text(CNV, "msg-2", text) == "héllo ✓"
        payload = {"b": [1, 2], "a": "ü"}
        blob = sealer.seal_json(CNV, "prop-1", payload)
        assert sealer.open(CNV, "prop-1", blob) == '{"a":"ü","b":[1,2]}'.encode()
        assert sealer.open_json(CNV, "prop-1", blob) == payload

    def test_a_fresh_sealer_on_the_same_store_opens(self, store: KeyStore, sealer: Sealer) -> None:
        sealed = sealer.seal(CNV, "msg-1", "hi")
        assert Sealer(store).open_text(CNV, "msg-1", sealed) == "hi"

    def test_other_content_id_fails(self, sealer: Sealer) -> None:
        sealed = sealer.seal(CNV, "msg-1", "hi")
        with pytest.raises(OpenFailed) as failure:
            sealer.open(CNV, "msg-2", sealed)
        assert repr(CNV) in str(failure.value) and repr("msg-2") in str(failure.value)

    def test_other_conversation_fails(self, sealer: Sealer) -> None:
        sealer.seal(OTHER, "msg-0", "gives OTHER a key")
        sealed = sealer.seal(CNV, "msg-1", "hi")
        with pytest.raises(OpenFailed):
            sealer.open(OTHER, "msg-1", sealed)

    def test_other_key_version_is_not_found(self, sealer: Sealer) -> None:
        sealed = sealer.seal(CNV, "msg-1", "hi")
        with pytest.raises(KeyNotFound):
            sealer.open(CNV, "msg-1", sealed.model_copy(update={"key_version": 2}))

    @pytest.mark.parametrize("at", [0, 3, -1])  # first byte, inside, last byte of the tag
    def test_tampered_ciphertext_fails(self, sealer: Sealer, at: int) -> None:
        sealed = sealer.seal(CNV, "msg-1", "hello there")
        bad = sealed.model_copy(update={"ciphertext": _flip(sealed.ciphertext, at)})
        with pytest.raises(OpenFailed):
            sealer.open(CNV, "msg-1", bad)

    def test_tampered_or_malformed_nonce_fails(self, sealer: Sealer) -> None:
        sealed = sealer.seal(CNV, "msg-1", "hello there")
        for nonce in (_flip(sealed.nonce, 0), "not base64!", base64.b64encode(b"short").decode()):
            with pytest.raises(OpenFailed):
                sealer.open(CNV, "msg-1", sealed.model_copy(update={"nonce": nonce}))

    def test_nonces_are_unique_across_10000_seals(self, sealer: Sealer) -> None:
        seals = [sealer.seal(CNV, f"msg-{i}", "same text") for i in range(10_000)]
        assert len({s.nonce for s in seals}) == 10_000
        assert len({s.ciphertext for s in seals}) == 10_000
        assert all(len(base64.b64decode(s.nonce)) == 12 for s in seals[:100])

    def test_erase_makes_even_a_cached_key_unusable(self, store: KeyStore) -> None:
        counting = CountingStore(store)
        sealer = Sealer(counting)
        sealed = sealer.seal(CNV, "msg-1", "hi")
        assert sealer.open_text(CNV, "msg-1", sealed) == "hi"
        assert counting.gets == 1  # the key is cached
        sealer.erase(CNV)
        with pytest.raises(KeyErased):
            store.get(CNV, 1)
        with pytest.raises(KeyErased):
            sealer.open(CNV, "msg-1", sealed)
        with pytest.raises(KeyErased):
            sealer.seal(CNV, "msg-2", "more")

    def test_erasure_elsewhere_is_seen_after_purge(self, store: KeyStore, sealer: Sealer) -> None:
        sealed = sealer.seal(CNV, "msg-1", "hi")
        Sealer(store).erase(CNV)
        sealer.purge(CNV)
        with pytest.raises(KeyErased):
            sealer.open(CNV, "msg-1", sealed)

    def test_cache_is_lru_and_purge_drops_it(self, store: KeyStore) -> None:
        counting = CountingStore(store)
        sealer = Sealer(counting, cache_size=1)
        a = sealer.seal(CNV, "m", "a")
        b = sealer.seal(OTHER, "m", "b")  # evicts CNV
        gets = counting.gets
        sealer.open(OTHER, "m", b)
        assert counting.gets == gets  # hit
        sealer.open(CNV, "m", a)
        assert counting.gets == gets + 1  # miss after eviction
        sealer.purge(CNV)
        sealer.open(CNV, "m", a)
        assert counting.gets == gets + 2

    @pytest.mark.parametrize("bad", ["", "a|b"])
    def test_ids_that_would_make_the_aad_ambiguous_are_refused(
        self, sealer: Sealer, bad: str
    ) -> None:
        with pytest.raises(SealingError):
            sealer.seal(bad, "msg-1", "hi")
        with pytest.raises(SealingError):
            sealer.seal(CNV, bad, "hi")


def test_aad_binds_conversation_even_under_the_same_key() -> None:
    # A store handing every conversation CNV's key isolates the AAD's own check.
    class SharedKey(MemoryKeyStore):
        def get(self, conversation: str, version: int) -> bytes:
            return super().get(CNV, version)

    sealer = Sealer(SharedKey())
    sealed = sealer.seal(CNV, "msg-1", "hi")
    with pytest.raises(OpenFailed):
        sealer.open(OTHER, "msg-1", sealed)


class TestMemoryKeyStore(KeyStoreContract):
    @pytest.fixture
    def store(self) -> KeyStore:
        return MemoryKeyStore()


class TestLocalKeyStore(KeyStoreContract):
    @pytest.fixture
    def store(self, tmp_path: Path) -> LocalKeyStore:
        return LocalKeyStore(tmp_path, MASTER)

    @staticmethod
    def _files(tmp_path: Path) -> list[Path]:
        return sorted((tmp_path / "keys").iterdir())

    @staticmethod
    def _encodings(key: bytes) -> list[bytes]:
        return [
            key,
            base64.b64encode(key),
            base64.urlsafe_b64encode(key),
            base64.b64encode(key).rstrip(b"="),
            key.hex().encode(),
        ]

    def test_file_holds_the_key_only_wrapped(self, store: LocalKeyStore, tmp_path: Path) -> None:
        store.create(CNV)
        key = store.get(CNV, 1)
        [path] = self._files(tmp_path)
        raw = path.read_bytes()
        for encoded in self._encodings(key):
            assert encoded not in raw
        doc = json.loads(raw)
        assert doc["conversation"] == CNV and doc["state"] == "live"
        assert CNV not in path.name  # named by hash, never by the untrusted id
        assert stat.S_IMODE(path.stat().st_mode) == 0o600

    def test_destroy_leaves_a_tombstone_without_key_material(
        self, store: LocalKeyStore, tmp_path: Path
    ) -> None:
        store.create(CNV)
        key = store.get(CNV, 1)
        [path] = self._files(tmp_path)
        wrapped = json.loads(path.read_text())["keys"]["1"]["wrapped"]
        old_inode = tmp_path / "old-inode"
        os.link(path, old_inode)  # a second name for the old file, to see it scrubbed
        store.destroy(CNV)
        assert self._files(tmp_path) == [path]  # no temp files left behind
        raw = path.read_bytes()
        doc = json.loads(raw)
        assert doc["state"] == "erased" and "keys" not in doc and "current" not in doc
        for encoded in [*self._encodings(key), wrapped.encode()]:
            assert encoded not in raw
        assert set(old_inode.read_bytes()) <= {0}  # best-effort scrub zeroed the old blocks

    def test_a_second_instance_sees_keys_and_erasures(self, tmp_path: Path) -> None:
        first, second = LocalKeyStore(tmp_path, MASTER), LocalKeyStore(tmp_path, MASTER)
        first.create(CNV)
        assert second.create(CNV) == 1  # does not overwrite the first's key
        assert second.get(CNV, 1) == first.get(CNV, 1)
        assert second.current_version(CNV) == 1
        sealed = Sealer(first).seal(CNV, "msg-1", "hi")
        assert Sealer(second).open_text(CNV, "msg-1", sealed) == "hi"
        second.destroy(CNV)
        with pytest.raises(KeyErased):
            first.get(CNV, 1)
        with pytest.raises(KeyErased):
            first.create(CNV)
        third = LocalKeyStore(tmp_path, MASTER)  # e.g. after a restart
        with pytest.raises(KeyErased):
            third.get(CNV, 1)

    def test_concurrent_creators_agree_on_one_key(self, tmp_path: Path) -> None:
        # Separate instances have separate locks, like separate processes.
        stores = [LocalKeyStore(tmp_path, MASTER) for _ in range(8)]
        start, keys = threading.Barrier(len(stores)), []

        def create(store: LocalKeyStore) -> None:
            start.wait()
            keys.append(store.get(CNV, store.create(CNV)))

        threads = [threading.Thread(target=create, args=(s,)) for s in stores]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(keys) == len(stores) and len(set(keys)) == 1

    def test_wrong_master_key_does_not_unwrap(self, store: LocalKeyStore, tmp_path: Path) -> None:
        store.create(CNV)
        with pytest.raises(SealingError, match="VOICE_MASTER_KEY"):
            LocalKeyStore(tmp_path, bytes(32)).get(CNV, 1)

    def test_a_key_file_moved_to_another_conversation_is_refused(
        self, store: LocalKeyStore, tmp_path: Path
    ) -> None:
        store.create(CNV)
        store.create(OTHER)
        cnv_doc = json.loads(store._path(CNV).read_text())
        other_path = store._path(OTHER)
        other_doc = json.loads(other_path.read_text())
        other_doc["keys"] = cnv_doc["keys"]  # CNV's wrapped key under OTHER's name
        other_path.write_text(json.dumps(other_doc))
        with pytest.raises(SealingError):
            LocalKeyStore(tmp_path, MASTER).get(OTHER, 1)
        other_path.write_text(json.dumps(cnv_doc))  # the whole file, conversation field too
        with pytest.raises(SealingError):
            LocalKeyStore(tmp_path, MASTER).get(OTHER, 1)

    def test_master_key_must_be_32_bytes(self, tmp_path: Path) -> None:
        with pytest.raises(SealingError):
            LocalKeyStore(tmp_path, b"short")


class TestMasterKeyFromEnv:
    def test_base64_of_32_bytes_is_the_key(self) -> None:
        key = os.urandom(32)
        assert master_key_from_env("prod", base64.b64encode(key).decode()) == key
        assert master_key_from_env("prod", base64.b64encode(key).decode() + "\n") == key

    def test_a_passphrase_is_derived(self) -> None:
        key = master_key_from_env("prod", "correct horse battery staple")
        assert len(key) == 32
        assert key == master_key_from_env("prod", "correct horse battery staple")
        assert key != master_key_from_env("prod", "correct horse battery stapler")
        # Valid base64 of the wrong length is a passphrase too, not a short key.
        short = base64.b64encode(b"sixteen bytes!!!").decode()
        derived = master_key_from_env("prod", short)
        assert len(derived) == 32 and b"sixteen" not in derived

    @pytest.mark.parametrize("env", ["dev", "test"])
    @pytest.mark.parametrize("value", [None, "", "  "])
    def test_unset_outside_prod_is_the_dev_key(self, env: str, value: str | None) -> None:
        assert master_key_from_env(env, value) == DEV_MASTER_KEY
        assert len(DEV_MASTER_KEY) == 32

    @pytest.mark.parametrize("value", [None, ""])
    def test_unset_in_prod_is_refused(self, value: str | None) -> None:
        with pytest.raises(SealingError) as failure:
            master_key_from_env("prod", value)
        assert str(failure.value) == "VOICE_MASTER_KEY must be set when VOICE_ENV='prod'"

    def test_the_dev_key_is_refused_in_prod(self) -> None:
        dev = base64.b64encode(DEV_MASTER_KEY).decode()
        assert master_key_from_env("dev", dev) == DEV_MASTER_KEY
        with pytest.raises(SealingError):
            master_key_from_env("prod", dev)
