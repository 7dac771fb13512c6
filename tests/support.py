"""Helpers the tests share: settings per test, process runners, and the one SSE reader every
integration test reads a stream with. (The broker's choice and container: tests/containers.py.)"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from deploy.processes import (  # noqa: F401  (re-exported for the tests)
    spawn_voice,
    stop,
    voice_env,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)
from streams.envelope import Envelope, decode, unfolded
from streams.fetch import log_ends
from streams.reading import read_topic
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import TopicSpec, create_topics, record_specs, topic_name

REPO = Path(__file__).resolve().parent.parent


def unique_settings(bootstrap: str, tmp: Path, **overrides: object) -> VoiceSettings:
    """Settings with a fresh topic prefix and group prefix (one per test)."""
    tag = uuid.uuid4().hex[:8]
    values: dict[str, object] = {
        "kafka_bootstrap": bootstrap, "topic_prefix": f"t{tag}.", "group_prefix": f"g{tag}",
        "topic_partitions": 3, "state_dir": tmp, "env": "test",
    }
    values.update(overrides)
    return VoiceSettings(**values)  # type: ignore[arg-type]


def settings_with_topics(bootstrap: str, tmp: Path, **overrides: object) -> VoiceSettings:
    """``unique_settings`` with every topic created: what a test needs before it starts a
    worker or an edge (the ``settings`` fixture, and every stack a test starts by hand)."""
    settings = unique_settings(bootstrap, tmp, **overrides)
    create_topics(settings)
    return settings


env_for = voice_env


def read_all(settings: VoiceSettings, topic: str, timeout: float = 5.0) -> list:  # list[Message]
    """Every record currently on ``topic`` (all partitions), read with a plain consumer."""
    return read_topic(settings, topic, timeout=timeout)


def forge_command(settings: VoiceSettings, cmd: Any, max_bytes: int | None = None) -> None:
    """Put ``cmd`` (an ``Envelope``) on the commands topic as if from past the edge; with
    ``max_bytes`` past the record bound every Voice producer keeps, too."""
    from streams.producer import RecordProducer
    from streams.topics import COMMANDS, topic_name

    async def produce() -> None:
        conf = {} if max_bytes is None else {"message.max.bytes": max_bytes}
        p = RecordProducer(settings, **conf)
        if max_bytes is not None:
            p.max_bytes = max_bytes
        await p.send(topic_name(settings, COMMANDS), cmd)
        p.close()

    asyncio.run(produce())


def forge_records(settings: VoiceSettings, spec: TopicSpec, envs: list[Envelope]) -> None:
    """Put ``envs`` on ``spec``'s topic, in order, as if a Voice writer had (an older
    release's records, say)."""
    from streams.producer import Publisher, RecordProducer

    async def produce() -> None:
        p = RecordProducer(settings)
        try:
            await Publisher(settings, lambda: p).send_all([(spec, env) for env in envs])
        finally:
            p.close()

    asyncio.run(produce())


def acknowledgement_of(settings: VoiceSettings, command_id: str, timeout: float,
                       what: str) -> Any:
    """The ``CommandAcknowledged`` of ``command_id`` on the acks topic, waited for."""
    from schemas.system import CommandAcknowledged
    from streams.envelope import decode
    from streams.topics import ACKS, topic_name

    def answered() -> CommandAcknowledged | None:
        for m in read_all(settings, topic_name(settings, ACKS)):
            rec = decode(m.key(), m.value(), m.headers()).record
            if isinstance(rec, CommandAcknowledged) and rec.command_id == command_id:
                return rec
        return None

    return wait_for(answered, timeout=timeout, what=what)


