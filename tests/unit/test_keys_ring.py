"""The key ring's rules, without a broker: first record wins, re-wraps replace the wrapping,
a tombstone is final for the process, retired KEK versions never unwrap, and a wrap is bound
to its id, version, key id and KEK version."""

from __future__ import annotations

import base64
import os

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.keys import DataKeyWrapped, KekVersions
from streams import keyring
from streams.kek import KekError, MasterKek
from streams.keyring import KeyRing, wrap_record
from streams.sealing import KeyErased, KeyNotFound, SealingError

MASTER = bytes(range(32))
ID = "cnv-0123abcd"


@pytest.fixture
def kek() -> MasterKek:
    return MasterKek(MASTER)


def proposal(kek: MasterKek, key: bytes, key_id: str, kek_version: int = 1,
             id_: str = ID) -> DataKeyWrapped:
    return wrap_record(kek, id_, key, key_id, kek_version, tenant="t1")


def test_the_first_record_wins_and_a_later_proposal_is_ignored(kek: MasterKek) -> None:
    ring = KeyRing(kek)
    first, second = os.urandom(32), os.urandom(32)
    assert ring.apply_key(proposal(kek, first, "key-aaaaaaaa")) == "new"
    assert ring.apply_key(proposal(kek, second, "key-bbbbbbbb")) == "lost"
    assert ring.key(ID, 1) == first
    assert ring.record(ID).key_id == "key-aaaaaaaa"
    assert ring.apply_key(proposal(kek, first, "key-aaaaaaaa")) == "same"  # the winner again


def test_a_rewrap_replaces_the_wrapping_not_the_key(kek: MasterKek) -> None:
    ring = KeyRing(kek)
    key = os.urandom(32)
    ring.apply_key(proposal(kek, key, "key-aaaaaaaa"))
    assert ring.apply_key(proposal(kek, key, "key-aaaaaaaa", kek_version=2)) == "rewrap"
    assert ring.record(ID).kek_version == 2
    ring.apply_kek(KekVersions(current=2, retired=[1]))
    assert ring.key(ID, 1) == key  # unwrapped under v2, the live version


def test_a_tombstone_is_final_for_the_process(kek: MasterKek) -> None:
    ring = KeyRing(kek)
    ring.apply_key(proposal(kek, os.urandom(32), "key-aaaaaaaa"))
    ring.key(ID, 1)  # unwrapped and held
    ring.apply_tombstone(ID)
    assert ring.state(ID) == "erased" and ID not in ring.live_ids()
    with pytest.raises(KeyErased):
        ring.key(ID, 1)
    # A re-wrap or a late proposal after the tombstone never brings a key back.
    assert ring.apply_key(proposal(kek, os.urandom(32), "key-cccccccc")) == "erased"
    assert ring.apply_key(proposal(kek, os.urandom(32), "key-aaaaaaaa", 2)) == "erased"
    with pytest.raises(KeyErased):
        ring.record(ID)
    assert ring.erased_ids() == [ID]


def test_unknown_id_or_version_is_not_found(kek: MasterKek) -> None:
    ring = KeyRing(kek)
    assert ring.state(ID) == "absent"
    with pytest.raises(KeyNotFound):
        ring.key(ID, 1)
    ring.apply_key(proposal(kek, os.urandom(32), "key-aaaaaaaa"))
    with pytest.raises(KeyNotFound):
        ring.key(ID, 2)


def test_a_retired_kek_version_never_unwraps(kek: MasterKek) -> None:
    ring = KeyRing(kek)
    ring.apply_key(proposal(kek, os.urandom(32), "key-aaaaaaaa", kek_version=1))
    ring.apply_kek(KekVersions(current=2, retired=[1]))
    with pytest.raises(SealingError, match="retired"):
        ring.key(ID, 1)
    ring.apply_kek(KekVersions(current=2, retired=[]))  # retirement is never undone
    assert ring.kek_retired == frozenset({1}) and ring.kek_current == 2


