"""Figures of a participant's turn through the whole stack (issue 3: conversation turns).

The stack (``bench.stack``): simulator at zero latency, one worker, one edge, all child
processes on the run's broker and on the same cores as the benchmark client.

- ``edge.post_message``: POST message → 202 at a steady request rate, beside the raw
  produce-ack. Each POST also starts a turn, so the worker runs turns meanwhile, as it would.
- ``turn.overhead``: message POSTed → the agent's reply on an SSE client, one turn at a time,
  beside the same turn's records on bare Kafka (``bench.chain``, ``kafka.turn_chain``); with
  the median time of each hop on the way, read back from the records' timestamps
  (``hops_p50_ms``).
- ``turn.sustained``: turns per second with concurrent participants, each holding its SSE
  stream as a browser would, counting replies lost or recorded twice (from the conversation
  log and from what the clients saw); beside the turns a second of the same records on bare
  Kafka (``kafka.turn_chain_sustained``); with CPU milliseconds per turn of each process and the
  Kafka records the stack wrote a turn.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.broker_requests import per_unit, reading
from bench.harness import Context, Result, benchmark, latency_summary, percentile
from bench.settings import BenchSettings
from bench.stack import Stack, stack
from deploy.processes import worker_group
from schemas.conversation import MessageRecorded, ReplyRecorded
from streams.envelope import DecodeError, decode
from streams.reading import read_topic
from streams.tokens import mint_token
from streams.topics import ACKS, AGENT, COMMANDS, CONVERSATIONS, WORKFLOWS, topic_name

POSTS = 300
POST_CONVERSATIONS = 20
OVERHEAD_TURNS = 200
OVERHEAD_WARMUP = 10
SUSTAINED_CONCURRENCY = 32
SUSTAINED_WARMUP = 32
TURN_TIMEOUT_S = 30.0
TEXT = "I am worried the crossing by the school is unsafe for children. Please add a light."
TERMINAL = ("Replied", "CouldNotInterpret")


def _headers(ctx: Context, sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(ctx.settings, sub, 'participant')}"}


def _client(connections: int = 64, timeout: float = 30) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return httpx.AsyncClient(timeout=timeout, limits=limits)


async def _conversation(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str:
    r = await client.post(f"{url}/me/conversations", headers=headers)
    r.raise_for_status()
    return r.json()["conversation"]


async def _post(client: httpx.AsyncClient, url: str, conv: str, headers: dict[str, str],
                text: str) -> httpx.Response:
    return await client.post(f"{url}/me/conversations/{conv}/messages", headers=headers,
                             json={"text": text})


async def _wait_turns(client: httpx.AsyncClient, url: str, headers: dict[str, str],
                      turns: list[tuple[str, str]], timeout: float = 60) -> int:
    """Wait until every (conversation, turn) has ended; returns how many did not in time."""
    deadline = time.monotonic() + timeout
    left = 0
    for conv, turn in turns:
        while True:
            r = await client.get(f"{url}/me/conversations/{conv}/turns/{turn}", headers=headers)
            if r.status_code == 200 and r.json()["state"] in TERMINAL:
                break
            if time.monotonic() > deadline:
                left += 1
                break
            await asyncio.sleep(0.05)
    return left


def _cpu_delta(before: dict[str, float | None], after: dict[str, float | None], per: float
               ) -> dict[str, float | None]:
    """CPU milliseconds per unit (a turn, a second) of each process between two
    ``Stack.cpu()``."""
    out: dict[str, float | None] = {}
    for name, b in before.items():
        a = after.get(name)
        out[name] = None if a is None or b is None else round((a - b) * 1000 / per, 2)
    return out


# --- edge.post_message -----------------------------------------------------------------------


@benchmark("edge.post_message", baseline="kafka.produce_ack", compare=("p50_ms", "p99_ms"))
def post_message(ctx: Context) -> Result:
    """POST /me/conversations/{c}/messages → 202, at a steady rate (each POST starts a turn)."""
    s = stack(ctx)
    h = _headers(ctx, "bench-post")
    statuses: Counter[int] = Counter()

    posted: list[_Turn] = []
    rate = BenchSettings().post_rate

    async def main() -> tuple[list[float], list[tuple[str, str]]]:
        async with _client() as client:
            convs = [await _conversation(client, s.edge_url, h) for _ in range(POST_CONVERSATIONS)]
            for i, conv in enumerate(convs[:5]):  # unmeasured: connections, first turns
                r = await _post(client, s.edge_url, conv, h, f"{TEXT} (warm-up {i})")
                r.raise_for_status()
            samples: list[float] = []
            turns: list[tuple[str, str]] = []

            async def one(i: int) -> None:
                conv = convs[i % len(convs)]
                wall = time.time()
                t0 = time.perf_counter()
                r = await _post(client, s.edge_url, conv, h, f"{TEXT} ({i})")
                t1 = time.perf_counter()
                statuses[r.status_code] += 1
                if r.status_code == 202:
                    samples.append(t1 - t0)
                    turns.append((conv, r.json()["turn"]))
                    posted.append(_Turn(conv, r.json()["turn"], wall, 0.0, time.time()))

            tasks = []
            start = time.perf_counter()
            for i in range(POSTS):
                await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)
            # Let the turns these POSTs started end, so the next figure starts on a quiet stack.
            await _wait_turns(client, s.edge_url, h, turns)
            return samples, turns

    samples, _turns = asyncio.run(main())
    if statuses.get(202, 0) != POSTS:
        raise RuntimeError(f"not every POST answered 202: {dict(statuses)}")
    marks, _calls, _records, _model = _marks(s.settings, posted, agent=False)
    return {**latency_summary(samples), "rate_per_s": rate,
            "hops_ms": _hops(marks, POST_CHAIN),
            "conversations": POST_CONVERSATIONS, "statuses": dict(statuses),
            "stack": s.describe()}


# --- turn.overhead ---------------------------------------------------------------------------


async def _reply_seen(client: httpx.AsyncClient, url: str, conv: str, headers: dict[str, str],
                      after: int, connected: asyncio.Event) -> float:
    """Hold the SSE stream; return the wall-clock time the agent's reply arrived."""
    async with client.stream("GET", f"{url}/me/conversations/{conv}/stream",
                             params={"after": after}, headers=headers) as resp:
        resp.raise_for_status()
        connected.set()
        event = None
        async for line in resp.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "message":
                if json.loads(line[5:]).get("role") == "agent":
                    return time.time()
    raise RuntimeError("stream ended without the reply")


