"""A conversation turn's input is a reference, and its step reads what it needs from the log.

The transcript index holds positions (never content) and stays small however long the
conversation; a turn's ``WorkflowStarted`` names the records, the step reads them back
(``MemoryLogReader`` stands in for the broker) and opens them; a summary the engine made is
recorded, and later turns read it instead of the records it covers.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from consumers.conversations.concern import ConcernReply
from consumers.conversations.opened import LastRead
from consumers.conversations.sequencer import ConversationSequencer, ConversationState
from consumers.conversations.transcript import TranscriptIndex, reference_from
from consumers.conversations.turns import KIND, Turns, history_of
from consumers.engine import CancelToken, HistorySummary
from consumers.frame.logrefs import (
    MAX_ENTRIES,
    LogUnavailable,
    MemoryLogReader,
    Position,
    recent,
)
from consumers.frame.writer import outputs
from consumers.workflows.engine import StepContext
from consumers.workflows.runtime import Erased, StepError
from schemas.base import Record
from schemas.conversation import (
    ConversationErased,
    HistorySummarised,
    MessageRecorded,
    RecordTurnResults,
    ReplyRecorded,
    SendMessage,
    TurnOpened,
    TurnRequested,
    TurnStateChanged,
)
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope, unfolded
from streams.free_text import describe
from streams.ids import turn_id
from streams.sealing import MemoryKeyStore, Sealer
from streams.topics import COMMANDS, CONVERSATIONS, WORKFLOWS, TopicSpec

CNV = "cnv-0123456789abcdef"
PARTITION = 2


class Out:
    """The publisher: what the product sent, by topic."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Envelope]] = []

    async def send(self, spec: TopicSpec, env: Envelope, **kw: Any) -> None:
        self.sent.append((spec.name, env))

    def of(self, spec: TopicSpec) -> list[Envelope]:
        return [env for name, env in self.sent if name == spec.name]


class Agent:
    """The concern agent: keeps the history it was given; may return a summary."""

    def __init__(self) -> None:
        self.histories: list[list[dict[str, Any]]] = []
        self.summary: HistorySummary | None = None

    async def __call__(self, conversation: str, turn: str, attempt: int,
                       history: list[dict[str, Any]], cancel: CancelToken,
                       tenant: str | None) -> ConcernReply:
        self.histories.append(history)
        summary, self.summary = self.summary, None
        return ConcernReply(text=f"reply to {turn}", proposal=None, summary=summary)


