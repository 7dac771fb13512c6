"""History summaries are stored, reused and updated incrementally, for both products.

Seed 000 §5: a token budget; the older part summarised, the recent part raw; the cut never
between a tool call and its result. Engine tests pin the rule (reuse while it fits,
incremental input, hysteresis); then a 200-turn conversation of each product runs its real
step (participant ``Turns.reply_step``, assistant ``Assistant.reply_step``) over
``MemoryLogReader`` and the engine with a scripted model, and checks: nothing dropped without a
summary, summary calls at most one per N turns, each summary through a seq that only grows.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace
from typing import Any

from consumers.assistant.sequencer import AssistantSequencer
from consumers.assistant.transcript import TURN_KIND, Transcript
from consumers.assistant.worker import Assistant
from consumers.conversations.catalog import MemoryIssueCatalog
from consumers.conversations.concern import concern_spec, run_concern_extraction
from consumers.engine import AgentSpec, HistorySummary, RecordingSink, ToolRegistry
from consumers.engine.history import (
    choose_cut,
    estimate_tokens,
    prepare_history,
    summary_tokens,
)
from consumers.engine.model import ModelCaller
from consumers.engine.testing import ScriptedModel, text
from consumers.engine.types import Keys
from consumers.frame.logrefs import MemoryLogReader
from consumers.frame.writer import outputs
from consumers.workflows.engine import StepContext
from schemas.assistant import (
    AssistantChat,
    AssistantHistorySummarised,
    AssistantReplyRecorded,
    AssistantTurnRequested,
    ChatOptions,
)
from schemas.conversation import HistorySummarised, MessageRecorded, ReplyRecorded
from streams.assistant_settings import AssistantSettings
from streams.crashpoints import CrashPoints
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.topics import ASSISTANT, COMMANDS, CONVERSATIONS
from tests.unit.test_transcript_refs import CNV, Conversation, Out

BUDGET = 2_000
"""``VOICE_HISTORY_TOKEN_BUDGET`` of the long conversations."""
TURNS = 200
TURN_TOKENS = 150
"""A turn (message + reply) is at most this many estimated tokens (checked)."""
SUMMARY_TOKENS = 120
"""The scripted summaries are at most this many estimated tokens (checked)."""
N = int((BUDGET * 0.5 - SUMMARY_TOKENS) // TURN_TOKENS)
"""Turns at least between two summaries: a new summary leaves at most half the budget raw
(``history_raw_share``), so summary + raw part ≤ SUMMARY_TOKENS + BUDGET / 2, and the next is
needed only when the history is over BUDGET again — (BUDGET / 2 - SUMMARY_TOKENS) /
TURN_TOKENS = 5 turns later at the soonest."""

MARK = re.compile(r"<([mrS]):(\d+)>")


def spec(**kw: Any) -> AgentSpec:
    return AgentSpec("assistant", "You help.", ToolRegistry(), "claude-sonnet-4-5", **kw)


def exchanges(n: int, size: int = 400, first: int = 0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i in range(first, first + n):
        out.append({"role": "user", "content": f"<m:{i}> " + "lorem ipsum " * (size // 12)})
        out.append({"role": "assistant", "content": [{"type": "text", "text": f"<r:{i}>"}]})
    return out


def caller_of(model: ScriptedModel) -> ModelCaller:
    return ModelCaller(model, RecordingSink(), Keys("t"), "t")


# ----------------------------------------------------------------------------- the engine


def test_the_cut_leaves_at_most_the_raw_share_and_never_splits_a_tool_call() -> None:
    h = exchanges(10)  # ~124 tokens an exchange
    assert choose_cut(h, keep=8) == 12                      # by count alone: the last 8 raw
    cut = choose_cut(h, keep=8, raw_budget=240)
    assert cut == 18 and estimate_tokens(h[cut:]) <= 240    # and within the raw budget
    assert choose_cut(h, keep=8, raw_budget=10) == 18       # none fits: the last exchange
    assert choose_cut(h, keep=8, start=18) == 0             # nothing after the stored one
    chain = [{"role": "user", "content": "q"},
             {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "x",
                                                "input": {}}]},
             {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                           "content": "r" * 4000}]},
             {"role": "assistant", "content": "done"}]
    h2 = [*exchanges(2), *chain]
    # raw budget too small for the chain: still cut before it, never between call and result
    assert choose_cut(h2, keep=8, raw_budget=10) == 4


async def test_a_stored_summary_is_reused_while_it_and_what_follows_fit() -> None:
    s = spec(history_token_budget=1_000, history_recent_keep=4)
    stored = HistorySummary("<S:1> short", 8)
    history = exchanges(4)  # 8 messages, all covered
    model = ScriptedModel([[text("never")]])
    for more in range(1, 7):  # new exchanges after the summary: cuts would land elsewhere
        history = [*history, *exchanges(1, first=3 + more)]
        prepared = await prepare_history(s, history, stored, caller_of(model))
        if estimate_tokens(prepared.messages) > 1_000:
            break
        assert prepared.summary == stored and not prepared.summarised
        assert prepared.messages[0]["content"][0]["text"].endswith("<S:1> short")
        assert prepared.messages[1:] == history[9:]
    assert model.requests == [], "no compaction while the stored summary and the rest fit"


async def test_a_new_summary_is_made_from_the_previous_one_and_what_follows_only() -> None:
    s = spec(history_token_budget=1_000, history_recent_keep=8)
    history = exchanges(14)
    stored = HistorySummary("<S:1> the first four", 8)
    model = ScriptedModel([[text("<S:2> new")]])
    prepared = await prepare_history(s, history, stored, caller_of(model))
    assert prepared.summarised and prepared.summary is not None
    cut = prepared.summary.summary_through
    (request,) = model.requests
    seen = request.messages[0]["content"]
    assert seen.startswith("[PREVIOUS SUMMARY of messages 0-7]\n<S:1> the first four")
    marks = {int(n) for k, n in MARK.findall(seen) if k == "m"}
    assert marks == set(range(4, cut // 2)), "only the messages after the stored summary"
    assert estimate_tokens(history[cut:]) <= 500, "at most history_raw_share of it raw"
    assert request.max_tokens == summary_tokens(s) == 256  # a quarter of it, at least 256


# ------------------------------------------------------------------ 200 turns, both products


class Model:
    """The scripted model of a long conversation: compaction calls get a short summary
    ``<S:k>``; turns get a reply carrying the marker of the message they answer."""

    def __init__(self) -> None:
        self.compactions: list[str] = []
        self.turns: list[str] = []
        self.scripted = ScriptedModel([self.answer], repeat=True)

    def answer(self, request: Any) -> list[dict[str, Any]]:
        if "[agent: compaction]" in json.dumps(request.system):
            self.compactions.append(request.messages[0]["content"])
            summary = f"<S:{len(self.compactions)}> " + "what was said so far. " * 15
            assert estimate_tokens(summary) <= SUMMARY_TOKENS
            return [text(summary)]
        seen = json.dumps(request.messages)
        self.turns.append(seen)
        n = max(int(n) for k, n in MARK.findall(seen) if k == "m")
        return [text(reply(n))]


def message(n: int) -> str:
    return f"<m:{n}> " + "the streetlight on our corner is out again. " * 7


def reply(n: int) -> str:
    return f"<r:{n}> " + "noted, thank you. " * 8


def check(model: Model, marks: dict[str, int], summaries: list[tuple[int, str]]) -> None:
    """Nothing dropped without a summary, summaries incremental and through growing seqs,
    at most one per N turns. ``marks``: marker → seq; ``summaries``: (through, text) in log
    order."""
    turn = [{"role": "user", "content": message(TURNS)},
            {"role": "assistant", "content": [text(reply(TURNS))]}]
    assert estimate_tokens(turn) <= TURN_TOKENS
    assert len(model.turns) == TURNS
    assert len(summaries) == len(model.compactions), "every summary made was recorded"
    throughs = [t for t, _ in summaries]
    assert throughs == sorted(set(throughs)), "each summary covers through a later seq"
    assert len(summaries) <= TURNS // N, (len(summaries), N)
    assert len(summaries) >= TURNS * TURN_TOKENS // BUDGET // 4, "the budget was crossed"
    previous = 0
    for k, (through, summary) in enumerate(summaries, start=1):
        assert summary.startswith(f"<S:{k}>")
        seen = model.compactions[k - 1]
        covered = {f"{kind}:{n}" for kind, n in MARK.findall(seen) if kind != "S"}
        assert covered == {m for m, seq in marks.items() if previous < seq <= through}, k
        assert k == 1 or f"<S:{k - 1}>" in seen, "made from the previous summary"
        previous = through
    for n, seen in enumerate(model.turns):  # each turn: its summary + everything after it
        current = marks[f"m:{n}"]
        ks = [int(k) for kind, k in MARK.findall(seen) if kind == "S"]
        through = summaries[max(ks) - 1][0] if ks else 0
        raw = {f"{kind}:{x}" for kind, x in MARK.findall(seen) if kind != "S"}
        assert raw == {m for m, seq in marks.items() if through < seq <= current}, n


async def test_200_participant_turns_summaries_stored_reused_and_nothing_dropped() -> None:
    settings = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1",
                             history_token_budget=BUDGET)
    agent_spec = concern_spec(settings, MemoryIssueCatalog())
    model = Model()

    async def agent(conversation: str, turn: str, attempt: int, history: list[dict[str, Any]],
                    cancel: Any, tenant: str | None) -> Any:
        return await run_concern_extraction(agent_spec, model.scripted, RecordingSink(),
                                            conversation, turn, attempt, history, cancel)

    c = Conversation()
    c.turns.agent = agent
    for n in range(TURNS):
        await c.run(await c.message(message(n)))
    log = c.log.logs[(CONVERSATIONS.name, 2)]
    marks, summaries = {}, []
    for env in log:
        rec = env.record
        if isinstance(rec, (MessageRecorded, ReplyRecorded)):
            content = rec.message_id if isinstance(rec, MessageRecorded) else rec.reply_id
            opened = c.sealer.open_text(CNV, content, rec.text)
            kind, n = MARK.match(opened).groups()  # type: ignore[union-attr]
            marks[f"{kind}:{n}"] = env.seq
        elif isinstance(rec, HistorySummarised):
            summaries.append((rec.through_seq,
                              c.sealer.open_text(CNV, rec.summary_id, rec.text)))
    check(model, marks, summaries)


class AssistantWorld:
    """One assistant conversation: commands through the real sequencer's pure half onto a
    log in memory, folded into the real ``Transcript``, turns run by the real step."""

    def __init__(self, model: Model, **settings: Any) -> None:
        self.sealer = Sealer(MemoryKeyStore())
        self.log = MemoryLogReader()
        self.out = Out()
        self.state: Any = None
        self.transcript = Transcript()
        self.settings = AssistantSettings(env="test", kafka_bootstrap="127.0.0.1:1",
                                          **{"history_token_budget": BUDGET, **settings})
        a = Assistant()
        a.ctx = SimpleNamespace(sealer=self.sealer)  # type: ignore[assignment]
        a.settings, a.out, a.reader = self.settings, self.out, self.log
        a.crash = CrashPoints.parse("")
        a.agents = SimpleNamespace(sink=lambda *args, **kw: RecordingSink(),
                                   client_for=lambda *args: model.scripted)
        a.box = a.datasets = a.images = None  # type: ignore[assignment]
        self.assistant = a
        self.starts: list[dict[str, Any]] = []
        self.cid = 0

    async def command(self, record: Any, cid: str) -> None:
        env = Envelope(record=record, key=CNV, source="/t", id=cid, tenant="t1")
        self.state, out = outputs(AssistantSequencer(), self.state, env)
        for spec_, logged in out:
            if spec_ is not ASSISTANT:
                continue
            offset = self.log.append(ASSISTANT, 0, logged)
            for kind, _, inp in self.transcript.apply(logged, 0, offset,
                                                      self.settings.assistant_history_bytes,
                                                      5) or []:
                if kind == TURN_KIND:
                    self.starts.append(inp)

    async def turn(self, n: int) -> None:
        mid = f"msg-{n}"
        await self.command(AssistantChat(
            conversation=CNV, owner="alice", create=n == 0, message_id=mid,
            request=self.sealer.seal_json(CNV, mid, {"message": message(n)}),
            options=ChatOptions(data_isolation=True)), f"chat-{n}")
        inp = self.last = self.starts.pop()
        before = len(self.out.of(COMMANDS))
        ctx = StepContext(workflow=inp["turn"], kind=TURN_KIND, step="reply", attempt=1,
                          input=inp, outputs={}, commands={})
        assert (await self.assistant.reply_step(ctx))["state"] == "Replied"
        for cmd in self.out.of(COMMANDS)[before:]:
            await self.command(cmd.record, cmd.id)


async def test_200_assistant_turns_summaries_stored_reused_and_nothing_dropped() -> None:
    model = Model()
    world = AssistantWorld(model)
    for n in range(TURNS):
        await world.turn(n)
    marks, summaries = {}, []
    for env in world.log.logs[(ASSISTANT.name, 0)]:
        rec = env.record
        if isinstance(rec, AssistantTurnRequested):
            opened = world.sealer.open_json(CNV, rec.message_id, rec.request)["message"]
        elif isinstance(rec, AssistantReplyRecorded):
            opened = world.sealer.open_json(CNV, f"{rec.reply_id}/chain", rec.chain)["text"]
        elif isinstance(rec, AssistantHistorySummarised):
            summaries.append((rec.through_seq,
                              world.sealer.open_text(CNV, rec.summary_id, rec.text)))
            continue
        else:
            continue
        kind, n = MARK.match(opened).groups()  # type: ignore[union-attr]
        marks[f"{kind}:{n}"] = env.seq
    check(model, marks, summaries)
    # the index holds the latest summary and only what follows it
    t = world.transcript
    assert t.summary is not None and t.summary["through"] == summaries[-1][0]
    assert all(e["seq"] > t.covered for e in t.entries) and t.omitted_through == 0


async def test_assistant_entries_over_the_byte_bound_are_said_to_be_left_out() -> None:
    """Without a summary (budget never reached), what no longer fits
    ``VOICE_ASSISTANT_HISTORY_BYTES`` is left out of a turn — and the turn is told so."""
    model = Model()
    world = AssistantWorld(model, history_token_budget=10**9, assistant_history_bytes=4096)
    for n in range(12):
        await world.turn(n)
    assert model.compactions == []
    omitted = world.last["log"]["omitted_through"]
    assert omitted > 0 and world.last["log"]["transcript"][0][0] > omitted
    last = model.turns[-1]
    assert f"through seq {omitted}, are left out" in last
    assert "VOICE_ASSISTANT_HISTORY_BYTES" in last
    assert "<m:0>" not in last and "<m:11>" in last
