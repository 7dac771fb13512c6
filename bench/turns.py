"""Figures of a participant's turn through the whole stack (issue: conversation turns).

- ``edge.post_message``: POST message → 202, at a steady rate, beside the raw produce-ack.
- ``turn.overhead``: message POSTed → reply visible on an SSE client, simulator at zero
  latency, sequential, beside the raw Kafka round trip.
- ``turn.sustained``: turns per second with concurrent participants, counting replies that
  were lost or recorded twice (read back from the raw conversation log).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter

import httpx

from api.auth import mint_token
from bench.harness import Context, Result, benchmark, latency_summary
from bench.stack import stack
from streams.envelope import decode
from streams.reading import read_topic
from streams.topics import CONVERSATIONS, topic_name

POST_RATE_PER_S = 50
POSTS = 500
OVERHEAD_TURNS = 200
SUSTAINED_TURNS = 600
SUSTAINED_CONCURRENCY = 48
TEXT = "I am worried the crossing by the school is unsafe for children. Please add a light."


def _headers(ctx: Context, sub: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(ctx.settings, sub, 'participant')}"}


async def _conversation(client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> str:
    r = await client.post(f"{url}/me/conversations", headers=headers)
    r.raise_for_status()
    return r.json()["conversation"]


@benchmark("edge.post_message", baseline="kafka.produce_ack", compare=("p50_ms", "p99_ms"))
def post_message(ctx: Context) -> Result:
    """POST /me/conversations/{c}/messages → 202 latency at a steady request rate."""
    s = stack(ctx.settings)
    h = _headers(ctx, "bench-post")

    async def main() -> list[float]:
        async with httpx.AsyncClient(timeout=30) as client:
            convs = [await _conversation(client, s.edge_url, h) for _ in range(25)]
            samples: list[float] = []

            async def one(i: int) -> None:
                t0 = time.perf_counter()
                r = await client.post(f"{s.edge_url}/me/conversations/{convs[i % 25]}/messages",
                                      headers=h, json={"text": f"{TEXT} ({i})"})
                if r.status_code != 202:
                    raise RuntimeError(f"POST answered {r.status_code}: {r.text}")
                samples.append(time.perf_counter() - t0)

            tasks = []
            start = time.perf_counter()
            for i in range(POSTS):
                await asyncio.sleep(max(0.0, start + i / POST_RATE_PER_S - time.perf_counter()))
                tasks.append(asyncio.create_task(one(i)))
            await asyncio.gather(*tasks)
            return samples

    samples = asyncio.run(main())
    return {**latency_summary(samples), "rate_per_s": POST_RATE_PER_S}


async def _reply_seen(client: httpx.AsyncClient, url: str, conv: str, headers: dict[str, str],
                      after: int, posted: asyncio.Event) -> float:
    """Hold the SSE stream; return the time the agent's reply arrived."""
    async with client.stream("GET", f"{url}/me/conversations/{conv}/stream",
                             params={"after": after}, headers=headers) as resp:
        event = None
        posted.set()
        async for line in resp.aiter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event == "message":
                if json.loads(line[5:]).get("role") == "agent":
                    return time.perf_counter()
    raise RuntimeError("stream ended without the reply")


@benchmark("turn.overhead", baseline="kafka.round_trip", compare=("p50_ms", "p99_ms"))
def turn_overhead(ctx: Context) -> Result:
    """Message POSTed → the agent's reply on an SSE client; simulator at zero latency."""
    s = stack(ctx.settings)
    h = _headers(ctx, "bench-overhead")

    async def main() -> list[float]:
        samples: list[float] = []
        async with httpx.AsyncClient(timeout=30) as client:
            for i in range(OVERHEAD_TURNS):
                conv = await _conversation(client, s.edge_url, h)
                posted = asyncio.Event()
                seen = asyncio.create_task(_reply_seen(client, s.edge_url, conv, h, 1, posted))
                await posted.wait()
                t0 = time.perf_counter()
                r = await client.post(f"{s.edge_url}/me/conversations/{conv}/messages",
                                      headers=h, json={"text": f"{TEXT} ({i})"})
                r.raise_for_status()
                samples.append(await asyncio.wait_for(seen, 30) - t0)
        return samples

    return latency_summary(asyncio.run(main()))


@benchmark("turn.sustained")
def turns_sustained(ctx: Context) -> Result:
    """Turns/s with concurrent participants; lost and duplicated replies counted from the log."""
    s = stack(ctx.settings)
    h = _headers(ctx, "bench-sustained")

    async def main() -> tuple[float, list[str]]:
        turns: list[str] = []
        async with httpx.AsyncClient(timeout=60) as client:
            convs = [await _conversation(client, s.edge_url, h)
                     for _ in range(SUSTAINED_CONCURRENCY)]
            queue = list(range(SUSTAINED_TURNS))

            async def participant(conv: str) -> None:
                while queue:
                    i = queue.pop()
                    r = await client.post(f"{s.edge_url}/me/conversations/{conv}/messages",
                                          headers=h, json={"text": f"{TEXT} ({i})"})
                    r.raise_for_status()
                    turn = r.json()["turn"]
                    turns.append(turn)
                    while True:  # poll until this turn ends, as a browser would
                        t = await client.get(
                            f"{s.edge_url}/me/conversations/{conv}/turns/{turn}", headers=h)
                        if t.status_code == 200 and t.json()["state"] != "Thinking":
                            break
                        await asyncio.sleep(0.02)

            t0 = time.perf_counter()
            await asyncio.gather(*(participant(c) for c in convs))
            return time.perf_counter() - t0, turns

    elapsed, turns = asyncio.run(main())
    replies: Counter[str] = Counter()
    for msg in read_topic(s.settings, topic_name(s.settings, CONVERSATIONS)):
        env = decode(msg.key(), msg.value(), msg.headers())
        if env.type == "voice.conversation.reply_recorded.v1":
            replies[env.record.turn] += 1  # type: ignore[attr-defined]
    lost = sum(1 for t in turns if replies[t] == 0)
    duplicated = sum(1 for t in turns if replies[t] > 1)
    return {"turns": len(turns), "seconds": round(elapsed, 3),
            "turns_per_s": round(len(turns) / elapsed, 1), "concurrency": SUSTAINED_CONCURRENCY,
            "lost_replies": lost, "duplicated_replies": duplicated}