class Conversation:
    """A conversation's log in memory, fed to ``Turns`` as the worker's consumer would.

    ``shape``: ``"writer"`` — the sequencer decides each command and learns where its records
    landed (as the writer tells it), and the record opening a turn names its history;
    ``"table"`` — the same for a conversation begun before the writer kept positions (the
    product's table keeps them); ``"separate"`` — records appended by hand as the sequencer
    appended them before a message opened its turn in one record.
    """

    def __init__(self, read_bytes: int = 512 * 1024, shape: str = "writer") -> None:
        self.sealer = Sealer(MemoryKeyStore())
        self.log = MemoryLogReader()
        self.out = Out()
        self.table: dict[str, Any] = {}
        self.agent = Agent()
        self.turns = Turns(self.out, self.table, self.sealer, self.agent, self.log, read_bytes)
        self.shape = shape
        self.sequencer = ConversationSequencer(read_bytes=read_bytes)
        self.state = ConversationState(owner="alice", tenant="t1")
        if shape != "writer":
            self.state.transcript = None
        self.seq = 0

    async def append(self, rec: Record) -> Envelope:
        env = Envelope(record=rec, key=CNV, source="/t", seq=self.seq + 1, tenant="t1")
        self.seq += rec.seqs  # a folded record holds a seq for each record it stands for
        offset = self.log.append(CONVERSATIONS, PARTITION, env)
        await self.turns.on_conversation_record(env, PARTITION, offset)
        return env

    async def command(self, cmd: Envelope) -> None:
        """``cmd`` through the sequencer: its records on the log, their positions told."""
        new, outs = outputs(self.sequencer, self.state, cmd)
        placed = [(env, PARTITION, self.log.append(CONVERSATIONS, PARTITION, env))
                  for spec, env in outs if spec is CONVERSATIONS]
        if new is not None:
            self.sequencer.placed(new, placed)
            # What the writer produces before it writes the state (decision 0016).
            self.out.sent += [(spec.name, env) for spec, env in
                              self.sequencer.follow_ups(new, placed)]
            self.state = new
            self.seq = new.seq
        for env, partition, offset in placed:
            await self.turns.on_conversation_record(env, partition, offset)

    async def message(self, text: str) -> WorkflowStarted:
        """A participant's message, as the sequencer appends it; the turn's start."""
        msg_seq = self.seq + 1
        mid = f"m{msg_seq}"
        turn = turn_id(CNV, msg_seq)
        sealed = self.sealer.seal(CNV, mid, text)
        if self.shape == "separate":
            await self.append(MessageRecorded(conversation=CNV, message_id=mid, text=sealed,
                                              at="now"))
            await self.append(TurnRequested(conversation=CNV, turn=turn, message_seq=msg_seq))
            await self.append(TurnStateChanged(conversation=CNV, turn=turn, state="Thinking"))
        else:
            await self.command(Envelope(record=SendMessage(conversation=CNV, message_id=mid,
                                                           text=sealed),
                                        key=CNV, source="/edge", tenant="t1"))
        started = self.out.of(WORKFLOWS)[-1].record
        assert isinstance(started, WorkflowStarted) and started.workflow == turn
        return started

    async def run(self, started: WorkflowStarted) -> dict[str, Any]:
        """The turn's step; its commands are appended to the log as the sequencer would."""
        before = len(self.out.of(COMMANDS))
        ctx = StepContext(workflow=started.workflow, kind=KIND, step="reply", attempt=1,
                          input=started.input, outputs={}, commands={})
        result = await self.turns.reply_step(ctx)
        for cmd in self.out.of(COMMANDS)[before:]:
            if self.shape != "separate":
                await self.command(cmd)
                continue
            rec = cmd.record
            for part in rec.parts() if isinstance(rec, RecordTurnResults) else (rec,):
                for old in unfolded(Envelope(record=part, key=CNV, source="/t", seq=1)):
                    rec = old.record
                    if isinstance(rec, ReplyRecorded):  # the reply alone, as it was
                        rec = ReplyRecorded(**rec.model_dump(include=set(
                            ReplyRecorded.model_fields)))
                    await self.append(rec)
        return result

    def reads(self, started: WorkflowStarted) -> dict[str, Any]:
        """The positions the turn's step reads: its input's, or those the record that
        opened it names (read from the log here as the step reads it)."""
        ref = started.input["history"]
        if "opened" not in ref:
            return ref
        seq, offset = ref["opened"]
        [opened] = self.log.logs[(CONVERSATIONS.name, ref["partition"])][offset:offset + 1]
        assert opened.seq == seq
        read = reference_from(opened, ref["partition"], offset)
        return {**read, "entries": [list(p) for p in read["entries"]]}  # as an input names them

    def index(self) -> dict[str, Any]:
        """The conversation's transcript index, where this shape keeps it."""
        if self.shape == "writer":
            assert CNV not in self.table, "the writer keeps it: no table value"
            assert self.state.transcript is not None
            return self.state.transcript
        return self.table[CNV]


async def test_a_turn_input_names_positions_and_the_step_reads_them() -> None:
    c = Conversation()
    started = await c.message("The crossing by the school is unsafe.")
    inp = started.input
    assert inp["history"] == {"partition": PARTITION, "opened": [1, 0]}
    assert c.reads(started) == {"partition": PARTITION, "summary": None, "entries": [[1, 0]],
                                "omitted_through": 0}
    assert "transcript" not in inp and "ciphertext" not in json.dumps(inp)
    assert "ciphertext" not in json.dumps(c.index()), "the table holds positions, not content"
    assert (await c.run(started))["state"] == "Replied"
    assert c.agent.histories[-1] == [{"role": "user",
                                      "content": "The crossing by the school is unsafe."}]
    # The second turn reads the first message and its reply back from the log.
    second = await c.message("And the bus stop too.")
    assert second.input["history"] == {"partition": PARTITION, "opened": [6, 2]}
    assert [p[0] for p in c.reads(second)["entries"]] == [1, 4, 6]
    await c.run(second)
    assert [m["role"] for m in c.agent.histories[-1]] == ["user", "assistant", "user"]
    assert c.agent.histories[-1][1]["content"] == f"reply to {turn_id(CNV, 1)}"
    assert c.log.reads[-1][:3] == (CONVERSATIONS.name, PARTITION, CNV)