def test_unwrapping_is_lazy(kek: MasterKek) -> None:
    """Startup folds records without unwrapping (100,000 keys ready in seconds)."""

    class Counting(MasterKek):
        unwraps = 0

        def unwrap(self, *args: object, **kw: object) -> bytes:
            Counting.unwraps += 1
            return super().unwrap(*args, **kw)  # type: ignore[arg-type]

    counting = Counting(MASTER)
    ring = KeyRing(counting)
    for i in range(50):
        ring.apply_key(proposal(kek, os.urandom(32), f"key-{i:08d}", id_=f"cnv-{i}"))
    assert Counting.unwraps == 0 and len(ring) == 50
    ring.key("cnv-7", 1)
    ring.key("cnv-7", 1)
    assert Counting.unwraps == 1


def test_a_wrap_is_bound_to_its_id_and_versions(kek: MasterKek) -> None:
    key = os.urandom(32)
    rec = proposal(kek, key, "key-aaaaaaaa")
    for moved in (rec.model_copy(update={"id": "cnv-other"}),
                  rec.model_copy(update={"key_id": "key-bbbbbbbb"}),
                  rec.model_copy(update={"kek_version": 2})):
        ring = KeyRing(kek)
        ring.apply_key(moved)
        with pytest.raises(KekError):
            ring.key(moved.id, 1)


def test_kek_versions_differ_and_another_master_does_not_unwrap(kek: MasterKek) -> None:
    key = os.urandom(32)
    nonce, wrapped = kek.wrap(1, key, b"aad")
    assert kek.unwrap(1, nonce, wrapped, b"aad") == key
    with pytest.raises(KekError):
        kek.unwrap(2, nonce, wrapped, b"aad")
    with pytest.raises(KekError, match="VOICE_MASTER_KEY"):
        MasterKek(bytes(32)).unwrap(1, nonce, wrapped, b"aad")
    with pytest.raises(KekError):
        MasterKek(b"short")


def test_the_record_never_holds_the_key_in_the_clear(kek: MasterKek) -> None:
    key = os.urandom(32)
    raw = proposal(kek, key, "key-aaaaaaaa").model_dump_json().encode()
    for encoded in (key, base64.b64encode(key), key.hex().encode()):
        assert encoded not in raw


def test_the_key_topic_is_compacted_with_the_documented_bounds() -> None:
    from streams.topics import KEYS, TOPICS, all_specs, record_specs

    hour = str(3600 * 1000)
    assert KEYS.config() == {
        "cleanup.policy": "compact", "retention.ms": "-1", "segment.ms": hour,
        "min.cleanable.dirty.ratio": "0.01", "max.compaction.lag.ms": hour,
        "delete.retention.ms": hour}
    # Created with the others; never read by the sink (which reads the record topics).
    assert KEYS in all_specs() and KEYS not in record_specs() and KEYS not in TOPICS


def test_a_rotation_can_rescue_a_key_wrapped_under_a_retired_version(kek: MasterKek) -> None:
    ring = KeyRing(kek)
    key = os.urandom(32)
    ring.apply_kek(KekVersions(current=2, retired=[1]))
    ring.apply_key(proposal(kek, key, "key-aaaaaaaa", kek_version=1))  # a slow creator's
    with pytest.raises(SealingError, match="retired"):
        ring.key(ID, 1)
    assert ring.key_to_rewrap(ID) == key


def test_the_startup_path_folds_json_and_refuses_what_the_rules_cannot_read(
        kek: MasterKek) -> None:
    key = os.urandom(32)
    raw = proposal(kek, key, "key-aaaaaaaa").model_dump_json().encode()
    ring = KeyRing(kek)
    with pytest.raises(ValueError, match="under key"):
        ring.apply_json("cnv-other", raw)  # a record filed under another id's key
    for bad in (b'{"id": "%s", "key_id": 7, "kek_version": 1}' % ID.encode(),
                b'{"id": "%s", "key_id": "key-aaaaaaaa", "kek_version": "1"}' % ID.encode(),
                b'{"id": "%s", "key_id": "short", "kek_version": 1}' % ID.encode()):
        with pytest.raises(ValueError):
            ring.apply_json(ID, bad)
    assert ring.state(ID) == "absent"
    assert ring.apply_json(ID, raw) == "new" and ring.key(ID, 1) == key
    assert ring.version(ID) == 1


