"""History summaries on a real broker, for both products, with a small
``VOICE_HISTORY_TOKEN_BUDGET``: a conversation of a dozen turns crosses the budget at least
twice; each summary is recorded once on the conversation's log, through a seq that only grows,
made from the previous summary (never the whole history again); the turns between reuse it
(fewer compaction calls than turns); and every turn reads its summary and *every* message and
reply after it — nothing left out unsummarised.

The worker gets its commands straight on ``voice.commands`` (no edge), one turn at a time.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable

import pytest

from consumers.conversations.transcript import reference_from
from schemas.assistant import (
    AssistantChat,
    AssistantHistorySummarised,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    ChatOptions,
)
from schemas.conversation import (
    HistorySummarised,
    MessageRecorded,
    ReplyRecorded,
    SendMessage,
    StartConversation,
    TurnOpened,
    TurnRequested,
    TurnStateChanged,
)
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope, decode, unfolded
from streams.producer import RecordProducer
from streams.sealing import sealer_for
from streams.settings import VoiceSettings
from streams.topics import AGENT, ASSISTANT, COMMANDS, CONVERSATIONS, WORKFLOWS, topic_name
from tests.support import read_all, wait_for

pytestmark = pytest.mark.integration

TURNS = 12
BUDGET = "600"
"""Tokens: about three exchanges of these messages and the simulator's replies."""


def message(n: int) -> str:
    return (f"Point {n}: the streetlights on Elm Street are out again and the crossing near "
            f"the school is dark in the evening; please look at lamp {n} and the one after it.")


def send(settings: VoiceSettings, *records: object, key: str) -> None:
    async def go() -> None:
        p = RecordProducer(settings)
        for rec in records:
            await p.send(topic_name(settings, COMMANDS),
                         Envelope(record=rec, key=key, source="/test"))
        p.close()

    asyncio.run(go())


def log_of(settings: VoiceSettings, spec: object, key: str) -> list[Envelope]:
    envs = [part for m in read_all(settings, topic_name(settings, spec))
            if m.key() == key.encode() for part in unfolded(decode(m.key(), m.value(),
                                                                   m.headers()))]
    return sorted((e for e in envs if e.seq is not None), key=lambda e: e.seq or 0)


def started(settings: VoiceSettings, kind: str, conversation: str) -> list[dict]:
    """Inputs of the turn workflows of ``conversation``, by turn."""
    out = {}
    for m in read_all(settings, topic_name(settings, WORKFLOWS)):
        env = decode(m.key(), m.value(), m.headers())
        rec = env.record
        if (isinstance(rec, WorkflowStarted) and rec.kind == kind
                and rec.input.get("conversation") == conversation):
            out[rec.workflow] = rec.input
    return [out[k] for k in sorted(out, key=lambda t: int(t.rsplit("-", 1)[1]))]


def positions(log: list[Envelope], inp: dict) -> dict:
    """What a turn of ``inp`` read: the positions its input names, or those its opening
    record (which its input names) names."""
    ref = inp["history"]
    if "opened" not in ref:
        return ref
    seq, offset = ref["opened"]
    [opened] = [e for e in log if e.seq == seq and isinstance(e.record, TurnOpened)]
    return reference_from(opened, ref["partition"], offset)


def compaction_calls(settings: VoiceSettings, conversation: str) -> int:
    """History compaction calls of the conversation's turns (the assistant's pattern
    extraction, ``{turn}:extract``, calls the compaction agent too: not counted)."""
    turn = re.compile(rf"{re.escape(conversation)}:turn-\d+")
    return sum(1 for m in read_all(settings, topic_name(settings, AGENT))
               if turn.fullmatch((m.key() or b"").decode())
               and (env := decode(m.key(), m.value(), m.headers())).type
               in ("voice.agent.model_call.v1", "voice.agent.model_call.v2")
               and env.record.agent_name == "compaction")


def check(log: list[Envelope], summary_type: type, entry_types: tuple[type, ...],
          reads: list[tuple[int | None, list[int], int, int]], calls: int) -> None:
    """``reads``: per turn (summary seq or None, entry seqs, omitted_through, request seq)."""
    sealer_through = {e.seq: e.record.through_seq for e in log
                      if isinstance(e.record, summary_type)}
    throughs = list(sealer_through.values())
    assert len(throughs) >= 2, f"the budget was crossed {len(throughs)} time(s)"
    assert throughs == sorted(set(throughs)), "each summary covers through a later seq"
    assert calls == len(throughs), "every summary made is recorded, and none made twice"
    assert calls <= TURNS // 2, "a stored summary is reused by the turns after it"
    entries = [e.seq for e in log if isinstance(e.record, entry_types)]
    for summary_seq, read, omitted, request in reads:
        through = sealer_through[summary_seq] if summary_seq is not None else 0
        assert omitted == 0
        assert read == [s for s in entries if through < s < request], (summary_seq, read)