@pytest.mark.parametrize("shape", ["table", "separate"])
async def test_a_conversation_begun_before_starts_the_same_turns(shape: str) -> None:
    """A conversation whose writer kept no positions (the table keeps them), and a log written
    before a message opened its turn in one record, start each turn with the same seqs, the
    same history and the same records read as one the writer keeps."""
    seen = []
    for kind in ("writer", shape):
        c = Conversation(shape=kind)
        first = await c.message("The crossing is unsafe.")
        await c.run(first)
        second = await c.message("And the bus stop.")
        await c.run(second)
        seen.append((first.workflow, second.workflow, second.input["message_seq"],
                     [p[0] for p in c.reads(second)["entries"]], c.agent.histories,
                     [(e.seq, isinstance(e.record, MessageRecorded)) for e in await c.log.read(
                         CONVERSATIONS, PARTITION, CNV, [Position.from_json(p) for p in
                                                         c.reads(second)["entries"]])]))
        assert (CNV in c.table) == (kind != "writer"), "only a conversation begun before"
    assert seen[0] == seen[1]
    assert seen[1][:4] == (turn_id(CNV, 1), turn_id(CNV, 6), 6, [1, 4, 6])


async def test_the_turn_input_is_named_by_the_record_that_opens_it() -> None:
    """The writer names what a turn reads in its ``TurnOpened`` (positions it learned from
    the broker); the consumer adds the record's own and starts the turn from it alone."""
    c = Conversation()
    await c.run(await c.message("first"))
    second = await c.message("second")
    opened = [env for env in c.log.logs[(CONVERSATIONS.name, PARTITION)]
              if isinstance(env.record, TurnOpened)]
    assert [e.record.history.entries for e in opened] == [[], [(1, 0), (4, 1)]]
    assert second.input["history"] == {"partition": PARTITION, "opened": [6, 2]}
    assert c.reads(second)["entries"] == [[1, 0], [4, 1], [6, 2]]
    assert c.table == {}


async def test_a_long_conversation_keeps_every_value_and_input_small() -> None:
    """Sixty 16 KB messages, all read by every turn: the writer's index holds a few dozen
    bytes per record, where the copied transcript grew by 22 KB a turn, and each turn's input
    stays the size of the first's: it names the record that opened the turn, which names the
    positions (they were copied with the workflow's state at every hop)."""
    c = Conversation(read_bytes=4 * 1024 * 1024)
    sizes = []
    for n in range(60):
        started = await c.message(f"message {n}: " + "the road is broken. " * 800)
        await c.run(started)
        sizes.append((len(json.dumps(started.input)), len(json.dumps(c.index()))))
        assert len(c.reads(started)["entries"]) == 2 * n + 1
    assert max(i for i, _ in sizes) < 200, "only the digits of seqs and offsets grow"
    assert max(v for _, v in sizes) < 8_000
    last = c.agent.histories[-1]
    assert len(last) == 2 * 60 - 1 and last[-1]["content"].startswith("message 59:")


async def test_a_summary_is_recorded_and_later_turns_read_it_instead() -> None:
    c = Conversation()
    for n in range(3):
        await c.run(await c.message(f"concern number {n}"))
    # The engine summarised the history before the third message (index 4 of the history
    # u1 a4 u6 a9 u11 a14 u16): the first four are covered, through the second reply.
    started = await c.message("concern number 3")
    c.agent.summary = HistorySummary("SUMMARY: three concerns so far", 4)
    await c.run(started)
    results = c.out.of(COMMANDS)[-1]
    assert results.id == f"{started.workflow}:results"
    summary = results.record.summary
    assert isinstance(summary, HistorySummarised)
    assert summary.summary_id == f"{started.workflow}:summary"
    assert summary.through_seq == 9
    assert c.sealer.open_text(CNV, summary.summary_id, summary.text) == \
        "SUMMARY: three concerns so far"
    index = c.index()
    assert index["summary"]["through"] == 9
    assert all(seq > 9 for seq, _, _ in index["entries"])
    nxt = await c.message("concern number 4")
    ref = c.reads(nxt)
    assert ref["summary"] == [index["summary"]["seq"], index["summary"]["offset"]]
    assert all(seq > 9 for seq, _ in ref["entries"])
    await c.run(nxt)
    history = c.agent.histories[-1]
    assert history[0]["role"] == "user"
    assert history[0]["content"].startswith("[CONVERSATION SUMMARY through seq 9]\n"
                                            "SUMMARY: three concerns so far\n\nconcern number 2")
    assert "concern number 0" not in json.dumps(history)


