"""The cluster key store on a real broker: the ``KeyStore`` contract, two stores (two processes'
worth) agreeing on one key under a race, an erasure reaching another store, a store started
later, and rotation.

Each test gets its own key topic (a fresh prefix), so the contract's fixed ids never meet.
"""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from schemas.keys import KEK_RECORD_KEY, DataKeyWrapped
from streams.kek import KekError, MasterKek
from streams.keyring import wrap_aad
from streams.keyservice import ClusterKeyStore
from streams.sealing import KeyErased, KeyNotFound, KeyStore, Sealer
from streams.settings import DEV_MASTER_KEY, VoiceSettings
from streams.topics import KEYS, topic_name
from tests.keystore_contract import CNV, OTHER, KeyStoreContract
from tests.support import read_all, unique_settings, voice_env, wait_for

MASTER = bytes(range(32))
ERASED_WITHIN_S = 2.0
"""The bound docs/keys.md states for a tombstone to reach every process."""


def key_topic(bootstrap: str, tmp: Path) -> VoiceSettings:
    """Settings with a fresh prefix whose key topic (only) exists."""
    settings = unique_settings(bootstrap, tmp)
    admin = AdminClient({"bootstrap.servers": settings.bootstrap})
    name = topic_name(settings, KEYS)
    futures = admin.create_topics([NewTopic(name, num_partitions=settings.topic_partitions,
                                            replication_factor=1, config=KEYS.config())])
    futures[name].result(30)
    wait_for(lambda: all(p.leader >= 0 for p in
                         admin.list_topics(name, timeout=5).topics[name].partitions.values()),
             timeout=30, what="the key topic's leaders")
    return settings


@pytest.fixture
def keys_settings(kafka_bootstrap: str, tmp_path: Path) -> VoiceSettings:
    return key_topic(kafka_bootstrap, tmp_path)


@pytest.fixture
def stores(keys_settings: VoiceSettings) -> Iterator[list[ClusterKeyStore]]:
    """Makes stores on the test's key topic (each like another process); closes them all."""
    made: list[ClusterKeyStore] = []
    yield made
    for store in made:
        store.close()


def new_store(settings: VoiceSettings, made: list[ClusterKeyStore],
              master: bytes = MASTER) -> ClusterKeyStore:
    store = ClusterKeyStore(settings, MasterKek(master))
    made.append(store)
    store.wait_ready()
    return store


class TestClusterKeyStore(KeyStoreContract):
    @pytest.fixture
    def store(self, keys_settings: VoiceSettings, stores: list[ClusterKeyStore]) -> KeyStore:
        return new_store(keys_settings, stores)


def test_a_store_started_later_reads_every_key_and_erasure(
        keys_settings: VoiceSettings, stores: list[ClusterKeyStore]) -> None:
    first = new_store(keys_settings, stores)
    sealed = Sealer(first).seal(CNV, "msg-1", "hi")
    Sealer(first).seal(OTHER, "msg-1", "bye")
    first.destroy(OTHER)
    later = new_store(keys_settings, stores)
    assert Sealer(later).open_text(CNV, "msg-1", sealed) == "hi"
    assert later.get(CNV, 1) == first.get(CNV, 1)
    with pytest.raises(KeyErased):
        later.get(OTHER, 1)


def test_a_key_made_elsewhere_is_found_on_a_miss(
        keys_settings: VoiceSettings, stores: list[ClusterKeyStore]) -> None:
    a, b = new_store(keys_settings, stores), new_store(keys_settings, stores)
    sealed = Sealer(a).seal(CNV, "msg-1", "hi")
    # No waiting: b's miss reads the topic to its end before answering.
    assert Sealer(b).open_text(CNV, "msg-1", sealed) == "hi"
    with pytest.raises(KeyNotFound):
        b.get("cnv-never-made", 1)


def test_an_erasure_reaches_another_store_within_the_bound(
        keys_settings: VoiceSettings, stores: list[ClusterKeyStore]) -> None:
    a, b = new_store(keys_settings, stores), new_store(keys_settings, stores)
    sealed = Sealer(a).seal(CNV, "msg-1", "hi")
    assert Sealer(b).open_text(CNV, "msg-1", sealed) == "hi"  # b holds the key now
    t0 = time.monotonic()
    Sealer(a).erase(CNV)
    wait_for(lambda: b.ring.state(CNV) == "erased", timeout=10, interval=0.01,
             what="the tombstone to reach the other store")
    assert time.monotonic() - t0 < ERASED_WITHIN_S
    with pytest.raises(KeyErased):
        Sealer(b).open(CNV, "msg-1", sealed)


