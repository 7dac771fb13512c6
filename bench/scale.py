"""Scale-out figures (issue 14): more worker processes, and an edge's start with a long log.

* ``scale.one_worker`` (baseline) and ``scale.workers``: sustained turns (as ``turn.sustained``:
  32 participants, each holding its SSE stream, simulator at 0 ms) on a stack of its own whose
  topics have ``PARTITIONS`` partitions, with 1 worker process, then 2, then 3. Each stack is
  fresh (its own topics and groups), so a run never inherits the previous one's state. The
  figure is turns per CPU-second of the processes that do the work (edge, workers, broker):
  how much each added worker costs, not how much it adds — on 2 cores, more processes cannot
  add throughput, they can only share it. ``scale.workers`` reports the worst of 2 and 3
  workers beside the one-worker baseline of the same run, and every count in ``by_workers``.
  0 lost and 0 duplicated replies are counted (``bench.turns.outcomes``), not assumed.
* ``edge.start_empty`` (baseline) and ``edge.start_with_history``: an edge process started on
  topics with no records, then on topics holding ``VOICE_BENCH_HISTORY`` (default 1,000,000)
  conversation records as the sequencer writes them, each of their turns' workflow records
  on ``voice.workflows`` as the workflow runtime writes them (four a turn), and an assistant
  chat for every ``CHAT_EVERY``-th conversation on ``voice.assistant`` (not counted in the
  conversation records); time from spawn to ``/readyz`` 200 and the edge's RSS once ready. No
  worker runs: the edge only reads.
* ``edge.start_windowed``: the same log, the edge started with ``VOICE_EDGE_HISTORY_S``
  (decision 0011: it reads only the recent part and an old conversation when asked for);
  beside the ready time and RSS, ``cold_open``: the first open of ``COLD_OPENS`` old
  conversations' streams, each read from the log then, and ``chat_cold_open``: the same for
  old assistant chats; ``owners``: ``voice owners backfill`` on the log beside a plain read of
  it, and the history's one owner listing their conversations (decision 0015).
"""

from __future__ import annotations

import asyncio
import base64
import os
import random
import shutil
import statistics
import time
from dataclasses import dataclass
from typing import Any

import httpx
from confluent_kafka import Producer

from bench.harness import Context, Result, benchmark, latency_summary, ratio
from bench.settings import BenchSettings
from bench.stack import BENCH_QUOTAS, Stack, cpu_seconds, rss_kib, stack_settings, start_stack
from bench.turns import _cpu_delta, _headers, _sustained_run, outcomes
from deploy.kafka_local import free_port
from deploy.owners import backfill
from deploy.processes import spawn_voice, stop, wait_http_ready
from schemas.assistant import (
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    DisplayPayload,
)
from schemas.base import Record, Sealed
from schemas.conversation import (
    ConversationStarted,
    MessageRecorded,
    ReplyRecorded,
    TurnRequested,
    TurnStateChanged,
)
from schemas.workflow import LastStepSucceeded, StepStarted, WorkflowStarted
from streams.envelope import Envelope, encode
from streams.ids import new_assistant_conversation_id, new_conversation_id, turn_id
from streams.producer import PRODUCER_CONFIG
from streams.reading import read_batches
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import ASSISTANT, CONVERSATIONS, WORKFLOWS, create_topics, topic_name

PARTITIONS = 12
WORKER_COUNTS = (2, 3)
"""Worker processes of ``scale.workers``, beside the baseline's one."""
SCALE_WARMUP = 200
SCALE_CONCURRENCY = 32
HISTORY = int(os.environ.get("VOICE_BENCH_HISTORY", "1000000"))
TURNS_PER_CONVERSATION = 2
"""A conversation of the history: started, then this many turns of five records each
(message, turn requested, thinking, reply, replied)."""
RECORDS_PER_CONVERSATION = 1 + 5 * TURNS_PER_CONVERSATION
CIPHERTEXT_BYTES = 80
"""As ``bench.kafka_baseline``: a short sealed message (a record's value is ~300 bytes)."""
WINDOW_S = 600.0
"""``VOICE_EDGE_HISTORY_S`` of the windowed edge: every history record is older (the history
ends an hour ago), and no view is evicted while the figure runs."""
COLD_OPENS = 10
"""Old conversations whose streams are opened once each edge is ready (spread over the
history), and as many of the most recent ones (``cold_open_recent``)."""
HISTORY_DAYS = 90.0
"""The history's conversations were made evenly over this many days, ending an hour ago (their
ids and record times say so): an edge reads a cold conversation from its id's time on."""
EDGE_READY_TIMEOUT_S = 600.0
"""Generous: the edge reads the whole log before it is ready (the thing measured)."""
TENANT = "default"
OWNER = "bench-history"
CHAT_EVERY = 4
"""Every this-many-th conversation of the history comes with an assistant chat."""
CHAT_DISPLAY_EVENTS = 8
"""Display events an assistant turn of the history records (busy, text, cost, idle, done…)."""


