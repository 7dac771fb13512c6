"""Streams per edge: how many idle SSE streams one edge holds, and how fast one event per
conversation reaches 1,000 open streams.

* ``sse.bare_idle_streams`` (baseline): a bare Starlette app under uvicorn, in a process of its
  own, whose one route holds a stream open and writes a comment every 5 s; ``STREAMS`` such
  streams are opened and its RSS growth is divided by their number. The floor of the
  framework: the same server, the same ASGI stack, none of Voice.
* ``sse.idle_streams``: the same number of conversation streams held open on one edge (the
  edge's gateway bound lifted, so none ends while they are opened), spread over
  ``IDLE_CONVERSATIONS`` conversations; its RSS growth per stream beside the baseline's.
* ``sse.fanout``: ``FANOUT`` conversations, one stream open on each; then one record per
  conversation (a turn's state) is produced straight onto the conversation log, in one burst,
  as the sequencer writes it. Latency = the record's produce → its ``turn`` event read by that
  conversation's client (both clocks this process's). Beside ``kafka.round_trip``; also the
  edge's CPU from the first produce to the last arrival, per event (the figure that carries
  over from a loaded machine).
* ``sse.fanout_steady``: the same, the records produced evenly over
  ``VOICE_BENCH_FANOUT_SPREAD_S`` (default 2 s) instead of in one burst.
* ``sse.held_streams``: ``STREAMS`` conversation streams held on one edge as browsers hold
  them: the edge ends each before the gateway bound (15 s, the default) and its client opens it
  again at once, resuming after the last id it saw. The first opens are spread over one bound,
  so the reopening is steady (a third of the streams a second at 5,000 streams); then for
  ``HOLD_S`` the edge's CPU a second, its RSS and the full collections it logged (each stops the
  whole edge; ``streams.heap.FullCollections`` logs those of 50 ms or more).
* ``sse.bare_held_streams`` (baseline): the same clients against the bare app, whose streams
  end after the same time.
* ``sse.bare_fanout`` (baseline, run it beside): ``FANOUT`` streams of a bare Starlette app
  under uvicorn, all woken by one in-process event, each writing one fixed frame — the floor
  of the framework for a fan-out (no Kafka, no views, no JSON, no middleware).

Both baselines run on the edge's own server (``deploy.edge_server``: ``VOICE_EDGE_HTTP`` and
``VOICE_EDGE_LOOP``, httptools and uvloop by default), so each ratio compares like with like.

The clients are raw asyncio connections (an HTTP/1.1 GET and a reader per stream), so the
client costs little beside the edge. Sizes: ``VOICE_BENCH_STREAMS`` (default 5,000) and
``VOICE_BENCH_FANOUT`` (default 1,000). ``VOICE_BENCH_PYSPY`` (a py-spy binary) samples the
edge during each fan-out into ``VOICE_BENCH_PYSPY_OUT`` (default /tmp), as collapsed stacks.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
from confluent_kafka import Producer

from bench.harness import Context, Result, benchmark, latency_summary
from bench.stack import (
    Stack,
    jit_seconds,
    live_threads_cpu_seconds,
    rss_kib,
    start_stack,
    threads_cpu_seconds,
)
from deploy.kafka_local import free_port
from deploy.processes import wait_http_ready
from schemas.conversation import TurnStateChanged
from streams.envelope import Envelope, encode
from streams.tokens import mint_token
from streams.topics import CONVERSATIONS, topic_name

STREAMS = int(os.environ.get("VOICE_BENCH_STREAMS", "5000"))
FANOUT = int(os.environ.get("VOICE_BENCH_FANOUT", "1000"))
FANOUT_SPREAD_S = float(os.environ.get("VOICE_BENCH_FANOUT_SPREAD_S", "2"))
"""``sse.fanout_steady``: the records are produced evenly over this long."""
FANOUT_BURSTS = int(os.environ.get("VOICE_BENCH_FANOUT_BURSTS", "5"))
"""Bursts on the same open streams; the figures are over all of them."""
BURST_GAP_S = 1.0
"""Quiet time between two bursts."""
IDLE_CONVERSATIONS = 50
OPEN_AT_ONCE = 100
"""Streams being opened at the same moment (a burst of new clients, not a flood)."""
SETTLE_S = 3.0
"""Quiet time after the last stream opened before the RSS is read (buffers settle)."""
EVENT = re.compile(rb"event: ?(\w+)\r?\ndata: ?([^\r\n]*)")
ID = re.compile(rb"^id: ?(\d+)", re.M)

BARE_APP = '''
import asyncio, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

END_S = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0  # 0: a stream never ends

async def frames():
    loop = asyncio.get_running_loop()
    end = loop.time() + END_S
    yield b": open\\n\\n"
    while not END_S or loop.time() < end:
        await asyncio.sleep(5 if not END_S else max(0.0, min(5, end - loop.time())))
        yield b": keep-alive\\n\\n"
    yield b": end; resume after 0\\n\\n"

async def stream(request):
    return StreamingResponse(frames(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})

async def health(request):
    return PlainTextResponse("ok")

app = Starlette(routes=[Route("/s", stream), Route("/health", health)])
from deploy.edge_server import server_options  # the edge's server: VOICE_EDGE_HTTP, _LOOP
from streams.settings import VoiceSettings
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            backlog=4096, **{**server_options(VoiceSettings()), "timeout_keep_alive": 600})
'''


BARE_FANOUT_APP = '''
import asyncio, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

waiting = set()

async def frames():
    loop = asyncio.get_running_loop()
    yield b": open\\n\\n"
    while True:  # one future and one timer per wait, as the edge's views
        fut = loop.create_future()
        waiting.add(fut)
        timer = loop.call_later(5, lambda: fut.done() or fut.set_result(False))
        try:
            fired = await fut
        finally:
            timer.cancel()
            waiting.discard(fut)
        yield (b'event: turn\\nid: 2\\ndata: {"seq":2,"state":"Replied"}\\n\\n' if fired
               else b": keep-alive\\n\\n")

async def stream(request):
    return StreamingResponse(frames(), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})

async def fire(request):
    for fut in list(waiting):
        if not fut.done():
            fut.set_result(True)
    return PlainTextResponse("ok")

async def health(request):
    return PlainTextResponse("ok")

app = Starlette(routes=[Route("/s", stream), Route("/fire", fire, methods=["POST"]),
                        Route("/health", health)])
from deploy.edge_server import server_options  # the edge's server: VOICE_EDGE_HTTP, _LOOP
from streams.settings import VoiceSettings
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            backlog=4096, **{**server_options(VoiceSettings()), "timeout_keep_alive": 600})
'''


class Burst(NamedTuple):
    """One burst of ``sse.fanout``: what arrived and what it cost."""

    latencies: dict[str, float]
    """Per conversation: its record's produce call → its turn event read by its client (s)."""
    produce_s: float
    edge_cpu_ms: float | None
    pauses: list[int]
    """The edge's logged full collections meanwhile (ms)."""
    others_cpu_ms: dict[str, float]
    """The CPU meanwhile of what shares the cores with the edge (``bench_client``, ``broker``,
    ``broker_jit``)."""


