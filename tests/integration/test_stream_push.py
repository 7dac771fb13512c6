"""A caught-up stream's events are written in the tail's hand-over (``api.frame.sse``'s push);
held to what a stream promises on a real broker and a real edge when its client stops reading:
that client holds back its own stream only, and, reading again, gets every event once, in
order (docs/benchmarks.md, "Issue 14, eighth pass")."""

from __future__ import annotations

import re
import socket
import time

import httpx
import pytest
from confluent_kafka import Producer

from schemas.conversation import TurnStateChanged
from streams.envelope import Envelope, encode
from streams.producer import producer_config
from streams.settings import VoiceSettings
from streams.topics import CONVERSATIONS, topic_name
from tests.integration.test_conversations_edge import (
    auth,
    create,
    read_stream,
    worker,  # noqa: F401 - the fixture: the real worker, its model calls held
)
from tests.support import wait_for

pytestmark = pytest.mark.integration

FLOOD = 40_000
"""Events for the client that stops reading: ~5 MB of frames, past what the kernel's socket
buffers on both sides hold, so the edge's writes to it must wait for its window."""


def produce_turn_states(settings: VoiceSettings, cnv: str, first_seq: int, n: int) -> None:
    """``n`` turn states of ``cnv`` straight onto its log, as the sequencer writes them (with
    Voice's producer settings: its partitioner puts them where the edge's log reads look)."""
    producer = Producer(producer_config(settings, **{"linger.ms": 5}))
    topic = topic_name(settings, CONVERSATIONS)
    for i in range(n):
        seq = first_seq + i
        key, value, headers = encode(Envelope(
            record=TurnStateChanged(conversation=cnv, turn=f"{cnv}:turn-{seq}",
                                    state="Replied"),
            key=cnv, source="/voice/sequencer", seq=seq, tenant="default"))
        while True:
            try:
                producer.produce(topic, value, key, headers=headers)
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    assert producer.flush(30) == 0


class StalledClient:
    """A raw HTTP/1.1 stream request whose reader stops after the response's first bytes,
    with a small receive window; ``read_until`` reads again."""

    def __init__(self, url: str, path: str, headers: dict[str, str]) -> None:
        host, port = url.removeprefix("http://").split(":")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        lines = [f"GET {path} HTTP/1.1", f"Host: {host}",
                 *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        self.sock.sendall("\r\n".join(lines).encode())
        self.raw = self.sock.recv(4096)
        assert self.raw.startswith(b"HTTP/1.1 200"), self.raw[:200]

    def read_until(self, done: object, timeout: float) -> None:
        self.sock.settimeout(1.0)
        deadline = time.monotonic() + timeout
        while not done(self.ids()):  # type: ignore[operator]
            assert time.monotonic() < deadline, f"{len(self.ids())} events read"
            try:
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                continue
            assert chunk, (f"the edge ended the stream after {len(self.ids())} events: "
                           f"{self.raw[-300:]!r}")
            self.raw += chunk

    def ids(self) -> list[int]:
        body = self.raw.split(b"\r\n\r\n", 1)[1]
        # Chunked framing: a hex size line before each chunk; SSE ids are whole lines.
        return [int(m) for m in re.findall(rb"^id: (\d+)\r?$", body, re.M)]

    def close(self) -> None:
        self.sock.close()


@pytest.mark.usefixtures("worker")
def test_a_client_that_stops_reading_holds_back_only_its_own_stream(
    settings: VoiceSettings, start_edge  # noqa: ANN001
) -> None:
    url = start_edge(VOICE_GATEWAY_BOUND_S="120")
    slow, other = create(url, settings), create(url, settings)
    client = StalledClient(url, f"/me/conversations/{slow}/stream?after=1", auth(settings))
    try:
        produce_turn_states(settings, slow, 2, FLOOD)
        last = FLOOD + 1
        # The edge has them all (its view's head), while its client reads nothing.
        wait_for(lambda: {c["conversation"]: c["last_seq"] for c in httpx.get(
            f"{url}/me/conversations", headers=auth(settings), timeout=10).json()}[slow] == last,
            timeout=60)
        # Another conversation's stream is served meanwhile, at once.
        produce_turn_states(settings, other, 2, 1)
        s = read_stream(url, settings, other, after=1, stop=lambda ev: bool(ev))
        assert s.status == 200 and [f.id for f in s.events] == ["2"]
        assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
        # Reading again: every event, once, in order.
        client.read_until(lambda ids: bool(ids) and ids[-1] >= last, timeout=90)
        assert client.ids() == list(range(2, last + 1))
    finally:
        client.close()