# --- scale.one_worker / scale.workers ---------------------------------------------------------


def _worker_run(ctx: Context, workers: int) -> Result:
    """Sustained turns on a fresh ``PARTITIONS``-partition stack with ``workers`` workers,
    none pinned: more workers than the cores can give each a core of its own (decision 0017)
    would put two workers' Python on one, and the row compares like with like."""
    st = start_stack(ctx, f"scale{workers}", workers=workers, partitions=PARTITIONS,
                     pin=False)
    try:
        return _measure(ctx, st, workers)
    finally:
        st.close()


def _measure(ctx: Context, st: Stack, workers: int) -> Result:
    h = _headers(ctx, f"bench-scale{workers}")
    asyncio.run(_sustained_run(st, h, SCALE_WARMUP, SCALE_CONCURRENCY))  # unmeasured
    cpu0 = st.cpu()
    elapsed, parts, _latencies = asyncio.run(
        _sustained_run(st, h, BenchSettings().scale_turns, SCALE_CONCURRENCY))
    cpu1 = st.cpu()
    n = sum(len(p.turns) for p in parts)
    working = [name for name in cpu1 if name == "edge" or name == "broker"
               or name.startswith("worker")]
    spent = {name: (cpu1[name] or 0.0) - (cpu0[name] or 0.0) for name in working
             if cpu1[name] is not None and cpu0[name] is not None}
    cpu_s = sum(spent.values())
    return {
        "workers": workers, "turns": n, "seconds": round(elapsed, 3),
        "turns_per_s": round(n / elapsed, 1),
        "cpu_s": round(cpu_s, 2),
        "turns_per_cpu_s": round(n / cpu_s, 2) if cpu_s else None,
        "cpu_counted": sorted(spent),
        "cpu_ms_per_turn": _cpu_delta(cpu0, cpu1, n),
        **outcomes(st.settings, parts),
        "stack": st.describe(),
    }


def _check(result: Result) -> None:
    """A run that lost or duplicated a reply is no figure."""
    if result["lost_replies"] or result["duplicated_replies"]:
        raise RuntimeError(f"{result['workers']} workers: {result['lost_replies']} lost, "
                           f"{result['duplicated_replies']} duplicated replies")


@benchmark("scale.one_worker")
def one_worker(ctx: Context) -> Result:
    """Sustained turns per CPU-second with 1 worker on 12 partitions (scale-out baseline)."""
    result = _worker_run(ctx, 1)
    _check(result)
    return result


@benchmark("scale.workers", baseline="scale.one_worker",
           compare=("turns_per_cpu_s", "turns_per_s"))
def more_workers(ctx: Context) -> Result:
    """Sustained turns per CPU-second with 2 and 3 workers on 12 partitions (the worst)."""
    runs = {str(n): _worker_run(ctx, n) for n in WORKER_COUNTS}
    for r in runs.values():
        _check(r)
    worst = min(runs.values(), key=lambda r: r["turns_per_cpu_s"] or 0.0)
    # One worker again, last: the baseline ran first on a colder broker and machine; if this
    # one differs from it as much as the figure does, the difference is drift, not workers.
    again = _worker_run(ctx, 1)
    _check(again)
    return {
        "turns_per_cpu_s": worst["turns_per_cpu_s"], "turns_per_s": worst["turns_per_s"],
        "worst_workers": worst["workers"],
        "lost_replies": sum(r["lost_replies"] for r in runs.values()),
        "duplicated_replies": sum(r["duplicated_replies"] for r in runs.values()),
        "by_workers": runs,
        "one_worker_again": {k: again[k] for k in ("turns_per_s", "turns_per_cpu_s",
                                                   "cpu_ms_per_turn", "lost_replies",
                                                   "duplicated_replies")},
        "ratio_to_one_worker_again": ratio(worst["turns_per_cpu_s"] or 0.0,
                                           again["turns_per_cpu_s"] or 0.0),
        "note": f"{os.cpu_count()} cores: more worker processes share the same cores, so "
                "turns/s cannot grow with them; turns per CPU-second (edge + workers + "
                "broker) is the figure — what scaling out costs. The broker's JIT warms over "
                "the run (its CPU a turn falls by a third), so run a chain first "
                "(--only kafka.turn_chain_sustained,scale.one_worker,scale.workers) and read "
                "ratio_to_one_worker_again beside the ratio",
    }