def test_a_rotation_to_a_new_master_secret_leaves_the_old_versions_to_nobody() -> None:
    """docs/keys.md, "Making an erasure final": VOICE_MASTER_KEYS gives the next version a new
    secret; once every process has VOICE_MASTER_KEY set to it, what only the old secret
    derived — every wrap under the retired versions, in any copy of the log — unwraps nowhere."""
    from streams.kek import master_keys_from_env

    old_secret, new_secret = os.urandom(32), os.urandom(32)
    key = os.urandom(32)
    before = MasterKek(old_secret)
    during = MasterKek(old_secret, {2: new_secret})
    after = MasterKek(new_secret)
    w1 = before.wrap(1, key, b"aad")
    w2 = during.wrap(2, key, b"aad")  # the rotation's re-wrap
    assert during.unwrap(1, *w1, b"aad") == key  # both versions while it runs
    assert after.unwrap(2, *w2, b"aad") == key  # the live key, under the new secret alone
    with pytest.raises(KekError):
        after.unwrap(1, *w1, b"aad")  # the retired version: gone with the old secret
    with pytest.raises(KekError):
        MasterKek(old_secret).unwrap(2, *w2, b"aad")  # the old secret opens nothing new

    encoded = base64.b64encode(new_secret).decode()
    assert master_keys_from_env("prod", f" 2={encoded} , 3={encoded}") == {2: new_secret,
                                                                            3: new_secret}
    assert master_keys_from_env("prod", None) == {}
    for bad in ("2", "x=abc", "0=abc", "2="):
        with pytest.raises(KekError, match="VOICE_MASTER_KEYS item 1"):
            master_keys_from_env("prod", bad)


def test_a_cipher_is_its_key_made_ready_and_kept_for_the_next_call(kek: MasterKek) -> None:
    ring = KeyRing(kek)
    key = os.urandom(32)
    ring.apply_key(proposal(kek, key, "key-aaaaaaaa"))
    cipher = ring.cipher(ID, 1)
    nonce = os.urandom(12)
    assert AESGCM(key).decrypt(nonce, cipher.encrypt(nonce, b"hi", b"aad"), b"aad") == b"hi"
    assert ring.cipher(ID, 1) is cipher  # not built again from the key
    with pytest.raises(KeyNotFound):
        ring.cipher(ID, 2)  # a kept cipher answers only for its own version


def test_an_erasure_drops_the_kept_cipher_with_the_key(kek: MasterKek) -> None:
    ring = KeyRing(kek)
    ring.apply_key(proposal(kek, os.urandom(32), "key-aaaaaaaa"))
    ring.cipher(ID, 1)
    ring.apply_tombstone(ID)
    with pytest.raises(KeyErased):
        ring.cipher(ID, 1)


def test_the_ring_keeps_the_ciphers_used_last_and_no_more(kek: MasterKek,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keyring, "CIPHERS_KEPT", 2)
    ring = KeyRing(kek)
    ids = [f"cnv-{n:08x}" for n in range(3)]
    for id_ in ids:
        ring.apply_key(proposal(kek, os.urandom(32), "key-aaaaaaaa", id_=id_))
    first, second = ring.cipher(ids[0], 1), ring.cipher(ids[1], 1)
    assert ring.cipher(ids[0], 1) is first  # used again: now the latest
    ring.cipher(ids[2], 1)  # one too many: the least recently used goes
    assert ring.cipher(ids[0], 1) is first
    assert ring.cipher(ids[1], 1) is not second  # built again, from the key the ring holds