@dataclass
class _Turn:
    conversation: str
    turn: str = ""
    posted: float = 0.0
    """Wall clock (time.time) just before the POST."""
    seen: float = 0.0
    """Wall clock the reply arrived on the SSE client."""
    answered: float = 0.0
    """Wall clock the POST's answer (202) arrived."""


def _ts(msg: Any) -> float:
    """A record's Kafka timestamp (producer CreateTime, ms) in seconds."""
    return msg.timestamp()[1] / 1000.0


TURN_CHAIN = (
    ("post", "command"),                  # edge in: HTTP, auth, seal, SendMessage made
    ("command", "message_recorded"),      # sequencer: SendMessage → MessageRecorded
    ("message_recorded", "workflow_started"),  # turn worker: TurnRequested → WorkflowStarted
    # workflow engine (WorkflowStarted applied: the step starts, no record of its own since
    # issue 14), then the engine: the first model call recorded
    ("workflow_started", "first_model_call"),
    ("first_model_call", "reply_command"),  # engine: tool, second call, reply command made
    ("reply_command", "reply_recorded"),  # sequencer: reply command → ReplyRecorded
    ("reply_recorded", "seen"),           # edge out: ReplyRecorded → on the SSE client
)
POST_CHAIN = (
    ("post", "command"),                  # edge in: HTTP, auth, seal, SendMessage made
    ("command", "message_recorded"),      # sequencer: SendMessage consumed → MessageRecorded
    ("message_recorded", "ack"),          # sequencer: → its ack produced
    ("ack", "answered"),                  # edge: ack consumed → 202 on the client
)