class Stream:
    """One held SSE stream: a raw connection, its reader noting what arrives."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 on_data: Callable[[Stream, bytes], None] | None = None) -> None:
        self.reader, self.writer = reader, writer
        self.on_data = on_data
        self.buffer = b""
        self.last_id = 0
        self.task = asyncio.create_task(self._read())

    async def _read(self) -> None:
        with contextlib.suppress(ConnectionError, asyncio.CancelledError):
            while chunk := await self.reader.read(65536):
                if self.on_data is not None:
                    self.on_data(self, chunk)

    def close(self) -> None:
        self.task.cancel()
        self.writer.close()


async def get_stream(port: int, path: str, token: str | None
                     ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bytes]:
    """GET ``path`` as an event stream on a new connection: its reader, writer and the
    response's head (status line and headers)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}"
                 "Accept: text/event-stream\r\n\r\n".encode())
    try:
        return reader, writer, await reader.readuntil(b"\r\n\r\n")
    except BaseException:
        writer.close()
        raise


def status_of(head: bytes) -> bytes:
    return head.split(b" ", 2)[1]


async def open_stream(port: int, path: str, token: str | None,
                      on_data: Callable[[Stream, bytes], None] | None = None) -> Stream:
    """GET ``path`` as an event stream; returns once the response's head says 200."""
    reader, writer, head = await get_stream(port, path, token)
    if (status := status_of(head)) != b"200":
        writer.close()
        raise RuntimeError(f"GET {path} answered {status.decode()}: {head[:200]!r}")
    return Stream(reader, writer, on_data)


