"""The ``KeyStore`` port's contract, run against every adapter: ``MemoryKeyStore`` in the unit
tests (``tests/unit/test_sealing.py``), ``ClusterKeyStore`` on a real broker
(``tests/integration/test_keys_store.py``)."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.base import Sealed
from streams.sealing import KeyErased, KeyNotFound, KeyStore, OpenFailed, Sealer, SealingError

CNV = "cnv-0123abcd"
OTHER = "cnv-4567ef01"


class CountingStore:
    """Wraps a store to count ``get`` calls, to see that the Sealer keeps no key of its own."""

    def __init__(self, inner: KeyStore) -> None:
        self.inner, self.gets = inner, 0

    def create(self, conversation: str, tenant: str | None = None) -> int:
        return self.inner.create(conversation, tenant)

    def get(self, conversation: str, version: int) -> bytes:
        self.gets += 1
        return self.inner.get(conversation, version)

    def cipher(self, conversation: str, version: int) -> AESGCM:
        self.gets += 1
        return self.inner.cipher(conversation, version)

    def destroy(self, conversation: str) -> None:
        self.inner.destroy(conversation)

    def current_version(self, conversation: str) -> int:
        return self.inner.current_version(conversation)

    def close(self) -> None:
        self.inner.close()


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

    def test_erase_makes_a_key_in_use_unusable(self, store: KeyStore) -> None:
        counting = CountingStore(store)
        sealer = Sealer(counting)
        sealed = sealer.seal(CNV, "msg-1", "hi")
        assert sealer.open_text(CNV, "msg-1", sealed) == "hi"
        sealer.erase(CNV)
        with pytest.raises(KeyErased):
            store.get(CNV, 1)
        with pytest.raises(KeyErased):
            sealer.open(CNV, "msg-1", sealed)
        with pytest.raises(KeyErased):
            sealer.seal(CNV, "msg-2", "more")

    def test_erasure_through_another_sealer_is_obeyed_at_once(
        self, store: KeyStore, sealer: Sealer
    ) -> None:
        sealed = sealer.seal(CNV, "msg-1", "hi")
        assert sealer.open_text(CNV, "msg-1", sealed) == "hi"
        Sealer(store).erase(CNV)  # nothing to purge: the sealer holds no key of its own
        with pytest.raises(KeyErased):
            sealer.open(CNV, "msg-1", sealed)

    def test_every_open_asks_the_store(self, store: KeyStore) -> None:
        counting = CountingStore(store)
        sealer = Sealer(counting)
        sealed = sealer.seal(CNV, "m", "a")
        gets = counting.gets
        sealer.open(CNV, "m", sealed)
        sealer.open(CNV, "m", sealed)
        assert counting.gets == gets + 2

    @pytest.mark.parametrize("bad", ["", "a|b"])
    def test_ids_that_would_make_the_aad_ambiguous_are_refused(
        self, sealer: Sealer, bad: str
    ) -> None:
        with pytest.raises(SealingError):
            sealer.seal(bad, "msg-1", "hi")
        with pytest.raises(SealingError):
            sealer.seal(CNV, bad, "hi")