def wait_for(predicate, timeout: float = 20, interval: float = 0.1, what: str = "condition"):  # noqa: ANN001, ANN201
    """Poll ``predicate`` until it returns a truthy value; return it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"{what} not reached in {timeout}s")


def edge_state(url: str, settings: VoiceSettings) -> dict[str, Any]:
    """The edge's own state (``GET /ops/edge``, an operator's): the conversations it holds,
    the records its tail skipped."""
    token = mint_token(settings, "ops", "operator")
    r = httpx.get(f"{url}/ops/edge", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert r.status_code == 200, r.text
    return r.json()


# --- the faults suite: logs read back, a client that retries as the edge asks ------------


def log_of(settings: VoiceSettings, spec: TopicSpec, key: str) -> list[Envelope]:
    """``key``'s records on ``spec`` (every delivery, duplicates included), in seq order; a
    folded record as the records it stands for (``unfolded``), as readers see them."""
    out = [part for m in read_all(settings, topic_name(settings, spec))
           if m.key() == key.encode()
           for part in unfolded(decode(m.key(), m.value(), m.headers()))]
    return sorted(out, key=lambda e: e.seq or 0)


def table_values(settings: VoiceSettings, table: str, key: str) -> list[bytes]:
    """The values the worker group's ``table`` has written for ``key`` to its changelog, in
    order (deletions left out)."""
    topic = f"{worker_group(settings)}-{table}-changelog"
    return [value for m in read_all(settings, topic)
            if (m.key() or b"").strip(b'"') == key.encode() and (value := m.value())]


def table_holds(settings: VoiceSettings, table: str, key: str) -> bool:
    """Whether the worker group's ``table`` has a value for ``key`` in its changelog: a
    worker killed after that has its state for the next one (a kill before may lose it, and
    the next worker then decides the key's command again)."""
    return bool(table_values(settings, table, key))


def step_running(settings: VoiceSettings, workflow: str, step_index: int = 0) -> bool:
    """Whether a worker has started ``workflow``'s step ``step_index``: its workflow table
    says so (the runtime writes the table, then starts the step's task). A first step has no
    record of its own on ``voice.workflows`` (its start is ``WorkflowStarted``'s), so a test
    that must stop a worker mid-step waits on the table's changelog instead (where a running
    step's state is held back at most ``VOICE_WORKER_CHANGELOG_LINGER_S``)."""
    return any(state.get("status") == "running" and state.get("step_index") == step_index
               for state in map(json.loads, table_values(settings, "workflows", workflow)))


def accepted(post: Callable[[], httpx.Response], also: tuple[int, ...] = ()
             ) -> httpx.Response:
    """``post`` until it is answered ``202`` (or one of ``also``): a worker that just joined
    may not own the partition yet, and the edge answers ``503``; the client retries with the
    same ``Idempotency-Key``, as the edge asks."""
    deadline = time.monotonic() + 90
    while (r := post()).status_code == 503:
        assert time.monotonic() < deadline, r.text
        time.sleep(1)
    assert r.status_code in (202, 201, *also), r.text
    return r


def send_message(client: httpx.Client, conversation: str, key: str, text: str) -> None:
    """A participant's message, posted (with ``key`` as its ``Idempotency-Key``) until it is
    answered ``202`` (``accepted``)."""
    accepted(lambda: client.post(f"/me/conversations/{conversation}/messages",
                                 headers={"Idempotency-Key": key}, json={"text": text}))


def no_duplicate_seqs(log: list[Envelope]) -> list[Envelope]:
    """The log without redelivered duplicates (same seq, same id), checked dense."""
    by_seq: dict[int, Envelope] = {}
    for env in log:
        assert env.seq is not None
        first = by_seq.setdefault(env.seq, env)
        assert first.id == env.id, f"seq {env.seq} given twice: {first.id} and {env.id}"
    assert sorted(by_seq) == list(range(1, len(by_seq) + 1))
    return [by_seq[s] for s in sorted(by_seq)]


# --- SSE ------------------------------------------------------------------------------------


@dataclass
class SseFrame:
    """One SSE frame as it was on the wire (a blank line ends it): its fields and comments."""

    event: str | None = None
    id: str | None = None
    text: str | None = None
    """The data field as sent (several ``data:`` lines joined by newlines)."""
    comments: list[str] = field(default_factory=list)
    """Comment lines (``: keep-alive``), without the colon and the space after it."""

    @property
    def data(self) -> Any:
        """The data field decoded as JSON (every Voice stream sends JSON), or None without one."""
        return None if self.text is None else json.loads(self.text)


@dataclass
class SseRead:
    """What one request to an SSE route got: status, headers, the frames, how it ended."""

    status: int
    headers: httpx.Headers
    frames: list[SseFrame]
    ended: bool
    """The server closed the stream (rather than ``until`` ending the read early)."""
    elapsed: float
    body: Any = None
    """The body of an answer other than 200, decoded if JSON (then there are no frames)."""

    @property
    def events(self) -> list[SseFrame]:
        """The frames that carry an event (not the comment-only ones)."""
        return [f for f in self.frames if f.event is not None]


def sse_frames(lines: Iterable[str]) -> Iterator[SseFrame]:
    """Frames from the lines of an ``text/event-stream`` body (the WHATWG field rules)."""
    cur, seen, data = SseFrame(), False, []
    for line in lines:
        if line == "":
            if seen:
                cur.text = "\n".join(data) if data else None
                yield cur
            cur, seen, data = SseFrame(), False, []
            continue
        seen = True
        if line.startswith(":"):
            cur.comments.append(line[1:].removeprefix(" "))
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        elif name == "event":
            cur.event = value
        elif name == "id":
            cur.id = value
    if seen:  # the server closed without the blank line: the frame still counts here
        cur.text = "\n".join(data) if data else None
        yield cur


def read_sse(method: str, url: str, *, headers: dict[str, str] | None = None,
             deadline: float = 30.0,
             until: Callable[[list[SseFrame]], bool] | None = None,
             during: Callable[[], object] | None = None,
             transport: httpx.AsyncBaseTransport | None = None,
             **request: Any) -> SseRead:
    """Read an SSE response until the server ends it or ``until(events so far)`` holds.

    The whole exchange must finish within ``deadline`` seconds, or ``TimeoutError`` says what
    had arrived: every Voice stream ends within the gateway bound, so a stream still open is a
    failure, not a wait. ``during`` runs once, after the first frame arrived, while the
    connection stays open (in a thread, so it may block or run its own event loop).
    """
    async def read() -> SseRead:
        t0 = time.monotonic()
        got: list[SseFrame] = []
        pending = during
        async with httpx.AsyncClient(transport=transport, timeout=deadline) as client:
            try:
                async with asyncio.timeout(deadline):
                    async with client.stream(method, url, headers=headers, **request) as r:
                        if r.status_code != 200:
                            await r.aread()
                            try:
                                body = r.json()
                            except ValueError:
                                body = r.text
                            return SseRead(r.status_code, r.headers, [], True,
                                           time.monotonic() - t0, body)
                        async for frame in _aframes(r.aiter_lines()):
                            got.append(frame)
                            if pending is not None:
                                await asyncio.to_thread(pending)
                                pending = None
                            if until is not None and until([f for f in got if f.event is not None]):
                                return SseRead(200, r.headers, got, False,
                                               time.monotonic() - t0)
                        return SseRead(200, r.headers, got, True, time.monotonic() - t0)
            except TimeoutError:
                raise TimeoutError(f"{method} {url}: the stream was still open after "
                                   f"{deadline}s; frames so far: {got}") from None

    return asyncio.run(read())


async def _aframes(lines: AsyncIterator[str]) -> AsyncIterator[SseFrame]:
    buffered: list[str] = []
    async for line in lines:
        buffered.append(line)
        if line == "":
            for frame in sse_frames(buffered):
                yield frame
            buffered = []
    for frame in sse_frames(buffered):
        yield frame


def committed(settings: VoiceSettings, group: str, parts: Iterable[tuple[str, int]]
              ) -> dict[tuple[str, int], int]:
    """Consumer group ``group``'s committed offset of each (topic, partition) of ``parts``
    (negative: none), read by a consumer that does not join the group."""
    c = Consumer({"bootstrap.servers": settings.bootstrap, "group.id": group,
                  "enable.auto.commit": False})
    try:
        res = c.committed([TopicPartition(t, p) for t, p in parts], timeout=10)
        return {(r.topic, r.partition): r.offset for r in res}
    finally:
        c.close()


def sink_parts(settings: VoiceSettings) -> list[tuple[str, int]]:
    """Every (topic, partition) the telemetry sink reads: every record topic, never voice.keys."""
    return [(topic_name(settings, s), p) for s in record_specs()
            for p in range(settings.topic_partitions)]


def sink_committed(settings: VoiceSettings, parts: Iterable[tuple[str, int]] | None = None
                   ) -> dict[tuple[str, int], int]:
    """The telemetry sink's group's committed offset of each of ``parts`` (default: every
    partition it reads)."""
    from telemetry.sink import group_id  # the sink's own naming (its imports load here only)

    return committed(settings, group_id(settings),
                     sink_parts(settings) if parts is None else parts)


def caught_up(settings: VoiceSettings, group: str, parts: Iterable[tuple[str, int]]) -> bool:
    """Whether consumer group ``group`` has committed every record of each (topic, partition)
    of ``parts``."""
    try:
        done = committed(settings, group, parts)
        admin = AdminClient({"bootstrap.servers": settings.bootstrap})
        for topic in {t for t, _p in done}:
            ends = log_ends(admin, topic, [p for t, p in done if t == topic], 10)
            if any(high > 0 and done[(topic, p)] < high for p, high in ends.items()):
                return False
        return True
    except KafkaException:  # the group's coordinator moving: ask again
        return False


def sink_caught_up(settings: VoiceSettings) -> bool:
    """Whether the telemetry sink's group has committed every record of every topic it reads
    (so every record is in the store: the sink commits only after the insert)."""
    from telemetry.sink import group_id  # the sink's own naming (its imports load here only)

    return caught_up(settings, group_id(settings), sink_parts(settings))