# --- edge.start_empty / edge.start_with_history ---------------------------------------------


def _sealed(rng: random.Random) -> Sealed:
    return Sealed(key_version=1, nonce=base64.b64encode(rng.randbytes(12)).decode(),
                  ciphertext=base64.b64encode(rng.randbytes(CIPHERTEXT_BYTES)).decode())


def conversation_records(conversation: str, rng: random.Random) -> list[Record]:
    """One conversation's log as the sequencer appends it (seq = position + 1): started, then
    ``TURNS_PER_CONVERSATION`` turns that each end ``Replied``."""
    out: list[Record] = [ConversationStarted(conversation=conversation, owner=OWNER)]
    for t in range(TURNS_PER_CONVERSATION):
        msg_seq = 2 + 5 * t
        turn = turn_id(conversation, msg_seq)
        out += [
            MessageRecorded(conversation=conversation, message_id=rng.randbytes(16).hex(),
                            text=_sealed(rng), at="2026-06-01T12:00:00.000000+00:00"),
            TurnRequested(conversation=conversation, turn=turn, message_seq=msg_seq),
            TurnStateChanged(conversation=conversation, turn=turn, state="Thinking"),
            ReplyRecorded(conversation=conversation, turn=turn,
                          reply_id=rng.randbytes(16).hex(), text=_sealed(rng)),
            TurnStateChanged(conversation=conversation, turn=turn, state="Replied"),
        ]
    return out


def turn_workflow_records(conversation: str) -> list[tuple[str, Record, int | None]]:
    """(workflow, record, seq) of each turn's workflow of ``conversation_records``, as the
    runtime writes a one-step workflow that replies: started, its step and its end (a turn's
    step outcome is applied where it ran, with no record of its own)."""
    out: list[tuple[str, Record, int | None]] = []
    for t in range(TURNS_PER_CONVERSATION):
        msg_seq = 2 + 5 * t
        turn = turn_id(conversation, msg_seq)
        done = {"state": "Replied", "reply_id": f"{turn}:reply"}
        out += [
            (turn, WorkflowStarted(workflow=turn, kind="conversation-turn", input={
                "conversation": conversation, "turn": turn, "message_seq": msg_seq,
                "tenant": TENANT, "history": {"partition": 0, "opened": [msg_seq, 0]}}), 1),
            (turn, StepStarted(workflow=turn, step="reply", attempt=1,
                               lease_until="2026-06-01T12:05:00+00:00", worker="bench"), 2),
            (turn, LastStepSucceeded(workflow=turn, step="reply", attempt=1, output=done), 3),
        ]
    return out


def chat_records(chat: str, rng: random.Random) -> list[Record]:
    """One assistant chat's log as its sequencer appends it (seq = position + 1): started,
    then ``TURNS_PER_CONVERSATION`` turns of a request, ``CHAT_DISPLAY_EVENTS`` display
    events, the reply and the turn's end."""
    out: list[Record] = [AssistantConversationStarted(conversation=chat, owner=OWNER)]
    display = 0
    for _ in range(TURNS_PER_CONVERSATION):
        turn = turn_id(chat, len(out) + 1)
        out.append(AssistantTurnRequested(
            conversation=chat, turn=turn, message_id=rng.randbytes(16).hex(),
            request=_sealed(rng), after=display, at="2026-06-01T12:00:00.000000+00:00"))
        for n in range(CHAT_DISPLAY_EVENTS):
            display += 1
            out.append(AssistantDisplayRecorded(
                conversation=chat, turn=turn, display_seq=display, event=DisplayPayload(
                    event_id=f"{turn}/a1/d{n + 1}", type="text_delta", channel="chat",
                    message_id=turn, ts=1.78e9, data=_sealed(rng))))
        out += [AssistantReplyRecorded(conversation=chat, turn=turn,
                                       reply_id=rng.randbytes(16).hex(), chain=_sealed(rng),
                                       cards=_sealed(rng)),
                AssistantTurnEnded(conversation=chat, turn=turn, state="Replied")]
    return out