async def open_all(paths: list[str], port: int, token: str | None,
                   on_data: Callable[[Stream, bytes], None] | None = None) -> list[Stream]:
    """A stream per path, ``OPEN_AT_ONCE`` being opened at a time."""
    gate = asyncio.Semaphore(OPEN_AT_ONCE)

    async def one(path: str) -> Stream:
        async with gate:
            return await open_stream(port, path, token, on_data)

    return list(await asyncio.gather(*(one(p) for p in paths)))


def held_streams_growth(pid: int, port: int, paths: list[str], token: str | None
                        ) -> dict[str, Any]:
    """Open a stream per path against the process ``pid``; its RSS growth per stream."""

    async def run() -> dict[str, Any]:
        before = rss_kib(pid)
        t0 = time.perf_counter()
        streams = await open_all(paths, port, token)
        opened_s = time.perf_counter() - t0
        await asyncio.sleep(SETTLE_S)
        after = rss_kib(pid)
        alive = sum(1 for s in streams if not s.task.done())
        for s in streams:
            s.close()
        return {"streams": len(streams), "alive_after_settle": alive,
                "rss_before_mib": round(before / 1024, 1), "rss_after_mib": round(after / 1024, 1),
                "kib_per_stream": round((after - before) / len(streams), 2),
                "open_s": round(opened_s, 2),
                "opened_per_s": round(len(streams) / opened_s, 1)}

    return asyncio.run(run())