async def test_a_history_over_the_read_budget_is_cut_and_the_turn_told_so() -> None:
    c = Conversation(read_bytes=64 * 1024)
    for n in range(8):
        await c.run(await c.message(f"message {n} " + "x" * 15_000))
    index = c.index()
    assert index["omitted_through"] > 0
    assert sum(size for _, _, size in index["entries"]) == index["total"] <= 64 * 1024
    history = c.agent.histories[-1]
    assert "are left out" in history[0]["content"] and "VOICE_HISTORY_READ_BYTES" in \
        history[0]["content"]
    assert history[-1]["content"].startswith("message 7 ")


async def test_records_that_are_not_where_the_index_says_fail_the_step_clearly() -> None:
    c = Conversation()
    c = Conversation(shape="separate")  # a log of separate records
    started = await c.message("hello there friends")
    bad = dict(started.input, history={**started.input["history"], "entries": [[1, 99]]})
    ctx = StepContext(workflow=started.workflow, kind=KIND, step="reply", attempt=1,
                      input=bad, outputs={}, commands={})
    with pytest.raises(StepError, match="cannot be read: .*no record at offset 99") as err:
        await c.turns.reply_step(ctx)
    assert err.value.retryable is False
    assert describe(err.value).startswith("HistoryUnreadable: the history of turn")  # plain words
    with pytest.raises(LogUnavailable, match="holds seq 2"):
        await c.log.read(CONVERSATIONS, PARTITION, CNV, [Position(1, 1)])


@pytest.mark.parametrize(("opened", "words"), [
    ([7, 0], "holds seq 1 of .*, not seq 7"),
    ([1, 9], "no record at offset 9"),
    ([4, 1], "names no positions \\(TurnReplied\\)"),
])
async def test_an_input_naming_the_wrong_opening_record_fails_the_step_clearly(
        opened: list[int], words: str) -> None:
    """The record a turn's input names must be the ``TurnOpened`` at that seq: anything else
    fails the step for good (the log will not change), in plain words naming positions."""
    c = Conversation()
    await c.run(await c.message("hello there friends"))
    started = await c.message("and again")
    bad = dict(started.input, history={"partition": PARTITION, "opened": opened})
    ctx = StepContext(workflow=started.workflow, kind=KIND, step="reply", attempt=1,
                      input=bad, outputs={}, commands={})
    with pytest.raises(StepError, match=f"cannot be read: .*{words}") as err:
        await c.turns.reply_step(ctx)
    assert err.value.retryable is False


async def test_a_turn_started_with_a_copied_transcript_still_runs() -> None:
    """Turns started by an older worker (and recorded histories) carry the transcript."""
    c = Conversation()
    sealed = c.sealer.seal(CNV, "m1", "an old message")
    inp = {"conversation": CNV, "turn": turn_id(CNV, 1), "message_seq": 1, "tenant": "t1",
           "transcript": [{"seq": 1, "role": "user", "content_id": "m1",
                           "sealed": sealed.model_dump()}]}
    ctx = StepContext(workflow=inp["turn"], kind=KIND, step="reply", attempt=1, input=inp,
                      outputs={}, commands={})
    assert (await c.turns.reply_step(ctx))["state"] == "Replied"
    assert c.agent.histories[-1] == [{"role": "user", "content": "an old message"}]


async def test_erasure_forgets_the_index() -> None:
    c = Conversation()
    await c.message("hello there friends")
    await c.append(ConversationErased(conversation=CNV))
    assert CNV not in c.table


