"""The key service on the cluster: a ``KeyStore`` whose truth is the compacted key topic.

Every process (edge, worker, replay, ``voice keys rotate``) runs one ``ClusterKeyStore``: a
reader thread tails ``voice.keys`` from its beginning into a ``KeyRing`` in memory, then stays
live, so a lookup is a dict hit and a tombstone written anywhere drops the key here within the
reader's poll (≈ 0.1 s, bound 2 s). No file, no shared folder (decision 0009):

- ``create`` proposes a fresh key (produce), waits until its own reader is past that offset,
  and takes whatever the ring then holds — the first record on the partition wins, whoever
  wrote it. A loser writes the winner's record again, so compaction (which keeps the last
  record of a key) keeps the winner;
- ``destroy`` writes a tombstone and forgets the key here at once;
- ``rotate`` re-wraps every live key under a new KEK version, writes the erased ids' tombstones
  again (a re-wrap must never be the last word on an erased id), then retires the old versions.

This module must never log, print or repr an unwrapped data key.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from schemas.keys import KEK_RECORD_KEY, DataKeyWrapped, KekVersions
from streams.envelope import Envelope, encode
from streams.fetch import TAILING, LogEnds, take
from streams.kek import Kek, MasterKek, master_key_from_env, master_keys_from_env
from streams.keyring import KeyRing, wrap_record
from streams.sealing import KeyErased, KeyNotFound, SealingError, check_id
from streams.settings import VoiceSettings
from streams.topics import KEYS, topic_name

T = TypeVar("T")

log = logging.getLogger(__name__)

SOURCE = "/voice/keys"


class KeyServiceUnavailable(SealingError):
    """The key topic could not be read or written in time (broker down, topic missing)."""


@dataclass(frozen=True)
class Rotation:
    """What ``voice keys rotate`` did."""

    kek_version: int
    """The KEK version every live key is now wrapped under."""
    retired: list[int]
    rewrapped: int
    tombstones: int
    """Erased ids whose tombstone was written again after the re-wraps."""


class ClusterKeyStore:
    """A ``KeyStore`` on the key topic, held in memory by a reader thread (module docstring)."""

    def __init__(self, settings: VoiceSettings, kek: Kek, timeout_s: float = 30.0,
                 ready_timeout_s: float = 120.0) -> None:
        self._topic = topic_name(settings, KEYS)
        self._bootstrap = settings.bootstrap
        self._kek = kek
        self._timeout = timeout_s
        """How long a call waits for the broker before ``KeyServiceUnavailable``."""
        self._ready_timeout = ready_timeout_s
        """How long a call waits for the first catch-up (a large topic takes seconds)."""
        self.ring = KeyRing(kek)
        self._producer = Producer({"bootstrap.servers": self._bootstrap, "acks": "all",
                                   "enable.idempotence": True, "linger.ms": 0})
        self._produce_lock = threading.Lock()
        self._cond = threading.Condition()
        self._pos: dict[int, int] = {}
        """Per partition: the offset the reader will read next (all before it are in the ring)."""
        self._eof: set[int] = set()
        self._partitions: list[int] = []
        self.ready = threading.Event()
        """Set once the reader has read every partition to the end it found at start."""
        self.skipped = 0
        """Records of the key topic the reader could not take (logged with their offset)."""
        self._ends_now = LogEnds(self._bootstrap)
        """Where the key topic ends now, for ``sync`` (one request; a new client after a
        failure)."""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="voice-keys-reader", daemon=True)
        self._thread.start()

    # -- the KeyStore port -------------------------------------------------------------------

    def create(self, conversation: str, tenant: str | None = None) -> int:
        """The live key's version; a fresh key if the id has none (the first record wins)."""
        check_id("conversation", conversation)
        if self.ring.state(conversation) == "absent":
            self.sync()  # another process may have made it: don't propose for nothing
        state = self.ring.state(conversation)
        if state == "live":
            return self.ring.version(conversation)
        if state == "erased":
            raise KeyErased(f"conversation {conversation!r} was erased")
        key_id = secrets.token_hex(16)
        proposal = wrap_record(self._kek, conversation, AESGCM.generate_key(bit_length=256),
                               key_id, self.ring.kek_current, tenant)
        partition, offset = self._produce([(conversation, proposal, tenant)])[0]
        self._wait_past(partition, offset)
        if self.ring.state(conversation) == "erased":
            # Erased meanwhile: the tombstone, not our proposal, must be the last word.
            self._produce([(conversation, None, tenant)])
            raise KeyErased(f"conversation {conversation!r} was erased")
        winner = self.ring.record(conversation)
        if winner.key_id != key_id:
            # Lost the race: write the winner again, after our proposal, for compaction.
            self._produce([(conversation, winner, winner.tenant)])
        return winner.version

    def get(self, conversation: str, version: int) -> bytes:
        """The data key (a dict hit); on a miss, read the topic to its end once and look again."""
        return self._looked_up(self.ring.key, conversation, version)

    def cipher(self, conversation: str, version: int) -> AESGCM:
        """The data key as a ready cipher (the ring keeps those used last), looked up as
        ``get`` does."""
        return self._looked_up(self.ring.cipher, conversation, version)

    def _looked_up(self, look: Callable[[str, int], T], conversation: str, version: int) -> T:
        try:
            return look(conversation, version)
        except KeyNotFound:
            if self.ring.state(conversation) != "absent":
                raise
        self.sync()
        return look(conversation, version)

    def holds(self, conversation: str) -> bool:
        """Whether the ring has the id (live or erased): then no call waits on the topic."""
        return self.ring.state(conversation) != "absent"

    def current_version(self, conversation: str) -> int:
        """The version new content is sealed with."""
        if self.ring.state(conversation) == "absent":
            self.sync()
        return self.ring.version(conversation)

    def destroy(self, conversation: str) -> None:
        """Write the id's tombstone (awaiting the broker's ack) and drop the key here at once."""
        check_id("conversation", conversation)
        self._produce([(conversation, None, None)])
        self.ring.apply_tombstone(conversation)

    def close(self) -> None:
        """Stop the reader and release the clients."""
        self._stop.set()
        self._thread.join(timeout=10)
        self._producer.flush(5)
        # Drop the client now: librdkafka's threads live until the handle is destroyed and
        # would keep reconnecting to a broker that may be gone (as ``RecordProducer.close``).
        del self._producer
        self._ends_now.drop()

    # -- rotation ----------------------------------------------------------------------------

    def rotate(self) -> Rotation:
        """Re-wrap every live key under a new KEK version, then retire every older version."""
        self.sync()
        new = max([self.ring.kek_current, *self.ring.kek_retired]) + 1
        old_retired = sorted(self.ring.kek_retired)
        # First make the new version current, so keys created from now on need no re-wrap.
        self._produce([(KEK_RECORD_KEY, KekVersions(current=new, retired=old_retired), None)])
        self.sync()
        rewrapped = 0
        for _ in range(5):  # a key created under the old version meanwhile: another pass
            batch = []
            for id_ in self.ring.live_ids():
                try:
                    rec = self.ring.record(id_)
                    if rec.kek_version == new:
                        continue
                    key = self.ring.key_to_rewrap(id_)
                except KeyErased:
                    continue  # erased meanwhile: nothing to carry over
                except SealingError as exc:  # altered, or another master key: cannot carry
                    log.warning("rotation: the key of %r stays as it is: %s", id_, exc)
                    continue
                batch.append((id_, wrap_record(self._kek, id_, key, rec.key_id, new,
                                               rec.tenant, rec.version), rec.tenant))
            if not batch:
                break
            self._produce(batch)
            rewrapped += len(batch)
            self.sync()
        # An id erased while we re-wrapped may now end with our re-wrap: end it with a tombstone.
        erased = self.ring.erased_ids()
        if erased:
            self._produce([(id_, None, None) for id_ in erased])
        retired = sorted({*old_retired, *range(1, new)})
        self._produce([(KEK_RECORD_KEY, KekVersions(current=new, retired=retired), None)])
        self.sync()
        return Rotation(kek_version=new, retired=retired, rewrapped=rewrapped,
                        tombstones=len(erased))

    # -- reading the topic -------------------------------------------------------------------

    def wait_ready(self, timeout: float | None = None) -> None:
        """Block until the reader has caught up with the topic as it was at start."""
        timeout = self._ready_timeout if timeout is None else timeout
        if not self.ready.wait(timeout):
            raise KeyServiceUnavailable(
                f"the key topic {self._topic!r} was not read to its end in {timeout}s (is the "
                "broker up, and the topic created by `voice topics create`?)")

    def sync(self, timeout: float | None = None) -> None:
        """Return once everything on the key topic now has been read into the ring."""
        self.wait_ready()
        timeout = self._timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        ends = self._ends(timeout)
        with self._cond:
            while any(self._pos.get(p, 0) < end for p, end in ends.items()):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KeyServiceUnavailable(
                        f"the key topic {self._topic!r} was not read to its end in {timeout}s")
                self._cond.wait(left)

    def _wait_past(self, partition: int, offset: int) -> None:
        deadline = time.monotonic() + self._timeout
        with self._cond:
            while self._pos.get(partition, 0) <= offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise KeyServiceUnavailable(
                        f"{self._topic}[{partition}]@{offset} not read back in {self._timeout}s")
                self._cond.wait(left)

    def _ends(self, timeout: float) -> dict[int, int]:
        """Where each partition of the key topic ends now, in one request (``LogEnds``)."""
        return self._ends_now(self._topic, self._partitions, timeout)

    def _consumer_config(self) -> dict[str, Any]:
        return {"bootstrap.servers": self._bootstrap,
                "group.id": f"voice-keys-{uuid.uuid4().hex}",  # never joined, never committed
                "enable.auto.commit": False, "enable.partition.eof": True,
                # An erasure reaches every reader as soon as it is on the log: a record ends
                # the broker's wait at once (``streams.fetch``).
                **TAILING}

    def _run(self) -> None:
        consumer = Consumer(self._consumer_config())
        try:
            parts = self._await_topic(consumer)
            if parts is None:
                return
            with self._cond:
                self._partitions = parts
                self._pos = dict.fromkeys(parts, 0)
            consumer.assign([TopicPartition(self._topic, p, OFFSET_BEGINNING) for p in parts])
            while not self._stop.is_set():
                moved: dict[int, int] = {}
                for msg in take(consumer, 0.1, 10_000):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            self._eof.add(msg.partition())
                            moved[msg.partition()] = max(moved.get(msg.partition(), 0),
                                                         msg.offset())
                        else:
                            log.warning("key topic %s: %s", self._topic, err)
                        continue
                    self._take(msg)
                    moved[msg.partition()] = msg.offset() + 1
                if moved or not self.ready.is_set():
                    was_ready = self.ready.is_set()
                    with self._cond:
                        for p, nxt in moved.items():
                            self._pos[p] = max(self._pos.get(p, 0), nxt)
                        if self._eof >= set(parts):
                            self.ready.set()
                        self._cond.notify_all()
                    if self.ready.is_set() and not was_ready:
                        self._warm_ends()
        except Exception:
            log.exception("the key reader of %s stopped", self._topic)
        finally:
            consumer.close()

    def _warm_ends(self) -> None:
        """Ask once where the key topic ends, so the first ``sync`` (a process's first new
        conversation) finds the client connected and the topic's metadata known: cold, the
        client's connection, metadata and the request did not fit a 1 s budget (an edge with a
        3 s gateway bound) on a loaded CI machine, and the creation answered 503."""
        try:
            self._ends(self._timeout)
        except Exception as exc:  # a later sync asks again (on a new client)
            log.debug("warming where %s ends: %s", self._topic, exc)

    def _await_topic(self, consumer: Consumer) -> list[int] | None:
        warned = False
        while not self._stop.is_set():
            try:
                # Short: a close waits for this thread, and with no broker this is all it does.
                md = consumer.list_topics(self._topic, timeout=1)
                t = md.topics.get(self._topic)
                if t is not None and t.error is None and t.partitions:
                    return sorted(t.partitions)
            except Exception as exc:  # the broker is not up yet: keep trying
                log.debug("key topic metadata: %s", exc)
            if not warned:
                log.warning("waiting for the key topic %s (run `voice topics create`)",
                            self._topic)
                warned = True
            self._stop.wait(1.0)
        return None

    def _take(self, msg: Any) -> None:
        """Fold one record into the ring; a record it cannot take is logged and skipped."""
        try:
            key = msg.key().decode()
            value = msg.value()
            if value is None:
                if key != KEK_RECORD_KEY:
                    self.ring.apply_tombstone(key)
                return
            # The Kafka key tells the two record types apart (no header parsing per record:
            # a start reads every record of the topic).
            if key == KEK_RECORD_KEY:
                self.ring.apply_kek(KekVersions.model_validate_json(value))
            else:
                self.ring.apply_json(key, value)
        except Exception as exc:
            self.skipped += 1
            log.warning("key topic: skipped %s[%s]@%s: %s", msg.topic(), msg.partition(),
                        msg.offset(), exc)

    # -- writing -----------------------------------------------------------------------------

    def _produce(self, items: list[tuple[str, DataKeyWrapped | KekVersions | None, str | None]]
                 ) -> list[tuple[int, int]]:
        """Produce (key, record or None for a tombstone, tenant) each; await every ack.

        Returns each record's (partition, offset), in order.
        """
        results: list[Any] = [None] * len(items)

        def on_delivery(i: int) -> Any:
            def done(err: Any, msg: Any) -> None:
                results[i] = err if err is not None else (msg.partition(), msg.offset())
            return done

        with self._produce_lock:
            for i, (key, rec, tenant) in enumerate(items):
                if rec is None:
                    self._send(key.encode(), None, None, on_delivery(i))
                else:
                    k, v, h = encode(Envelope(record=rec, key=key, source=SOURCE, subject=key,
                                              tenant=tenant))
                    self._send(k, v, h, on_delivery(i))
                self._producer.poll(0)
            left = self._producer.flush(self._timeout)
        failed = [r for r in results if not isinstance(r, tuple)]
        if left or failed:
            raise KeyServiceUnavailable(
                f"could not write to the key topic {self._topic!r}: "
                f"{failed[0] if failed else f'{left} records unacknowledged'}")
        return results

    def _send(self, key: bytes, value: bytes | None, headers: Any, done: Any) -> None:
        while True:
            try:
                self._producer.produce(self._topic, key=key, value=value, headers=headers,
                                       on_delivery=done)
                return
            except BufferError:  # the local queue is full (a rotation of many keys): drain
                self._producer.poll(0.5)


def key_store_for(settings: VoiceSettings) -> ClusterKeyStore:
    """The process's key store: the key topic, KEKs from ``VOICE_MASTER_KEY``.

    A call that must reach the broker (a miss, a creation, an erasure) gives up after a third
    of the gateway bound, so an edge answers 503 in time rather than hang on a lost broker.
    """
    secret = settings.master_key.get_secret_value() if settings.master_key else None
    versions = settings.master_keys.get_secret_value() if settings.master_keys else None
    kek = MasterKek(master_key_from_env(settings.env, secret),
                    master_keys_from_env(settings.env, versions))
    return ClusterKeyStore(settings, kek,
                           timeout_s=min(30.0, settings.gateway_bound_s / 3))
