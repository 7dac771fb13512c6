"""Sealing: the KeyStore contract on the in-memory adapter, the AAD, and the master-key rules.

The cluster adapter runs the same contract on a real broker (tests/integration/test_keys_store.py).
"""

from __future__ import annotations

import base64
import os

import pytest

from streams.kek import master_key_from_env
from streams.sealing import KeyStore, MemoryKeyStore, OpenFailed, Sealer, SealingError
from streams.settings import DEV_MASTER_KEY
from tests.keystore_contract import CNV, OTHER, KeyStoreContract


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