def test_the_index_ignores_redeliveries_and_other_records() -> None:
    sealer = Sealer(MemoryKeyStore())
    index = TranscriptIndex()
    msg = Envelope(record=MessageRecorded(conversation=CNV, message_id="m1",
                                          text=sealer.seal(CNV, "m1", "hi"), at="now"),
                   key=CNV, source="/t", seq=1)
    assert index.apply(msg, 0, 10, 1024) is True
    assert index.apply(msg, 0, 11, 1024) is False, "the same seq again (a redelivery)"
    state = Envelope(record=TurnStateChanged(conversation=CNV, turn="t", state="Thinking"),
                     key=CNV, source="/t", seq=2)
    assert index.apply(state, 0, 12, 1024) is False
    assert index.entries == [[1, 10, len(msg.record.text.ciphertext)]]


def test_recent_is_bounded_by_bytes_and_by_count() -> None:
    entries = [{"seq": n, "bytes": 10} for n in range(5000)]
    assert [e["seq"] for e in recent(entries, 35)] == [4997, 4998, 4999]
    assert len(recent(entries, 10**9)) == MAX_ENTRIES
    assert [e["seq"] for e in recent([{"seq": 1, "bytes": 999}], 10)] == [1], "keeps the last"


def test_history_of_puts_the_summary_before_a_leading_reply() -> None:
    sealer = Sealer(MemoryKeyStore())
    records = [
        Envelope(record=HistorySummarised(conversation=CNV, turn="t", summary_id="s",
                                          through_seq=3, text=sealer.seal(CNV, "s", "S")),
                 key=CNV, source="/t", seq=9),
        Envelope(record=ReplyRecorded(conversation=CNV, turn="t", reply_id="r",
                                      text=sealer.seal(CNV, "r", "R")), key=CNV, source="/t",
                 seq=5),
        Envelope(record=MessageRecorded(conversation=CNV, message_id="m",
                                        text=sealer.seal(CNV, "m", "M"), at="now"),
                 key=CNV, source="/t", seq=7),
    ]
    history, seqs = history_of(sealer, CNV, records)
    assert history == [{"role": "user", "content": "[CONVERSATION SUMMARY through seq 3]\nS"},
                       {"role": "assistant", "content": "R"}, {"role": "user", "content": "M"}]
    assert seqs == [3, 5, 7]


async def test_a_memory_log_scans_one_keys_span_and_says_when_it_ends_before() -> None:
    from consumers.frame.logrefs import LogUnavailable, MemoryLogReader
    from schemas.conversation import ConversationErased
    from streams.envelope import Envelope
    from streams.topics import ISSUES

    def rec(key: str, seq: int) -> Envelope:
        return Envelope(record=ConversationErased(conversation=key), key=key, source="/t",
                        seq=seq)

    log = MemoryLogReader()
    for key, seq in [("a", 1), ("b", 1), ("a", 2), ("a", 2), ("b", 2), ("a", 3)]:
        log.append(ISSUES, 0, rec(key, seq))
    got = await log.scan(ISSUES, 0, "a", 2, 3)
    assert [(e.key, e.seq) for e in got] == [("a", 2), ("a", 3)]
    with pytest.raises(LogUnavailable, match="ends before seq 4"):
        await log.scan(ISSUES, 0, "a", 0, 4)


def _recent_by_loop(entries: list[dict[str, Any]], budget: int, keep: int = 1,
                    max_entries: int = MAX_ENTRIES) -> list[dict[str, Any]]:
    """``recent`` as it was first written: newest first, one entry at a time."""
    out: list[dict[str, Any]] = []
    total = 0
    for entry in reversed(entries):
        total += int(entry.get("bytes", 0))
        if len(out) >= max_entries or (total > budget and len(out) >= keep):
            break
        out.append(entry)
    return out[::-1]


