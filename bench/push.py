"""The edge's own Python of a fan-out, in-process: what ``sse.fanout`` measures through sockets,
a broker and a thousand clients on the same two cores, here without any of them.

* ``sse.bare_push`` (baseline): ``FANOUT`` streams' ASGI ``send`` s, each written one fixed
  frame a round through the stream's ``Outlet`` (the write the push path ends in) — the floor
  of handing one event to a stream's response.
* ``sse.push``: ``FANOUT`` conversations on one ``ConversationViews``, one caught-up
  conversation stream each (``conversation_events``, the route's own loop), served to an ASGI
  ``send`` that keeps nothing; then, a round at a time, one turn record per conversation
  applied to the views as the edge's tail applies a burst. Each stream's push writes its
  event inside the apply (``api.frame.sse``). The figure is the thread's CPU per event:
  views, notify, push, render and the ``send`` chain — the edge's Python per event without
  the socket write, the tail's decode and everything else on the cores. Every round checks
  that each stream was written its event, with its id, inside the apply.

Both run on the edge's loop (uvloop when installed). ``PUSH_ROUNDS`` rounds after
``PUSH_WARMUP`` warm-up rounds; the figure is the median round. Stable to a few per cent on a
busy machine, where ``sse.fanout``'s p99 moves by tens: a change to the fan-out path shows
here first (docs/benchmarks.md, issue 14, forty-fourth pass).
"""

from __future__ import annotations

import asyncio
import gc
import re
import statistics
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

from starlette.types import Message

from api.conversations.routes import conversation_events
from api.conversations.views import ConversationViews
from api.frame.sse import Outlet, event_stream
from bench.fanout import FANOUT
from bench.harness import Context, Result, benchmark
from schemas.conversation import ConversationStarted, TurnStateChanged
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer

PUSH_ROUNDS = 20
PUSH_WARMUP = 3
BOUND_S = 3600.0
"""The streams' gateway bound: none ends (or sends a keep-alive) while the rounds run."""
FRAME = b'event: turn\ndata: {"seq":2,"turn":"cnv-0:turn-2","state":"Replied"}\nid: 2\n\n'
_ID = re.compile(rb"^id: (\d+)$", re.M)

T = TypeVar("T")


class Sink:
    """An ASGI server's side of one stream that keeps only the last body it was sent."""

    def __init__(self, gone: asyncio.Event) -> None:
        self.writes = 0
        self.last = b""
        self._gone = gone

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body":
            self.writes += 1
            self.last = message.get("body", b"")

    async def receive(self) -> Message:
        await self._gone.wait()
        return {"type": "http.disconnect"}


def _run(main: Coroutine[Any, Any, T]) -> T:
    """``main`` on the edge's loop: uvloop when installed."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)


def _summary(per_round: list[float], rounds_s: list[float], n: int) -> Result:
    return {"cpu_us_per_event": round(statistics.median(per_round), 2),
            "cpu_us_per_event_min": round(min(per_round), 2),
            "cpu_us_per_event_max": round(max(per_round), 2),
            "wall_us_per_event": round(statistics.median(rounds_s) * 1e6 / n, 2),
            "streams": n, "rounds": len(per_round)}


@benchmark("sse.bare_push")
def bare_push(ctx: Context) -> Result:
    """One fixed frame to each of ``FANOUT`` streams' ASGI sends, in-process (the floor)."""

    async def main() -> Result:
        gone = asyncio.Event()
        sinks = [Sink(gone) for _ in range(FANOUT)]
        outlets = [Outlet(s.send) for s in sinks]
        per_round, walls = [], []
        for r in range(PUSH_WARMUP + PUSH_ROUNDS):
            gc.collect()
            cpu0, wall0 = time.thread_time(), time.perf_counter()
            for outlet in outlets:
                outlet.write(FRAME)
            cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
            if any(s.writes != r + 1 for s in sinks):
                raise RuntimeError(f"round {r}: a frame was not written at once")
            if r >= PUSH_WARMUP:
                per_round.append(cpu * 1e6 / FANOUT)
                walls.append(wall)
        return _summary(per_round, walls, FANOUT)

    return {**_run(main()),
            "note": "one fixed frame a round through each stream's Outlet to an ASGI send that "
                    "keeps nothing: the floor of a push; the thread's CPU per event"}


@benchmark("sse.push", baseline="sse.bare_push", compare=("cpu_us_per_event",))
def push(ctx: Context) -> Result:
    """The edge's Python per fan-out event, in-process: views, notify, push, render, send."""

    async def main() -> Result:
        gone = asyncio.Event()
        views = ConversationViews()
        sealer = Sealer(MemoryKeyStore())
        conversations = [f"cnv-bench-push-{i:05d}" for i in range(FANOUT)]
        for c in conversations:
            views.apply(Envelope(record=ConversationStarted(conversation=c, owner="bench"),
                                 key=c, source="/voice/sequencer", seq=1, tenant="default"))
        sinks = [Sink(gone) for _ in conversations]
        tasks = [asyncio.create_task(event_stream(conversation_events(
            views, sealer, c, 1, bound_s=BOUND_S))({"type": "http"}, s.receive, s.send))
            for c, s in zip(conversations, sinks, strict=True)]
        try:
            async with asyncio.timeout(60):
                while any(views.waiting(c) != 1 for c in conversations):
                    await asyncio.sleep(0.01)
            per_round, walls = [], []
            for r in range(PUSH_WARMUP + PUSH_ROUNDS):
                seq = r + 2
                envs = [Envelope(record=TurnStateChanged(conversation=c, turn=f"{c}:turn-{seq}",
                                                         state="Replied"),
                                 key=c, source="/voice/sequencer", seq=seq, tenant="default")
                        for c in conversations]
                writes = [s.writes for s in sinks]
                gc.collect()
                cpu0, wall0 = time.thread_time(), time.perf_counter()
                for env in envs:
                    views.apply(env)
                cpu, wall = time.thread_time() - cpu0, time.perf_counter() - wall0
                for s, before in zip(sinks, writes, strict=True):  # pushed inside the apply
                    if s.writes != before + 1 or _ID.findall(s.last) != [str(seq).encode()]:
                        raise RuntimeError(f"round {r}: a stream was not pushed its event "
                                           f"{seq} in the apply: {s.last[:120]!r}")
                if r >= PUSH_WARMUP:
                    per_round.append(cpu * 1e6 / FANOUT)
                    walls.append(wall)
            return _summary(per_round, walls, FANOUT)
        finally:
            gone.set()
            await asyncio.gather(*tasks, return_exceptions=True)

    return {**_run(main()),
            "note": "one turn record per conversation applied to the edge's views; each "
                    "caught-up stream pushes its event to an ASGI send that keeps nothing "
                    "(no socket, no Kafka, no decode); the thread's CPU per event"}