def _marks(settings: Any, turns: list[_Turn], agent: bool = True
           ) -> tuple[dict[str, dict[str, float]], Counter[str], Counter[str], Counter[str]]:
    """Per turn, the time of each step of its path, from the records' timestamps; and per
    turn its model calls, its agent records and the milliseconds its model calls took (their
    records' ``latency_ms``: the engine's wait for the model, request to parsed response).

    ce_time (µs) where the record's producer stamps it when it makes the record; the Kafka
    CreateTime (ms) for the sequencer's outputs, whose ce_time is the command's by design.
    """
    by_conv: dict[str, list[_Turn]] = defaultdict(list)
    for t in turns:
        by_conv[t.conversation].append(t)
    wanted = {t.turn for t in turns}
    marks: dict[str, dict[str, float]] = defaultdict(dict)

    def mark(turn: str, name: str, value: float) -> None:
        m = marks[turn]
        if name not in m or value < m[name]:
            m[name] = value

    def envs(spec: Any) -> Any:
        for msg in read_topic(settings, topic_name(settings, spec)):
            try:
                yield msg, decode(msg.key(), msg.value(), msg.headers())
            except DecodeError:
                continue

    command_turn: dict[str, str] = {}  # SendMessage command id → its turn
    for msg, env in envs(CONVERSATIONS):
        if env.key not in by_conv:
            continue
        if isinstance(env.record, MessageRecorded):  # a message, or one opening its turn
            turn = f"{env.key}:turn-{env.seq}"
            if turn in wanted:
                mark(turn, "message_recorded", _ts(msg))
                command_turn[env.causation or ""] = turn
        elif isinstance(env.record, ReplyRecorded):  # a reply, or one ending its turn
            mark(env.record.turn, "reply_recorded", _ts(msg))
    for _msg, env in envs(COMMANDS):
        if env.key not in by_conv:
            continue
        if env.id in command_turn:
            mark(command_turn[env.id], "command", env.time.timestamp())
        elif env.id.endswith((":reply", ":results")):  # the turn's results, one command now
            turn = env.id.rsplit(":", 1)[0]
            if turn in wanted:
                mark(turn, "reply_command", env.time.timestamp())
    for msg, env in envs(ACKS):
        if env.key in command_turn:
            mark(command_turn[env.key], "ack", _ts(msg))
    calls: Counter[str] = Counter()
    records: Counter[str] = Counter()
    model_ms: Counter[str] = Counter()
    if agent:
        for _msg, env in envs(WORKFLOWS):
            if env.key not in wanted:
                continue
            if env.type == "voice.workflow.started.v1":
                mark(env.key, "workflow_started", env.time.timestamp())
        for _msg, env in envs(AGENT):
            if env.key not in wanted:
                continue
            records[env.key] += 1
            if env.type in ("voice.agent.model_call.v1", "voice.agent.model_call.v2"):
                calls[env.key] += 1
                model_ms[env.key] += env.record.latency_ms
                mark(env.key, "first_model_call", env.time.timestamp())
    for t in turns:
        marks[t.turn].update(post=t.posted, seen=t.seen, answered=t.answered)
    return marks, calls, records, model_ms


def _hops(marks: dict[str, dict[str, float]], chain: Any) -> dict[str, dict[str, float]]:
    """p50 and p90 milliseconds of each hop of ``chain`` over the turns that have both ends."""
    out: dict[str, dict[str, float]] = {}
    for a, b in chain:
        vals = sorted((m[b] - m[a]) * 1000 for m in marks.values() if m.get(a) and m.get(b))
        if vals:
            out[f"{a}→{b}"] = {"p50": round(percentile(vals, 50), 2),
                                "p90": round(percentile(vals, 90), 2),
                                "p99": round(percentile(vals, 99), 2)}
    return out


@benchmark("turn.overhead", baseline="kafka.turn_chain", compare=("p50_ms", "p99_ms"))
def turn_overhead(ctx: Context) -> Result:
    """Message POSTed → the agent's reply on an SSE client; simulator at zero latency."""
    s = stack(ctx)
    h = _headers(ctx, "bench-overhead")

    async def main() -> list[_Turn]:
        done: list[_Turn] = []
        async with _client() as client:
            for i in range(OVERHEAD_WARMUP + OVERHEAD_TURNS):
                t = _Turn(await _conversation(client, s.edge_url, h))
                connected = asyncio.Event()
                seen = asyncio.create_task(
                    _reply_seen(client, s.edge_url, t.conversation, h, 1, connected))
                await connected.wait()
                t.posted = time.time()
                r = await _post(client, s.edge_url, t.conversation, h, f"{TEXT} ({i})")
                r.raise_for_status()
                t.answered = time.time()
                t.turn = r.json()["turn"]
                t.seen = await asyncio.wait_for(seen, TURN_TIMEOUT_S)
                if i >= OVERHEAD_WARMUP:
                    done.append(t)
        return done

    before = s.cpu()
    t0 = time.perf_counter()
    turns = asyncio.run(main())
    wall = time.perf_counter() - t0
    cpu = _cpu_delta(before, s.cpu(), OVERHEAD_TURNS + OVERHEAD_WARMUP)
    marks, calls, records, model_ms = _marks(s.settings, turns)
    net = latency_summary([t.seen - t.posted - model_ms[t.turn] / 1000 for t in turns])
    return {**latency_summary([t.seen - t.posted for t in turns]),
            "model_ms_per_turn": round(statistics.median(model_ms[t.turn] for t in turns), 2),
            "net_of_model_ms": {k: net[k] for k in ("p50_ms", "p90_ms", "p99_ms")},
            "hops_ms": _hops(marks, TURN_CHAIN),
            "model_calls_per_turn": statistics.median(calls.values()) if calls else None,
            "agent_records_per_turn": statistics.median(records.values()) if records else None,
            "cpu_ms_per_turn": cpu,
            "note": "sequential: one turn at a time, each in a new conversation; cpu includes "
                    "opening the conversation and the SSE stream; model_ms_per_turn: the "
                    "turn's model calls as the engine waited for them (the simulator's HTTP "
                    "exchange at 0 ms latency); net_of_model_ms: each turn's latency less its "
                    "own model time, what Voice adds",
            "wall_s_turns": round(wall, 2), "stack": s.describe()}