def test_recent_takes_what_the_plain_loop_takes() -> None:
    """``recent`` bisects its running totals (issue 14, eleventh pass); on random entries,
    budgets, ``keep`` and bounds it keeps exactly what the loop it replaced kept."""
    rng = random.Random(14)
    for _ in range(5000):
        entries = [{"seq": i, "bytes": rng.choice((0, 1, 5, 50, 200))} if rng.random() > 0.05
                   else {"seq": i} for i in range(rng.randint(0, 40))]
        budget, keep, bound = rng.choice((0, 1, 10, 100, 500, 10**9)), rng.randint(0, 4), \
            rng.randint(0, 50)
        assert recent(entries, budget, keep, bound) == _recent_by_loop(entries, budget, keep,
                                                                        bound)



SEALED_SUMMARY = Sealer(MemoryKeyStore()).seal(CNV, "s", "a summary")


class _DictIndex:
    """The index as it was kept before entries were triples with a running total: dict
    entries, ``recent`` over all of them at every add (the reference the new one must match)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, int]] = []
        self.covered = 0
        self.omitted_through = 0

    def add(self, seq: int, offset: int, size: int, budget: int) -> bool:
        if seq <= self.covered or (self.entries and self.entries[-1]["seq"] >= seq):
            return False
        entries = [*self.entries, {"seq": seq, "offset": offset, "bytes": size}]
        self.entries = recent(entries, budget)
        if len(self.entries) < len(entries):
            self.omitted_through = max(self.omitted_through,
                                       entries[len(entries) - len(self.entries) - 1]["seq"])
        return True

    def summarise(self, through: int) -> None:
        if through > self.covered:
            self.covered = through
            self.entries = [e for e in self.entries if e["seq"] > through]
            if self.omitted_through <= through:
                self.omitted_through = 0

    def before(self, seq: int, size: int, budget: int) -> tuple[list[tuple[int, int]], int]:
        after = _DictIndex()
        after.entries, after.covered = self.entries, self.covered
        after.omitted_through = self.omitted_through
        after.add(seq, -1, size, budget)
        return [(e["seq"], e["offset"]) for e in after.entries if e["seq"] < seq], \
            after.omitted_through


@pytest.mark.parametrize("budget", [50, 400, 10**9])
def test_the_index_keeps_what_recent_kept_over_every_entry(budget: int) -> None:
    """Each add drops the oldest entries a new one pushes out, from a running total, in time
    that does not grow with the index: the same entries, omissions and turn references as
    ``recent`` over the whole index at every add gave, through summaries, redeliveries,
    oversized entries and ``MAX_ENTRIES``; and a state of the old shape (dict entries, no
    total) reads and goes on the same."""
    rng = random.Random(budget)
    new, old = TranscriptIndex(), _DictIndex()
    seq = 0
    for step in range(3000):
        if rng.random() < 0.01 and seq > 2:  # a summary through some recent seq
            through = seq - rng.randrange(0, 3)
            summary = HistorySummarised(conversation=CNV, turn="t", summary_id=f"s{step}",
                                        through_seq=through, text=SEALED_SUMMARY)
            seq += 1
            new.apply(Envelope(record=summary, key=CNV, source="/t", seq=seq), 0, seq, budget)
            old.summarise(through)
            continue
        seq += rng.choice([1, 1, 2, 3])
        size = rng.choice([0, 1, 7, 20, 45, 400, 600]) if step % 500 else budget + 1
        if rng.random() < 0.3:  # a turn's message: what its TurnOpened names, before it lands
            ref = new.before(_message(size), seq, budget)
            assert (ref.entries, ref.omitted_through) == old.before(seq, size, budget)
        assert new.add(seq, 0, seq, size, budget) is old.add(seq, seq, size, budget)
        assert new.add(seq, 0, seq, size, budget) is False, "a redelivery changes nothing"
        assert new.entries == [[e["seq"], e["offset"], e["bytes"]] for e in old.entries]
        assert new.omitted_through == old.omitted_through
        assert new.total == sum(e["bytes"] for e in old.entries)
        assert len(new.entries) <= MAX_ENTRIES
        if step == 1500:  # from here on, go on from a state of the old shape
            new = TranscriptIndex.from_dict({"partition": 0, "entries": old.entries,
                                             "summary": new.summary,
                                             "omitted_through": old.omitted_through})
            assert new.total is None and new.to_dict()["total"] == new.total


def _message(size: int) -> MessageRecorded:
    return MessageRecorded(conversation=CNV, message_id="m", at="now",
                           text=SEALED_SUMMARY.model_copy(update={"ciphertext": "x" * size}))


def test_a_long_conversations_index_is_under_half_its_old_size() -> None:
    """Entries are ``[seq, offset, bytes]``: the state's changelog value at 1,000 entries is
    less than half of what ``{"seq", "offset", "bytes"}`` dicts made it."""
    index = TranscriptIndex()
    for n in range(1, 1001):
        index.add(2 * n, 0, 10_000 + 3 * n, 300, 10**9)
    as_dicts = [{"seq": s, "offset": o, "bytes": b} for s, o, b in index.entries]
    size = len(json.dumps(index.to_dict()))
    assert size < 0.5 * len(json.dumps({**index.to_dict(), "entries": as_dicts}))
    assert TranscriptIndex.from_dict(json.loads(json.dumps(index.to_dict()))) == index


def _full_history(c: Conversation, started: WorkflowStarted) -> list[dict[str, Any]]:
    """The history a step reading every position afresh gives (no last read kept)."""
    ref = c.reads(started)
    wanted = ([ref["summary"]] if ref["summary"] else []) + ref["entries"]
    records = [c.log.logs[(CONVERSATIONS.name, PARTITION)][o] for _, o in wanted]
    return history_of(c.sealer, CNV, records, ref["omitted_through"])[0]


async def test_a_turn_reads_only_what_its_conversations_last_turn_did_not() -> None:
    """The step keeps what a conversation's turn read (positions, roles, opened texts): the
    next turn reads the record that opened it, the summary and the positions after the kept
    ones; its history is the one a fresh read of every position gives, through a summary
    and a history cut at the read budget."""
    c = Conversation(read_bytes=12 * 1024)
    for n in range(12):
        started = await c.message(f"concern number {n} " + "x" * (3000 if n > 6 else 10))
        if n == 5:
            c.agent.summary = HistorySummary("SUMMARY: five concerns so far", 6)
        c.log.reads.clear()
        await c.run(started)
        assert c.agent.histories[-1] == _full_history(c, started)
        ref = c.reads(started)
        opened, *summary_and_new = [[p.seq for p in read[3]] for read in c.log.reads]
        assert opened == [started.input["history"]["opened"][0]]
        if n == 0:
            continue
        new = summary_and_new[0][1:] if ref["summary"] else summary_and_new[0]
        assert len(new) <= 1, f"turn {n} read {new} again, not only the last reply"
        assert not ref["summary"] or summary_and_new[0][0] == ref["summary"][0]
    assert c.index()["omitted_through"] > 0 and c.index()["summary"] is not None


async def test_a_kept_read_is_not_served_once_the_conversation_is_erased() -> None:
    """Its key is checked live before a kept read is served; the erasure record drops it."""
    c = Conversation()
    await c.run(await c.message("hello there friends"))
    started = await c.message("and again")
    assert c.turns.opened.last_read(CNV) is not None
    c.sealer.erase(CNV)
    ctx = StepContext(workflow=started.workflow, kind=KIND, step="reply", attempt=1,
                      input=started.input, outputs={}, commands={})
    with pytest.raises(Erased):
        await c.turns.reply_step(ctx)
    await c.append(ConversationErased(conversation=CNV))
    assert c.turns.opened.last_read(CNV) is None


async def test_a_kept_read_that_differs_from_what_a_turn_names_is_not_used() -> None:
    """Positions kept for another partition, or for other offsets, are read afresh."""
    c = Conversation()
    await c.run(await c.message("hello there friends"))
    await c.run(await c.message("and again"))
    last = c.turns.opened.last_read(CNV)
    assert last is not None and last.roles == ["user", "assistant", "user"]
    roles = ["user", "assistant", "user"]
    wrong = ["a text not on the log", "nor this one", "no"]
    for kept in (LastRead(PARTITION + 1, last.positions, roles, wrong),
                 LastRead(PARTITION, [(s, o + 100) for s, o in last.positions], roles, wrong)):
        c.turns.opened.keep_read(CNV, kept)
        started = await c.message("a third one")
        await c.run(started)
        assert c.agent.histories[-1] == _full_history(c, started)
        assert "not on the log" not in json.dumps(c.agent.histories[-1])