@contextlib.contextmanager
def bare_app(source: str, *args: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """A bare app (``source``, run with its port and ``args`` as arguments) in its own
    process, ready."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", source, str(port), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/health", proc=proc)
        yield proc, port
    finally:  # a loaded machine can take a while to close a thousand connections
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@benchmark("sse.bare_idle_streams")
def bare_idle_streams(ctx: Context) -> Result:
    """RSS growth per idle stream of a bare Starlette/uvicorn SSE route (the framework floor)."""
    with bare_app(BARE_APP) as (proc, port):
        return held_streams_growth(proc.pid, port, ["/s"] * STREAMS, None)


@benchmark("sse.bare_fanout")
def bare_fanout(ctx: Context) -> Result:
    """One event to ``FANOUT`` streams of a bare Starlette/uvicorn app at once (the floor)."""
    with bare_app(BARE_FANOUT_APP) as (proc, port):
        arrived: dict[int, float] = {}

        def on_data(stream: Stream, chunk: bytes) -> None:
            if b"event: turn" in chunk:
                arrived.setdefault(id(stream), time.time())

        async def run() -> tuple[list[float], float | None]:
            streams = await open_all(["/s"] * FANOUT, port, None, on_data)
            await asyncio.sleep(SETTLE_S)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
                (await client.get("/health")).raise_for_status()  # connected before the clock
                cpu0 = live_threads_cpu_seconds(proc.pid)
                sent = time.time()
                (await client.post("/fire")).raise_for_status()
                await _until(lambda: len(arrived) == len(streams), 60, "every event")
                cpu1 = live_threads_cpu_seconds(proc.pid)
            for s in streams:
                s.close()
            cpu = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) * 1000
            return [t - sent for t in arrived.values()], cpu

        latencies, cpu_ms = asyncio.run(run())
    cpu = {} if cpu_ms is None else {"cpu_ms": round(cpu_ms, 1),
                                     "cpu_us_per_event": round(cpu_ms * 1000 / FANOUT, 1)}
    return {**latency_summary(latencies), "streams": FANOUT, **cpu,
            "note": "the latency floor of the framework: one in-process event wakes every "
                    "stream, each writes one fixed frame (no Kafka, no JSON, no views)"}


def _conversations(st: Stack, token: str, n: int) -> list[str]:
    """``n`` new conversations of the token's principal (20 created at a time)."""

    async def run() -> list[str]:
        gate = asyncio.Semaphore(20)
        async with httpx.AsyncClient(base_url=st.edge_url, timeout=60,
                                     headers={"Authorization": f"Bearer {token}"}) as client:
            async def one() -> str:
                async with gate:
                    r = await client.post("/me/conversations")
                    r.raise_for_status()
                    return str(r.json()["conversation"])

            return list(await asyncio.gather(*(one() for _ in range(n))))

    return asyncio.run(run())


def _edge_stack(ctx: Context, label: str) -> Stack:
    """A stack whose edge holds streams for 10 min (the bound would end them while the last
    ones open) and counts, but never refuses, streams per principal."""
    return start_stack(ctx, label, workers=1, edge_env={"VOICE_GATEWAY_BOUND_S": "600"})


def _spread_streams(st: Stack, principal: str) -> tuple[str, list[str], int]:
    """A token of ``principal``, ``STREAMS`` stream paths spread over ``IDLE_CONVERSATIONS``
    new conversations of it, and the edge's port."""
    token = mint_token(st.settings, principal, "participant")
    conversations = _conversations(st, token, IDLE_CONVERSATIONS)
    paths = [f"/me/conversations/{conversations[i % len(conversations)]}/stream?after=0"
             for i in range(STREAMS)]
    return token, paths, int(st.edge_url.rsplit(":", 1)[1])


@benchmark("sse.idle_streams", baseline="sse.bare_idle_streams", compare=("kib_per_stream",))
def idle_streams(ctx: Context) -> Result:
    """RSS growth per idle conversation stream held by one edge (target ≤ 30 KiB)."""
    st = _edge_stack(ctx, "idle")
    try:
        token, paths, port = _spread_streams(st, "bench-idle")
        return {**held_streams_growth(st.procs["edge"].pid, port, paths, token),
                "conversations": IDLE_CONVERSATIONS}
    finally:
        st.close()


async def _until(pred: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout:g} s")
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def _profiled(pid: int, label: str) -> Any:
    """With ``VOICE_BENCH_PYSPY`` (the path of a py-spy binary), sample process ``pid`` while
    the block runs into ``<VOICE_BENCH_PYSPY_OUT or /tmp>/<label>.txt`` (collapsed stacks)."""
    spy = os.environ.get("VOICE_BENCH_PYSPY")
    if not spy:
        yield
        return
    out = Path(os.environ.get("VOICE_BENCH_PYSPY_OUT", "/tmp")) / f"{label}.txt"
    proc = subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "1000", "--nonblocking",
                             "--gil", "--format",
                             "raw", "--threads", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attached before the block starts
    try:
        yield
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


PAUSE = re.compile(rb"full garbage collection stopped this process for (\d+) ms")


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _full_collections(log_file: Path, since: int) -> list[int]:
    """The pauses (ms) ``streams.heap.FullCollections`` logged in ``log_file`` past ``since``."""
    try:
        with log_file.open("rb") as f:
            f.seek(since)
            return [int(m.group(1)) for m in PAUSE.finditer(f.read())]
    except OSError:
        return []


def _fanout(ctx: Context, label: str, spread_s: float) -> Result:
    """One record per conversation of ``FANOUT``, produced evenly over ``spread_s`` (0: one
    burst), ``FANOUT_BURSTS`` times on the same open streams; latency = produce call → its
    turn event read by its stream's client. The summary is over every burst's events; each
    burst's p50 and edge CPU per event are listed beside it (a burst is a second or less of
    the edge's work, so one burst alone says little on a noisy machine)."""
    if FANOUT_BURSTS < 1:
        raise ValueError(f"VOICE_BENCH_FANOUT_BURSTS must be at least 1, not {FANOUT_BURSTS}")
    st = _edge_stack(ctx, label)
    try:
        token = mint_token(st.settings, "bench-fanout", "participant")
        conversations = _conversations(st, token, FANOUT)
        port = int(st.edge_url.rsplit(":", 1)[1])
        arrived: dict[str, float] = {}
        of_stream: dict[int, str] = {}
        expected = {"turn": b""}  # the turn id of the burst under way, as its data carries it

        def on_data(stream: Stream, chunk: bytes) -> None:
            now = time.time()
            stream.buffer += chunk
            frames = stream.buffer.split(b"\n\n")
            stream.buffer = frames.pop()
            for frame in frames:
                if (m := ID.search(frame)) is not None:
                    stream.last_id = max(stream.last_id, int(m.group(1)))
                if ((e := EVENT.search(frame)) is not None and e.group(1) == b"turn"
                        and expected["turn"] in e.group(2)):
                    arrived.setdefault(of_stream[id(stream)], now)

        async def run() -> list[Burst]:
            paths = [f"/me/conversations/{c}/stream?after=0" for c in conversations]
            streams = await open_all(paths, port, token, on_data)
            for c, s in zip(conversations, streams, strict=True):
                of_stream[id(s)] = c
            topic = topic_name(st.settings, CONVERSATIONS)
            producer = Producer({"bootstrap.servers": st.settings.bootstrap, "linger.ms": 0,
                                 "acks": "all", "enable.idempotence": True})
            producer.list_topics(topic, timeout=10)  # metadata (and its producer id) first
            await asyncio.sleep(SETTLE_S)  # every stream past its (empty) backlog
            bursts = []
            for n in range(1, FANOUT_BURSTS + 1):
                bursts.append(await one_burst(n, topic, producer, streams))
                await asyncio.sleep(BURST_GAP_S)
            for s in streams:
                s.close()
            return bursts

        edge_log = st.settings.state_dir / "edge.log"

        def others_cpu_s() -> dict[str, float]:
            """CPU seconds so far of what shares the cores with the edge in a burst: this
            process (the clients' loop and the producer), the broker, its JIT compilers. The
            keys of ``Stack.cpu``, read per thread to the nanosecond: a burst is tens of ms."""
            out = {}
            if (mine := live_threads_cpu_seconds(os.getpid())) is not None:
                out["bench_client"] = mine
            if ctx.broker_pid is not None and (
                    broker := threads_cpu_seconds(ctx.broker_pid)) is not None:
                out["broker"], out["broker_jit"] = sum(broker.values()), jit_seconds(broker)
            return out

        async def one_burst(n: int, topic: str, producer: Producer, streams: list[Stream]
                            ) -> Burst:
            arrived.clear()
            log_at = _size(edge_log)
            expected["turn"] = f":turn-{n}\"".encode()
            # Encoded first, produced from a thread: the clients' loop keeps reading meanwhile.
            records = []
            for c, s in zip(conversations, streams, strict=True):
                env = Envelope(record=TurnStateChanged(conversation=c, turn=f"{c}:turn-{n}",
                                                       state="Replied"),
                               # seq 1 is the conversation's start (no SSE event)
                               key=c, source="/voice/sequencer", seq=max(s.last_id, 1) + 1,
                               tenant="default")
                records.append((c, encode(env)))
            sent: dict[str, float] = {}

            def burst() -> None:
                start = time.perf_counter()
                for i, (c, (key, value, headers)) in enumerate(records):
                    if spread_s > 0:  # the i-th record at its share of the spread
                        if (ahead := start + spread_s * i / len(records)
                                - time.perf_counter()) > 0:
                            time.sleep(ahead)
                    sent[c] = time.time()
                    producer.produce(topic, value, key, headers=headers)
                    producer.poll(0)
                producer.flush(30)

            edge = st.procs["edge"].pid
            with _profiled(edge, f"sse.{label}.{n}"):
                threads0 = threads_cpu_seconds(edge)  # one reading: the total and by thread
                others0 = others_cpu_s()
                t0 = time.perf_counter()
                await asyncio.to_thread(burst)
                burst_s = time.perf_counter() - t0
                await _until(lambda: len(arrived) == len(conversations), 60,
                             "every turn event")
                threads1 = threads_cpu_seconds(edge)
                others1 = others_cpu_s()
            others = {k: round((others1[k] - v) * 1000, 1) for k, v in others0.items()
                      if k in others1}
            edge_cpu_ms = (None if threads0 is None or threads1 is None
                           else (sum(threads1.values()) - sum(threads0.values())) * 1000)
            by_thread = {} if threads0 is None or threads1 is None else {
                k: round((v - threads0.get(k, 0)) * 1000, 1) for k, v in threads1.items()}
            pauses = _full_collections(edge_log, log_at)
            ctx.log(f"  burst {n}: edge CPU "
                    f"{'?' if edge_cpu_ms is None else round(edge_cpu_ms)} ms, by thread (ms) "
                    f"{ {k: v for k, v in by_thread.items() if v >= 1} }, "
                    f"full collections (ms) {pauses}, others' CPU (ms) {others}")
            return Burst({c: arrived[c] - sent[c] for c in conversations}, burst_s, edge_cpu_ms,
                         pauses, others)

        bursts = asyncio.run(run())
    finally:
        st.close()
    # The edge's CPU from the first produce to the last arrival (its tail, loop and writes):
    # the figure that carries over from this loaded machine; the clock ones do not.
    latencies = [lat for b in bursts for lat in b.latencies.values()]
    per_event = [None if b.edge_cpu_ms is None
                 else round(b.edge_cpu_ms * 1000 / len(b.latencies), 1) for b in bursts]
    known = sorted(x for x in per_event if x is not None)
    cpu = {} if not known else {"edge_cpu_us_per_event": known[len(known) // 2]}
    return {**latency_summary(latencies), "streams": len(conversations),
            "bursts": len(bursts),
            "burst_p50_ms": [latency_summary(list(b.latencies.values()))["p50_ms"]
                             for b in bursts],
            "burst_edge_cpu_us_per_event": per_event,
            # The edge's full collections of LONG_PAUSE_MS or more during each burst (its log):
            # the whole edge stops meanwhile, every stream waits.
            "burst_edge_full_collections_ms": [b.pauses for b in bursts],
            # The CPU of what shares the two cores with the edge meanwhile: this process (the
            # clients and the producer) and the broker, its JIT compilers apart (a fresh
            # broker compiles for minutes; one that has run for days does not).
            "burst_others_cpu_ms": {name: [b.others_cpu_ms.get(name) for b in bursts]
                                    for name in ("bench_client", "broker", "broker_jit")},
            "burst_produce_s": [round(b.produce_s, 3) for b in bursts],
            "spread_s": spread_s, **cpu}


@benchmark("sse.fanout", baseline="kafka.round_trip", compare=("p50_ms", "p99_ms"))
def fanout(ctx: Context) -> Result:
    """One record per conversation, produced in a burst → each of 1,000 open streams has it."""
    return {**_fanout(ctx, "fanout", 0.0),
            "note": "one record per conversation, all produced in one burst; each latency is "
                    "that record's produce call → its turn event read by its stream's client"}


@benchmark("sse.fanout_steady", baseline="kafka.round_trip", compare=("p50_ms", "p99_ms"))
def fanout_steady(ctx: Context) -> Result:
    """One record per conversation, spread evenly over ``FANOUT_SPREAD_S`` → each stream."""
    return {**_fanout(ctx, "fanout_steady", FANOUT_SPREAD_S),
            "note": f"one record per conversation, produced evenly over {FANOUT_SPREAD_S:g} s "
                    "(a steady rate, not a burst); latency as sse.fanout"}



HOLD_S = float(os.environ.get("VOICE_BENCH_HOLD_S", "60"))
"""``sse.held_streams``: how long the streams are held (and measured) once all are open."""
HELD_BOUND_S = 15.0
"""The gateway bound of ``sse.held_streams``' edge (the default): its streams end before it."""


def _held(port: int, paths: list[str], token: str | None, pid: int, log_file: Path | None,
          end_after_s: float | None) -> dict[str, Any]:
    """Hold a stream per path as a browser does: open it (spread over one bound), read until
    the server ends it (or, ``end_after_s``, close it then), open it again after the last id
    seen. Measured over ``HOLD_S`` once every stream has opened once."""
    if HOLD_S <= 0:
        raise ValueError(f"VOICE_BENCH_HOLD_S must be more than 0, not {HOLD_S:g}")
    reopened = 0
    failed = 0
    measuring = False

    async def hold(path: str, delay: float, stop: asyncio.Event) -> None:
        nonlocal reopened, failed
        await asyncio.sleep(delay)
        last = 0
        while not stop.is_set():
            base, _, _ = path.partition("?after=")
            try:
                reader, writer, head = await get_stream(port, f"{base}?after={last}", token)
            except asyncio.IncompleteReadError:  # connected, no head: again at once
                failed += 1
                continue
            except OSError:
                failed += 1
                await asyncio.sleep(1)
                continue
            try:
                if status_of(head) != b"200":
                    failed += 1
                    await asyncio.sleep(1)
                    continue
                deadline = (None if end_after_s is None
                            else asyncio.get_running_loop().time() + end_after_s)
                tail = b""
                while not stop.is_set():
                    wait = (None if deadline is None
                            else max(0.0, deadline - asyncio.get_running_loop().time()))
                    try:
                        chunk = await asyncio.wait_for(reader.read(65536), wait)
                    except TimeoutError:
                        break
                    if not chunk:
                        break
                    tail = (tail + chunk)[-4096:]
                    for m in ID.finditer(tail):
                        last = max(last, int(m.group(1)))
                    if tail.endswith(b"\r\n0\r\n\r\n"):  # the chunked body's end
                        break
                if measuring:
                    reopened += 1
            except (OSError, asyncio.IncompleteReadError):
                failed += 1
            finally:
                writer.close()

    async def run() -> dict[str, Any]:
        nonlocal measuring
        stop = asyncio.Event()
        tasks = [asyncio.create_task(hold(path, HELD_BOUND_S * i / len(paths), stop))
                 for i, path in enumerate(paths)]
        await asyncio.sleep(HELD_BOUND_S + 1)  # every stream opened once
        log_at = 0 if log_file is None else _size(log_file)
        cpu0, t0 = live_threads_cpu_seconds(pid), time.perf_counter()
        measuring = True
        await asyncio.sleep(HOLD_S)
        measuring = False
        cpu1, elapsed = live_threads_cpu_seconds(pid), time.perf_counter() - t0
        rss = rss_kib(pid)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        pauses = [] if log_file is None else _full_collections(log_file, log_at)
        cpu = {} if cpu0 is None or cpu1 is None else {
            "cpu_ms_per_s": round((cpu1 - cpu0) * 1000 / elapsed, 1),
            "cpu_us_per_reopen": round((cpu1 - cpu0) * 1e6 / max(reopened, 1), 1)}
        return {"streams": len(paths), "hold_s": round(elapsed, 1), "reopened": reopened,
                "reopened_per_s": round(reopened / elapsed, 1), "failed": failed,
                "rss_mib": round(rss / 1024, 1), **cpu,
                "full_collections": len(pauses), "full_collections_ms": sum(pauses),
                "longest_full_collection_ms": max(pauses, default=0),
                "paused_share": round(sum(pauses) / 1000 / elapsed, 3)}

    return asyncio.run(run())


@benchmark("sse.bare_held_streams")
def bare_held_streams(ctx: Context) -> Result:
    """``STREAMS`` streams of the bare app, each ended after the edge's time and reopened."""
    end_s = HELD_BOUND_S - min(1.0, HELD_BOUND_S / 3)  # when the edge ends its streams
    with bare_app(BARE_APP, str(end_s)) as (proc, port):
        return {**_held(port, ["/s"] * STREAMS, None, proc.pid, None, None),
                "note": "the bare app ends each stream when the edge would; its client "
                        "reopens it at once"}


@benchmark("sse.held_streams", baseline="sse.bare_held_streams", compare=("cpu_ms_per_s",))
def held_streams(ctx: Context) -> Result:
    """``STREAMS`` conversation streams held on one edge as browsers hold them (reopened as
    the edge ends each before the gateway bound): its CPU, RSS and full collections."""
    st = start_stack(ctx, "held", workers=1,
                     edge_env={"VOICE_GATEWAY_BOUND_S": f"{HELD_BOUND_S:g}"})
    try:
        token, paths, port = _spread_streams(st, "bench-held")
        return {**_held(port, paths, token, st.procs["edge"].pid,
                        st.settings.state_dir / "edge.log", None),
                "conversations": IDLE_CONVERSATIONS,
                "note": f"each stream ends before the {HELD_BOUND_S:g} s bound and is opened "
                        "again at once after its last id; full collections are those the "
                        "edge logged (50 ms or more)"}
    finally:
        st.close()