# --- turn.sustained --------------------------------------------------------------------------


@dataclass
class _Participant:
    conversation: str
    cursor: int = 1
    turns: list[str] = field(default_factory=list)
    replies_seen: Counter[str] = field(default_factory=Counter)
    events_seen: Counter[int] = field(default_factory=Counter)
    ended: dict[str, str] = field(default_factory=dict)


async def _sse_events(client: httpx.AsyncClient, url: str, p: _Participant,
                      headers: dict[str, str]) -> Any:
    """The conversation's SSE events forever, reconnecting after ``p.cursor`` at each end."""
    while True:
        async with client.stream("GET", f"{url}/me/conversations/{p.conversation}/stream",
                                 params={"after": p.cursor}, headers=headers) as resp:
            resp.raise_for_status()
            event, eid = None, None
            async for line in resp.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("id:"):
                    eid = int(line[3:].strip())
                elif line.startswith("data:"):
                    data = json.loads(line[5:])
                elif line == "" and event is not None:
                    if eid is not None:
                        p.events_seen[eid] += 1
                        p.cursor = max(p.cursor, eid)
                    yield event, data
                    event, eid = None, None


async def _participant(client: httpx.AsyncClient, url: str, headers: dict[str, str],
                       p: _Participant, todo: list[int], latencies: list[float]) -> None:
    stream = _sse_events(client, url, p, headers)
    try:
        while todo:
            i = todo.pop()
            t0 = time.perf_counter()
            r = await _post(client, url, p.conversation, headers, f"{TEXT} ({i})")
            r.raise_for_status()
            turn = r.json()["turn"]
            p.turns.append(turn)

            async def until_done(stream: Any = stream, turn: str = turn) -> None:
                async for event, data in stream:
                    if event == "message" and data.get("role") == "agent":
                        p.replies_seen[data.get("turn", "")] += 1
                    elif event == "turn" and data.get("state") in TERMINAL:
                        p.ended[data["turn"]] = data["state"]
                        if data["turn"] == turn:
                            return

            try:
                await asyncio.wait_for(until_done(), TURN_TIMEOUT_S)
                latencies.append(time.perf_counter() - t0)
            except TimeoutError:  # counted below, from the log
                stream = _sse_events(client, url, p, headers)
    finally:
        await stream.aclose()


def _replies_in_log(settings: Any, conversations: set[str]) -> tuple[dict[str, set[int]], int]:
    """Per turn, the seqs of its ReplyRecorded on the conversation log; and records read again
    (same conversation and seq twice: a redelivery, which readers dedupe)."""
    seqs: dict[str, set[int]] = defaultdict(set)
    copies: Counter[tuple[str, int]] = Counter()
    for msg in read_topic(settings, topic_name(settings, CONVERSATIONS)):
        if msg.key() is None or msg.key().decode() not in conversations:
            continue
        env = decode(msg.key(), msg.value(), msg.headers())
        if isinstance(env.record, ReplyRecorded):
            seqs[env.record.turn].add(env.seq)
            copies[(env.key, env.seq or 0)] += 1
    return seqs, sum(n - 1 for n in copies.values() if n > 1)