def test_participant_turns_store_reuse_and_update_summaries(
        settings: VoiceSettings, start_worker: Callable[..., object]) -> None:
    start_worker(VOICE_HISTORY_TOKEN_BUDGET=BUDGET, VOICE_QUOTA_TENANT_TOKENS_PER_DAY="0")
    cnv = f"cnv-{uuid.uuid4().hex[:16]}"
    sealer = sealer_for(settings)
    send(settings, StartConversation(conversation=cnv, owner="alice"), key=cnv)
    for n in range(TURNS):
        mid = f"m{n}"
        send(settings, SendMessage(conversation=cnv, message_id=mid,
                                   text=sealer.seal(cnv, mid, message(n))), key=cnv)

        def ended(n: int = n) -> bool:
            log = log_of(settings, CONVERSATIONS, cnv)
            turns = [e.record.turn for e in log if isinstance(e.record, TurnRequested)]
            return len(turns) == n + 1 and any(
                isinstance(e.record, TurnStateChanged) and e.record.turn == turns[-1]
                and e.record.state != "Thinking" for e in log)

        wait_for(ended, timeout=120, what=f"turn {n} to end")
    log = log_of(settings, CONVERSATIONS, cnv)
    assert [e.record.state for e in log if isinstance(e.record, TurnStateChanged)
            and e.record.state != "Thinking"] == ["Replied"] * TURNS
    reads = [(h["summary"][0] if h["summary"] else None, [p[0] for p in h["entries"]],
              h["omitted_through"], inp["message_seq"] + 1)
             for inp in started(settings, "conversation-turn", cnv) for h in [positions(log, inp)]]
    assert len(reads) == TURNS
    check(log, HistorySummarised, (MessageRecorded, ReplyRecorded), reads,
          compaction_calls(settings, cnv))
    summaries = [e.record for e in log if isinstance(e.record, HistorySummarised)]
    for prev, nxt in zip(summaries, summaries[1:], strict=False):
        # the simulator's summary starts with what it read: the previous summary first
        text = sealer.open_text(cnv, nxt.summary_id, nxt.text)
        assert f"[CONVERSATION SUMMARY through seq {prev.through_seq}]" in text


def test_assistant_turns_store_reuse_and_update_summaries(
        settings: VoiceSettings, start_worker: Callable[..., object]) -> None:
    start_worker(VOICE_HISTORY_TOKEN_BUDGET=BUDGET, VOICE_QUOTA_TENANT_TOKENS_PER_DAY="0")
    cnv = str(uuid.uuid4())
    sealer = sealer_for(settings)
    for n in range(TURNS):
        mid = f"msg-{n}"
        send(settings, AssistantChat(
            conversation=cnv, owner="alice", create=n == 0, message_id=mid,
            request=sealer.seal_json(cnv, mid, {"message": message(n)}),
            options=ChatOptions(data_isolation=True)), key=cnv)

        def ended(n: int = n) -> bool:
            return sum(isinstance(e.record, AssistantTurnEnded)
                       for e in log_of(settings, ASSISTANT, cnv)) == n + 1

        wait_for(ended, timeout=120, what=f"turn {n} to end")
    log = log_of(settings, ASSISTANT, cnv)
    assert [e.record.state for e in log if isinstance(e.record, AssistantTurnEnded)] == \
        ["Replied"] * TURNS
    reads = [(ref["summary"][0][0] if ref["summary"] else None,
              [p[0] for p in ref["transcript"]], ref["omitted_through"], ref["request"][0])
             for inp in started(settings, "assistant-turn", cnv) for ref in [inp["log"]]]
    assert len(reads) == TURNS
    check(log, AssistantHistorySummarised, (AssistantTurnRequested, AssistantReplyRecorded),
          reads, compaction_calls(settings, cnv))
    summaries = [e.record for e in log if isinstance(e.record, AssistantHistorySummarised)]
    for prev, nxt in zip(summaries, summaries[1:], strict=False):
        text = sealer.open_text(cnv, nxt.summary_id, nxt.text)
        assert f"[CONVERSATION SUMMARY through seq {prev.through_seq}]" in text