def test_racing_creators_end_with_one_key(
        keys_settings: VoiceSettings, stores: list[ClusterKeyStore]) -> None:
    racers = [new_store(keys_settings, stores) for _ in range(4)]
    ids = [f"cnv-race{i:04d}" for i in range(10)]
    start = threading.Barrier(len(racers))
    got: dict[int, list[bytes]] = {}

    def race(n: int, store: ClusterKeyStore) -> None:
        start.wait()
        got[n] = [store.get(id_, store.create(id_)) for id_ in ids]

    threads = [threading.Thread(target=race, args=(n, s)) for n, s in enumerate(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == len(racers)
    for i, id_ in enumerate(ids):
        assert len({got[n][i] for n in got}) == 1, f"{id_}: more than one data key"
    # Whatever proposals lost, the last record of every id is the winner: what compaction keeps,
    # and what a store started later takes.
    last: dict[str, DataKeyWrapped] = {}
    for m in read_all(keys_settings, topic_name(keys_settings, KEYS)):
        if m.value() is not None and m.key().decode() != KEK_RECORD_KEY:
            last[m.key().decode()] = DataKeyWrapped.model_validate_json(m.value())
    winners = {id_: racers[0].ring.record(id_).key_id for id_ in ids}
    assert {id_: last[id_].key_id for id_ in ids} == winners
    later = new_store(keys_settings, stores)
    assert [later.get(id_, 1) for id_ in ids] == got[0]


def test_rotation_rewraps_live_keys_and_leaves_the_erased_unwrappable(
        keys_settings: VoiceSettings, stores: list[ClusterKeyStore]) -> None:
    a, b = new_store(keys_settings, stores), new_store(keys_settings, stores)
    sealed = Sealer(a).seal(CNV, "msg-1", "kept")
    Sealer(a).seal(OTHER, "msg-1", "erased")
    erased_key = a.get(OTHER, 1)
    a.destroy(OTHER)
    done = new_store(keys_settings, stores).rotate()
    assert done.kek_version == 2 and done.retired == [1] and done.rewrapped == 1
    wait_for(lambda: b.ring.kek_retired == frozenset({1}), timeout=10, what="retirement at b")
    # Live keys still open everywhere, including a store started after the rotation.
    later = new_store(keys_settings, stores)
    for store in (a, b, later):
        assert Sealer(store).open_text(CNV, "msg-1", sealed) == "kept"
    # The plain consumer's view: no record of OTHER unwraps under a live KEK (only v2 is).
    kek = MasterKek(MASTER)
    live = [v for v in range(1, done.kek_version + 1) if v not in done.retired]
    seen = 0
    for m in read_all(keys_settings, topic_name(keys_settings, KEYS)):
        if m.key().decode() != OTHER or m.value() is None:
            continue
        rec = DataKeyWrapped.model_validate_json(m.value())
        seen += 1
        for version in live:
            with pytest.raises(KekError):
                kek.unwrap(version, base64.b64decode(rec.nonce), base64.b64decode(rec.wrapped),
                           wrap_aad(rec.id, rec.version, rec.key_id, version))
        # …while the retired version still would: only the retirement protects it.
        assert kek.unwrap(rec.kek_version, base64.b64decode(rec.nonce),
                          base64.b64decode(rec.wrapped),
                          wrap_aad(rec.id, rec.version, rec.key_id, rec.kek_version)) == erased_key
        assert rec.kek_version in done.retired
    assert seen >= 1  # not compacted yet: the test looked at the real record


def test_a_proposal_that_lost_adopts_the_winner_and_writes_it_last(
        keys_settings: VoiceSettings, stores: list[ClusterKeyStore],
        monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = new_store(keys_settings, stores), new_store(keys_settings, stores)
    a.create(CNV)
    winner = a.get(CNV, 1)
    # b proposes as if a's record had not reached it yet: blind until its own proposal is out.
    proposed, real_state, real_produce = [], b.ring.state, b._produce

    def produce(items: list) -> list:  # type: ignore[type-arg]
        proposed.append(items)
        return real_produce(items)

    monkeypatch.setattr(b, "_produce", produce)
    monkeypatch.setattr(b.ring, "state", lambda id_: real_state(id_) if proposed else "absent")
    assert b.create(CNV) == 1
    assert b.get(CNV, 1) == winner
    records = [m for m in read_all(keys_settings, topic_name(keys_settings, KEYS))
               if m.key().decode() == CNV]
    key_ids = [DataKeyWrapped.model_validate_json(m.value()).key_id for m in records]
    assert len(key_ids) == 3 and key_ids[0] == key_ids[2] != key_ids[1], key_ids
    later = new_store(keys_settings, stores)
    assert later.get(CNV, 1) == winner


RACER = """
import hashlib, sys, time
from streams.keyservice import key_store_for
from streams.settings import load_settings
store = key_store_for(load_settings())
store.wait_ready()
start, ids = float(sys.argv[1]), sys.argv[2:]
time.sleep(max(0.0, start - time.time()))
for id_ in ids:
    print(id_, hashlib.sha256(store.get(id_, store.create(id_))).hexdigest(), flush=True)
store.close()
"""


def test_two_processes_racing_to_create_the_same_ids_end_with_one_key_each(
        keys_settings: VoiceSettings, stores: list[ClusterKeyStore]) -> None:
    ids = [f"cnv-proc{i:04d}" for i in range(20)]
    start = time.time() + 8  # both processes up and caught up by then, even on a busy machine
    procs = [subprocess.Popen([sys.executable, "-c", RACER, str(start), *ids],
                              env=voice_env(keys_settings), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err[-2000:]
        outs.append(dict(line.split() for line in out.splitlines()))
    assert outs[0] == outs[1] and len(outs[0]) == len(ids)
    later = new_store(keys_settings, stores, master=DEV_MASTER_KEY)  # what the racers used
    assert {id_: hashlib.sha256(later.get(id_, 1)).hexdigest() for id_ in ids} == outs[0]


def test_garbage_on_the_key_topic_is_skipped_and_the_reader_goes_on(
        keys_settings: VoiceSettings, stores: list[ClusterKeyStore]) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": keys_settings.bootstrap})
    topic = topic_name(keys_settings, KEYS)
    # (A record without a key never gets there: the broker refuses it on a compacted topic.)
    for key, value in ((CNV.encode(), b"\x00\xff not json"),
                       (OTHER.encode(), b'{"id": "cnv-4567ef01", "key_id": 1}'),
                       (KEK_RECORD_KEY.encode(), b'{"current": 0}')):
        p.produce(topic, key=key, value=value)
    assert p.flush(30) == 0
    store = new_store(keys_settings, stores)
    store.sync()
    assert store.skipped == 3
    assert store.ring.kek_current == 1
    sealed = Sealer(store).seal(CNV, "msg-1", "still works")  # garbage never wins an id
    assert Sealer(new_store(keys_settings, stores)).open_text(CNV, "msg-1", sealed) == \
        "still works"


def test_a_ready_store_has_asked_where_its_topic_ends_before_its_first_creation(
        keys_settings: VoiceSettings, monkeypatch: pytest.MonkeyPatch,
        stores: list[ClusterKeyStore]) -> None:
    """Regression (CI): with a 3 s gateway bound a store's broker calls have 1 s, and a first
    creation's ``sync`` on a cold client (its connection, metadata, then the request) did not
    fit it on a loaded machine — the edge's first new conversation answered 503."""
    import streams.keyservice as keyservice

    asked: list[str] = []

    class Counted(keyservice.LogEnds):
        def __call__(self, topic: str, partitions: object, timeout: float) -> dict[int, int]:
            asked.append(topic)
            return super().__call__(topic, partitions, timeout)  # type: ignore[arg-type]

    monkeypatch.setattr(keyservice, "LogEnds", Counted)
    store = ClusterKeyStore(keys_settings, MasterKek(MASTER))  # the default 30 s: not flaky here
    stores.append(store)
    store.wait_ready(30)
    wait_for(lambda: asked == [topic_name(keys_settings, KEYS)], timeout=10,
             what="the store's one ask where its topic ends")
    assert store._ends_now._admin is not None  # kept for the first sync
    store.create(CNV)
    assert store.ring.state(CNV) == "live"