def outcomes(settings: Any, parts: list[_Participant]) -> Result:
    """What went wrong in a sustained run, counted from the conversation log and from what the
    clients saw: replies lost or recorded twice, events seen twice, turns that did not end."""
    seqs, redelivered = _replies_in_log(settings, {p.conversation for p in parts})
    states: Counter[str] = Counter()
    lost = duplicated = seen_twice = unfinished = 0
    for p in parts:
        for turn in p.turns:
            state = p.ended.get(turn)
            states[state or "unfinished"] += 1
            unfinished += state is None
            if state == "Replied" and not seqs.get(turn):
                lost += 1  # the turn said Replied but no reply is on the log
            elif state is None and not seqs.get(turn):
                lost += 1  # never ended within the timeout, and no reply on the log
            if len(seqs.get(turn, ())) > 1:
                duplicated += 1  # recorded twice under different seqs
            if p.replies_seen[turn] > 1:
                seen_twice += 1
    dup_events = sum(c - 1 for p in parts for c in p.events_seen.values() if c > 1)
    return {"lost_replies": lost, "duplicated_replies": duplicated,
            "replies_seen_twice_by_a_client": seen_twice, "sse_events_seen_twice": dup_events,
            "reply_records_redelivered": redelivered, "unfinished_turns": unfinished,
            "turn_states": dict(states)}


async def _sustained_run(s: Stack, h: dict[str, str], turns: int, concurrency: int
                         ) -> tuple[float, list[_Participant], list[float]]:
    async with _client(connections=2 * concurrency + 8, timeout=60) as client:
        parts = [_Participant(await _conversation(client, s.edge_url, h))
                 for _ in range(concurrency)]
        todo = list(range(turns))
        latencies: list[float] = []
        t0 = time.perf_counter()
        await asyncio.gather(*(_participant(client, s.edge_url, h, p, todo, latencies)
                               for p in parts))
        return time.perf_counter() - t0, parts, latencies


@benchmark("turn.sustained", baseline="kafka.turn_chain_sustained", compare=("turns_per_s",))
def turns_sustained(ctx: Context) -> Result:
    """Turns/s with concurrent SSE participants; lost and duplicated replies counted."""
    s = stack(ctx)
    h = _headers(ctx, "bench-sustained")
    asyncio.run(_sustained_run(s, h, SUSTAINED_WARMUP, SUSTAINED_CONCURRENCY))  # unmeasured
    idle = _idle_cpu(s)
    marks0, cpu0, asked0 = s.watermarks(), s.cpu(), reading(ctx.broker_requests)
    elapsed, parts, latencies = asyncio.run(
        _sustained_run(s, h, BenchSettings().sustained_turns, SUSTAINED_CONCURRENCY))
    cpu1, asked1, marks1 = s.cpu(), reading(ctx.broker_requests), s.watermarks()
    n = sum(len(p.turns) for p in parts)
    app = worker_group(s.settings) + "-"
    written = {t.removeprefix(s.settings.topic_prefix).removeprefix(app):
               marks1[t] - marks0.get(t, 0) for t in marks1 if marks1[t] - marks0.get(t, 0) > 0}
    total = sum(written.values())
    return {
        "turns": n, "seconds": round(elapsed, 3), "turns_per_s": round(n / elapsed, 1),
        "concurrency": SUSTAINED_CONCURRENCY,
        **outcomes(s.settings, parts),
        "turn_latency": latency_summary(latencies) if latencies else None,
        "records_per_s": round(total / elapsed, 1),
        "records_per_turn": round(total / n, 2),
        "records_per_turn_by_topic": {t: round(v / n, 2) for t, v in sorted(written.items())},
        "cpu_ms_per_turn": _cpu_delta(cpu0, cpu1, n),
        "broker_requests_per_turn": per_unit(asked0, asked1, n),
        "idle_cpu_ms_per_s": idle,
        "rss_mib_after": s.rss_mib(),
        "stack": s.describe(),
    }


IDLE_SECONDS = 10.0
"""How long ``turn.sustained`` watches the stack with nothing to do (after its warm-up)."""


def _idle_cpu(s: Stack) -> dict[str, float | None]:
    """CPU milliseconds per second each process uses while no turn runs: the stack's floor
    (idle fetches, heartbeats, commits, timers), which ``cpu_ms_per_turn`` also holds."""
    time.sleep(1.0)  # the warm-up's last records settle
    before = s.cpu()
    time.sleep(IDLE_SECONDS)
    return _cpu_delta(before, s.cpu(), IDLE_SECONDS)