def produce_history(bootstrap: str, topic: str, records: int, seed: int = 14,
                    workflows_topic: str | None = None, chats_topic: str | None = None
                    ) -> tuple[int, list[str], int, list[str]]:
    """Produce about ``records`` conversation records (whole conversations, the real envelope
    and encoder) onto ``topic``, made evenly over ``HISTORY_DAYS`` (ids and record times), and
    their turns' workflow records onto ``workflows_topic`` and an assistant chat for every
    ``CHAT_EVERY``-th onto ``chats_topic`` when given (neither counted in ``records``);
    returns how many conversation records were produced (all acked) and a sample of the
    conversation ids, spread over the history, then the ``COLD_OPENS`` most recent; then the
    same of the chats (records, sample spread over the history)."""
    rng = random.Random(seed)
    producer = Producer({**PRODUCER_CONFIG, "bootstrap.servers": bootstrap,
                         "linger.ms": 20, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000})
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    def send(topic: str, env: Envelope, at_ms: int) -> None:
        key, value, headers = encode(env)
        while True:
            try:
                producer.produce(topic, value, key, headers=headers, timestamp=at_ms,
                                 on_delivery=on_delivery)
                return
            except BufferError:  # the local queue is full: let it drain
                producer.poll(0.05)

    def send_log(topic: str, key: str, source: str, records: list[Record], made_s: float
                 ) -> int:
        """One aggregate's log as its sequencer appends it (seq = position + 1), each record
        a millisecond after the one before from ``made_s``; how many were sent."""
        for seq, rec in enumerate(records, start=1):
            send(topic, Envelope(record=rec, key=key, source=source, seq=seq, tenant=TENANT,
                                 subject=key), int(made_s * 1000) + seq)
        return len(records)

    produced = chats = 0
    total = max(1, records // RECORDS_PER_CONVERSATION)
    every = max(1, total // COLD_OPENS)
    sample: list[str] = []
    chat_sample: list[str] = []
    end_s = time.time() - 3600
    step_s = HISTORY_DAYS * 86400 / total
    for i in range(total):
        made_s = end_s - (total - i) * step_s
        conversation = new_conversation_id(now=made_s)
        if i % every == 0 and len(sample) < COLD_OPENS:
            sample.append(conversation)
        if i >= total - COLD_OPENS:
            sample.append(conversation)
        produced += send_log(topic, conversation, "/voice/sequencer",
                             conversation_records(conversation, rng), made_s)
        if workflows_topic is not None:
            for n, (workflow, rec, seq) in enumerate(turn_workflow_records(conversation)):
                send(workflows_topic, Envelope(
                    record=rec, key=workflow, source="/voice/worker", seq=seq, tenant=TENANT,
                    subject=workflow, id=f"{workflow}:{n}"), int(made_s * 1000) + n)
        if chats_topic is not None and i % CHAT_EVERY == 0:
            chat = new_assistant_conversation_id(now=made_s)
            if (i // CHAT_EVERY) % max(1, total // CHAT_EVERY // COLD_OPENS) == 0 \
                    and len(chat_sample) < COLD_OPENS:
                chat_sample.append(chat)
            chats += send_log(chats_topic, chat, "/voice/assistant", chat_records(chat, rng),
                              made_s)
        producer.poll(0)
    left = producer.flush(300)
    if left or failed:
        raise RuntimeError(f"history: {left} records unsent, {len(failed)} failed "
                           f"({failed[:3]})")
    return produced, sample, chats, chat_sample


@dataclass(frozen=True)
class History:
    """The run's history topics, made once and read by both history figures."""

    settings: VoiceSettings
    records: int
    sample: list[str]
    """Some conversation ids: spread over the history, then the most recent."""
    produce_s: float
    chat_records: int
    chat_sample: list[str]
    """Some assistant chat ids, spread over the history."""


_HISTORY: dict[str, History] = {}


def _history(ctx: Context) -> History:
    if ctx.run_id not in _HISTORY:
        settings = stack_settings(ctx, "history")
        create_topics(settings)
        t0 = time.perf_counter()
        produced, sample, chats, chat_sample = produce_history(
            settings.bootstrap, topic_name(settings, CONVERSATIONS), HISTORY,
            workflows_topic=topic_name(settings, WORKFLOWS),
            chats_topic=topic_name(settings, ASSISTANT))
        produce_s = time.perf_counter() - t0
        ctx.log(f"  {produced} history records (and {chats} of chats) produced in "
                f"{produce_s:.1f} s")
        _HISTORY[ctx.run_id] = History(settings, produced, sample, produce_s, chats,
                                       chat_sample)
    return _HISTORY[ctx.run_id]


def _cold_open(settings: VoiceSettings, url: str, streams: list[tuple[str, int]]) -> list[float]:
    """Seconds to the answer's head of each stream (path, cursor: its last event — the
    ownership check, and on a windowed edge the conversation's read from the log)."""
    token = mint_token(settings, OWNER, "participant", TENANT)
    out: list[float] = []
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"}) as client:
        for path, after in streams:
            t0 = time.perf_counter()
            with client.stream("GET", f"{url}{path}", params={"after": after}) as r:
                if r.status_code != 200:
                    raise RuntimeError(f"{path} answered {r.status_code}")
                out.append(time.perf_counter() - t0)
    return out


def _conversation_streams(conversations: list[str]) -> list[tuple[str, int]]:
    return [(f"/me/conversations/{cnv}/stream", RECORDS_PER_CONVERSATION)
            for cnv in conversations]


def _chat_streams(chats: list[str]) -> list[tuple[str, int]]:
    return [(f"/api/v1/assistant/conversations/{chat}/stream",
             TURNS_PER_CONVERSATION * CHAT_DISPLAY_EVENTS) for chat in chats]


def _owners_list(settings: VoiceSettings, url: str) -> Result:
    """The index by owner on the history (decision 0015): ``voice owners backfill`` beside a
    plain read of the same log (its baseline), then the history's owner listing their
    conversations on the windowed edge — the first list reads all of their entries from the
    index's partition, the next is answered from memory."""
    t0 = time.perf_counter()
    read = sum(len(batch) for batch in read_batches(
        settings, topic_name(settings, CONVERSATIONS), timeout=600))
    read_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    done = backfill(settings)
    backfill_s = time.perf_counter() - t0
    token = mint_token(settings, OWNER, "participant", TENANT)
    lists: list[float] = []
    listed = None
    with httpx.Client(timeout=120, headers={"Authorization": f"Bearer {token}"}) as client:
        for _ in range(3):
            t0 = time.perf_counter()
            r = client.get(f"{url}/me/conversations")
            lists.append(time.perf_counter() - t0)
            if r.status_code != 200:
                raise RuntimeError(f"GET /me/conversations answered {r.status_code}: {r.text}")
            listed = len(r.json())
    return {"backfill_s": round(backfill_s, 2), "indexed": done.indexed,
            "log_records_read": done.read, "plain_read_s": round(read_s, 2),
            "plain_read_records": read,
            "backfill_ratio_to_plain_read": ratio(backfill_s, read_s),
            "first_list_ms": round(lists[0] * 1000, 1),
            "list_again_ms": round(statistics.median(lists[1:]) * 1000, 1),
            "entries_of_the_owner": done.indexed,
            "listed": listed,
            "note": "every history conversation has one owner, so the first list reads all "
                    "their entries (one partition); only the conversations the edge holds are "
                    "listed: the history has no data keys, so the others count as erased"}


def _edge_start(ctx: Context, settings: VoiceSettings, open_cold: list[str] | None = None,
                open_chats: list[str] | None = None, list_owner: bool = False,
                **env: str) -> Result:
    """An edge spawned on ``settings``' topics: seconds to ``/readyz`` 200 and its RSS once
    ready; then, for ``open_cold``, each conversation's stream opened, for ``open_chats``
    each chat's, and the RSS after; with ``list_owner``, the index by owner backfilled and
    listed (``_owners_list``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    t0 = time.perf_counter()
    edge = spawn_voice(settings, "edge", "--port", str(port),
                       log=settings.state_dir / f"edge{port}.log", **{**BENCH_QUOTAS, **env})
    out: Result = {}
    try:
        wait_http_ready(f"{url}/readyz", timeout=EDGE_READY_TIMEOUT_S, proc=edge)
        out["ready_s"] = round(time.perf_counter() - t0, 2)
        out["rss_mib"] = round(rss_kib(edge.pid) / 1024, 1)
        cpu = cpu_seconds(edge.pid)
        out["cpu_s_to_ready"] = round(cpu, 2) if cpu is not None else None
        out["in_memory"] = httpx.get(f"{url}/readyz", timeout=10).json()["checks"].get(
            "conversations")
        ops = httpx.get(f"{url}/ops/edge", timeout=10, headers={
            "Authorization": f"Bearer {mint_token(settings, 'ops', 'operator', TENANT)}"})
        out["workflows"] = ops.json().get("workflows") if ops.status_code == 200 else None
        out["chats_in_memory"] = (ops.json().get("assistant", {}).get("in_memory")
                                  if ops.status_code == 200 else None)
        if open_cold:
            spread, recent = open_cold[:COLD_OPENS], open_cold[COLD_OPENS:]
            opened = _cold_open(settings, url, _conversation_streams(spread))
            out["cold_open"] = {**latency_summary(opened), "conversations": len(opened)}
            if recent:  # made in the last quarter hour of the history: a short read each
                opened = _cold_open(settings, url, _conversation_streams(recent))
                out["cold_open_recent"] = {**latency_summary(opened),
                                           "conversations": len(opened)}
            # The same conversations again: in memory now, whichever edge this is.
            out["open_again"] = latency_summary(_cold_open(settings, url,
                                                           _conversation_streams(spread)))
        if open_chats:
            opened = _cold_open(settings, url, _chat_streams(open_chats))
            out["chat_cold_open"] = {**latency_summary(opened), "chats": len(opened)}
        if open_cold or open_chats:
            out["rss_after_cold_opens_mib"] = round(rss_kib(edge.pid) / 1024, 1)
        if list_owner:
            out["owners"] = _owners_list(settings, url)
    finally:
        stop(edge)
    return out


@benchmark("edge.start_empty")
def start_empty(ctx: Context) -> Result:
    """An edge on empty topics: seconds to /readyz ready, and its RSS then (the floor)."""
    settings = stack_settings(ctx, "startempty")
    try:
        create_topics(settings)
        return {**_edge_start(ctx, settings), "history_records": 0,
                "topic_partitions": settings.topic_partitions}
    finally:
        _drop_state(settings)


def _drop_state(settings: VoiceSettings) -> None:
    if not BenchSettings().keep_state:
        shutil.rmtree(settings.state_dir, ignore_errors=True)


def _with_history(ctx: Context, windowed: bool) -> Result:
    history = _history(ctx)
    settings, produced = history.settings, history.records
    env = {"VOICE_EDGE_HISTORY_S": str(WINDOW_S)} if windowed else {}
    result = _edge_start(ctx, settings, history.sample, history.chat_sample,
                         list_owner=windowed, **env)
    conversations = produced // RECORDS_PER_CONVERSATION
    return {**result, "history_records": produced,
            "conversations": conversations,
            "workflow_records": conversations * len(turn_workflow_records("c")),
            "chat_records": history.chat_records,
            "history_produce_s": round(history.produce_s, 1),
            "topic_partitions": settings.topic_partitions,
            "edge_history_s": WINDOW_S if windowed else None}


@benchmark("edge.start_with_history", baseline="edge.start_empty",
           compare=("ready_s", "rss_mib"))
def start_with_history(ctx: Context) -> Result:
    """An edge reading the whole log of VOICE_BENCH_HISTORY records: ready time and RSS."""
    return _with_history(ctx, windowed=False)


@benchmark("edge.start_windowed", baseline="edge.start_empty",
           compare=("ready_s", "rss_mib"))
def start_windowed(ctx: Context) -> Result:
    """The same log, the edge with a history window (VOICE_EDGE_HISTORY_S): ready time, RSS,
    and the first open of old conversations (each read from the log on demand)."""
    try:
        return _with_history(ctx, windowed=True)
    finally:
        history = _HISTORY.pop(ctx.run_id, None)
        if history is not None:
            _drop_state(history.settings)
