"""The single writer of every aggregate (``consumers.frame.writer``), without a broker: an
in-memory publisher that journals produces and broker acks, and a dict as the Faust table."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from confluent_kafka import KafkaError

from consumers.conversations.sequencer import ConversationSequencer, ConversationState
from consumers.frame import Aggregate, Decision
from consumers.frame.writer import Raw, Writer
from schemas.base import Sealed
from schemas.conversation import (
    ConversationIndexed,
    EraseConversation,
    ProposalRecorded,
    RecordTurnResults,
    ReplyRecorded,
    SendMessage,
    StartConversation,
    TurnStateChanged,
)
from schemas.staff import OpenIssue
from schemas.system import CommandAcknowledged
from streams.envelope import Envelope, encode
from streams.producer import ProduceError
from streams.retry import RetryPolicy, Unprocessable
from streams.settings import VoiceSettings
from streams.topics import ACKS, CONVERSATIONS, OWNERS, WORKFLOWS, TopicSpec

CNV = "cnv-00112233aabbccdd"
ISS = "iss-0123456789abcdef"
T0 = datetime(2026, 1, 1, tzinfo=UTC)
SEALED = Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="Y2lwaGVy")
TOPIC = "t.voice.commands"


class Crash(Exception):
    """A worker dying at a chosen point."""


class Report:
    """A delivery report: where the broker put the record, and its key and value's bytes."""

    def __init__(self, partition: int, offset: int, key: bytes = b"", size: int = 0) -> None:
        self._partition, self._offset, self._key, self._size = partition, offset, key, size

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return self._key

    def len(self) -> int:
        return self._size


class FakePublisher:
    """Journals ``produce`` (when called) and the broker's ack (when awaited); keeps DLQ
    records. ``fail_on`` names a topic whose next produce raises (a crash right there)."""

    def __init__(self, journal: list[tuple[str, ...]]) -> None:
        self.journal = journal
        self.sent: list[tuple[str, Envelope]] = []
        self.dlq: list[tuple[str, bytes | None, dict[str, bytes]]] = []
        self.fail_on: str | None = None
        self.refuse: str | None = None
        """A topic whose next record the broker refuses (its delivery fails)."""
        self.refuse_too_large = False
        """Refuse it as too large for the topic (else as out of in-sync replicas)."""
        self.too_large_for: set[str] = set()
        """Topics that refuse every record as too large (for good: no try changes it)."""

    settings = VoiceSettings(topic_prefix="t.")

    @property
    def producer(self) -> FakePublisher:
        return self

    def produce(self, spec: TopicSpec, env: Envelope) -> Any:
        if self.fail_on == spec.name:
            self.fail_on = None
            raise Crash(spec.name)
        self.journal.append(("produce", spec.name, env.id))
        self.sent.append((spec.name, env))

        refused = self.refuse == spec.name
        if refused:
            self.refuse = None
        for_good = spec.name in self.too_large_for

        offset = sum(1 for name, _ in self.sent if name == spec.name) - 1

        async def acked() -> Report:
            await asyncio.sleep(0)
            if (refused and self.refuse_too_large) or for_good:
                raise ProduceError(f"produce to {spec.name!r} failed: Broker: Message size too "
                                   "large", retryable=False, code=KafkaError.MSG_SIZE_TOO_LARGE)
            if refused:
                raise ProduceError(f"produce to {spec.name!r} failed: Broker: Not enough "
                                   "in-sync replicas", retryable=True)
            self.journal.append(("acked", spec.name, env.id))
            return Report(0, offset, env.key.encode(), 100 + offset)
        return acked()

    def produce_raw(self, topic: str, key: bytes | None, value: bytes | None,
                    headers: Any = None) -> Any:
        self.dlq.append((topic, value, dict(headers or [])))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut

    def acks(self) -> list[CommandAcknowledged]:
        return [e.record for t, e in self.sent if t == ACKS.name]  # type: ignore[misc]

    def log(self) -> list[Envelope]:
        return self.of(CONVERSATIONS)

    def of(self, spec: TopicSpec) -> list[Envelope]:
        return [e for t, e in self.sent if t == spec.name]


class JournalTable(dict[str, Any]):
    """A Faust table stand-in that journals its writes and can crash on one."""

    def __init__(self, journal: list[tuple[str, ...]]) -> None:
        super().__init__()
        self.journal = journal
        self.fail = False

    def __setitem__(self, key: str, value: Any) -> None:
        if self.fail:
            self.fail = False
            raise Crash("table")
        self.journal.append(("table", key))
        super().__setitem__(key, value)


@pytest.fixture
def parts() -> tuple[list[tuple[str, ...]], FakePublisher, JournalTable, Writer]:
    journal: list[tuple[str, ...]] = []
    out, table = FakePublisher(journal), JournalTable(journal)
    writer = Writer(out, TOPIC)  # type: ignore[arg-type]
    writer.register(ConversationSequencer(), table)
    return journal, out, table, writer


def start(id_: str = "c-start") -> Envelope:
    return Envelope(record=StartConversation(conversation=CNV, owner="alice"), key=CNV,
                    source="/test", id=id_, time=T0)


def send(id_: str) -> Envelope:
    return Envelope(record=SendMessage(conversation=CNV, message_id="m1", text=SEALED),
                    key=CNV, source="/test", id=id_, time=T0, correlation="req-1",
                    tenant="t1")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_records_are_acked_before_the_table_and_the_command_ack_comes_last(parts) -> None:  # noqa: ANN001
    journal, out, _, writer = parts
    run(writer.dispatch(start()))
    journal.clear()

    async def scenario() -> list[tuple[str, ...]]:
        await writer.dispatch(send("c1"))
        when_done = list(journal)
        await asyncio.sleep(0.01)  # the ack's delivery completes after the writer moved on
        return when_done

    when_done = run(scenario())
    turn = f"{CNV}:turn-2"
    assert [e for e in when_done if e[1] != "voice.acks" or e[0] != "acked"] == [
        ("produce", "voice.conversations", "c1-2"),  # the message opening its turn (seqs 2-4)
        ("acked", "voice.conversations", "c1-2"),    # then its broker ack
        ("produce", "voice.acks", "c1-ack"),         # then the command's ack (decision 0016)
        ("produce", "voice.workflows", f"{turn}:1"),  # then what it starts: the turn
        ("acked", "voice.workflows", f"{turn}:1"),
        ("table", CNV),                              # then the state
    ]
    assert ("acked", "voice.acks", "c1-ack") in journal  # not waited on
    # A command that starts nothing (redelivered: nothing appended): its state, then its ack.
    journal.clear()
    run(writer.dispatch(send("c1")))
    assert journal[:2] == [("table", CNV), ("produce", "voice.acks", "c1-ack")]

    # A command of several records: all produced at once, in order, then every broker ack.
    journal.clear()
    run(writer.dispatch(Envelope(record=RecordTurnResults(
        conversation=CNV, turn=turn,
        reply=ReplyRecorded(conversation=CNV, turn=turn, reply_id="r", text=SEALED),
        proposal=ProposalRecorded(conversation=CNV, turn=turn, proposal_id="p", proposal=SEALED),
        ended=TurnStateChanged(conversation=CNV, turn=turn, state="CouldNotInterpret",
                               reason_code="cancelled")),
        key=CNV, source="/test", id="r1", time=T0, tenant="t1")))
    ids = ["r1-5", "r1-6", "r1-7"]
    assert journal == [*[("produce", "voice.conversations", i) for i in ids],
                       *[("acked", "voice.conversations", i) for i in ids], ("table", CNV)]
    assert not writer._acks  # nothing left in flight
    msg = next(e for e in out.log() if e.seq == 2)
    assert (msg.seq, msg.tenant, msg.correlation, msg.causation, msg.time) == (
        2, "t1", "req-1", "c1", T0)


def test_the_aggregate_learns_where_its_records_landed_before_its_state_is_written(parts
                                                                                   ) -> None:  # noqa: ANN001
    """The conversation's state keeps its transcript's positions from the delivery reports,
    and the next message's record names them (what its turn reads)."""
    _, out, table, writer = parts
    run(writer.dispatch(start()))
    run(writer.dispatch(send("c1")))
    turn = f"{CNV}:turn-2"
    run(writer.dispatch(Envelope(record=RecordTurnResults(
        conversation=CNV, turn=turn,
        reply=ReplyRecorded(conversation=CNV, turn=turn, reply_id="r", text=SEALED),
        ended=TurnStateChanged(conversation=CNV, turn=turn, state="Replied")),
        key=CNV, source="/test", id="r1", time=T0, tenant="t1")))
    state = ConversationState.from_dict(table[CNV])
    assert state is not None and state.transcript is not None
    assert [(seq, offset) for seq, offset, _ in state.transcript["entries"]] == [(2, 1), (5, 2)]
    run(writer.dispatch(send("c2")))
    opened = out.log()[-1].record
    assert opened.history.entries == [(2, 1), (5, 2)] and out.log()[-1].seq == 7


def test_a_redelivered_command_is_answered_again_and_not_reapplied(parts) -> None:  # noqa: ANN001
    _, out, table, writer = parts
    run(writer.dispatch(start()))
    run(writer.dispatch(send("c1")))
    before = (len(out.log()), dict(table))
    run(writer.dispatch(send("c1")))
    assert (len(out.log()), dict(table)) == before
    first, again = out.acks()[-2:]
    assert (first.outcome, again.outcome) == ("accepted", "duplicate")
    assert (again.seq, again.detail) == (first.seq, first.detail)


def test_a_crash_between_table_and_ack_still_answers_the_command(parts) -> None:  # noqa: ANN001
    _, out, _, writer = parts
    run(writer.dispatch(start()))
    erase = Envelope(record=EraseConversation(conversation=CNV), key=CNV, source="/test",
                     id="e1", time=T0)  # starts nothing: its ack comes after its state
    out.fail_on = "voice.acks"
    with pytest.raises(Crash):
        run(writer.dispatch(erase))
    assert [e.seq for e in out.log()] == [1, 2] and len(out.acks()) == 1
    run(writer.dispatch(erase))  # redelivered: the state already holds it
    ack = out.acks()[-1]
    assert ack.command_id == "e1" and ack.outcome == "duplicate" and ack.seq == 2
    assert len(out.log()) == 2


def test_a_crash_at_the_ack_of_what_starts_a_turn_replays_it(parts) -> None:  # noqa: ANN001
    """A message's ack goes before its turn's start and its state (decision 0016): a crash
    there decides it again, to the same records, answered the same."""
    _, out, _, writer = parts
    run(writer.dispatch(start()))
    out.fail_on = "voice.acks"
    with pytest.raises(Crash):
        run(writer.dispatch(send("c1")))
    assert [e.seq for e in out.log()] == [1, 2] and out.of(WORKFLOWS) == []
    run(writer.dispatch(send("c1")))  # redelivered against the old state
    ack = out.acks()[-1]
    assert ack.command_id == "c1" and ack.outcome == "accepted" and ack.seq == 2
    assert ack.detail["turn"] == f"{CNV}:turn-2"
    assert [e.seq for e in out.log()] == [1, 2, 2]  # the same record again, which readers dedupe
    assert [e.id for e in out.of(WORKFLOWS)] == [f"{CNV}:turn-2:1"]


def test_a_crash_before_the_table_replays_to_identical_records(parts) -> None:  # noqa: ANN001
    _, out, table, writer = parts
    run(writer.dispatch(start()))
    table.fail = True
    with pytest.raises(Crash):
        run(writer.dispatch(send("c1")))
    first = [(e.id, e.seq, e.record) for e in out.log()]
    assert len(out.of(WORKFLOWS)) == 1  # the turn it opened, started before the state
    run(writer.dispatch(send("c1")))
    again = [(e.id, e.seq, e.record) for e in out.log()][len(first):]
    assert again == first[1:] and out.acks()[-1].outcome == "accepted"
    # The same start again, under the same id (the runtime starts a workflow once), each
    # naming a copy of the same record (seq 2) as its turn's opening one.
    starts = out.of(WORKFLOWS)
    assert [e.id for e in starts] == [f"{CNV}:turn-2:1"] * 2
    assert [e.record.input["history"]["opened"] for e in starts] == [[2, 1], [2, 2]]
    assert [out.log()[offset].seq for offset in (1, 2)] == [2, 2]
    assert out.acks()[-1].seq == out.acks()[-2].seq == 2  # both answers say the same
    assert ConversationState.from_dict(table[CNV]).seq == 4  # type: ignore[union-attr]


def test_a_started_conversation_is_indexed_under_its_owner_before_its_state_is_written(parts
                                                                                       ) -> None:  # noqa: ANN001
    journal, out, _, writer = parts
    run(writer.dispatch(start()))
    (indexed,) = out.of(OWNERS)
    assert indexed.record == ConversationIndexed(conversation=CNV, owner="alice")
    assert (indexed.id, indexed.causation) == ("c-start-1:indexed", "c-start-1")
    assert journal.index(("acked", "voice.owners", indexed.id)) < journal.index(("table", CNV))


def test_what_a_command_starts_is_tried_until_the_broker_takes_it(parts) -> None:  # noqa: ANN001
    """Its records are on the log and answered: the command waits (its state unwritten, its
    offset uncommitted) and the start is produced again, never dropped nor its state written
    without it."""
    journal, out, table, writer = parts
    writer.backoff = RetryPolicy(initial_s=0.001, max_s=0.001)
    run(writer.dispatch(start()))
    out.refuse = "voice.workflows"
    run(writer.dispatch(send("c1")))
    tries = [e for e in journal if e[1] == "voice.workflows"]
    turn = f"{CNV}:turn-2:1"
    assert tries == [("produce", "voice.workflows", turn), ("produce", "voice.workflows", turn),
                     ("acked", "voice.workflows", turn)]
    assert journal.index(("acked", "voice.workflows", turn)) < len(journal) - 1
    assert journal[-1] == ("table", CNV) and ConversationState.from_dict(table[CNV]).seq == 4  # type: ignore[union-attr]
    assert [a.outcome for a in out.acks()] == ["accepted", "accepted"]  # answered once each


class Exploding(Aggregate[ConversationState]):
    name = "exploding"
    log = CONVERSATIONS
    source = "/test"
    commands = (OpenIssue,)

    def load(self, raw: dict[str, Any] | None) -> ConversationState | None:
        return ConversationState.from_dict(raw)

    def decide(self, state: ConversationState | None, cmd: Envelope
               ) -> Decision[ConversationState]:
        raise ValueError(f"cannot decide {cmd.id!r}")


def test_a_command_that_cannot_be_decided_is_dead_lettered_and_the_writer_goes_on(parts
                                                                                  ) -> None:  # noqa: ANN001
    _, out, table, writer = parts
    writer.register(Exploding(), table)
    bad = Envelope(record=OpenIssue(issue=ISS, title="t", by="sam"), key=ISS,
                   source="/test", id="bad-1")
    key, value, headers = encode(bad)
    run(writer.receive(Raw(TOPIC, 2, 41, key, value, headers)))
    [(topic, dlq_value, dlq_headers)] = out.dlq
    assert topic == f"{TOPIC}.dlq" and dlq_value == value
    # Described, not quoted: the exception's message could echo the command's values.
    assert dlq_headers["voice_dlq_reason"] == (b"exploding could not decide "
                                               b"'voice.issue.open.v1': ValueError")
    assert dlq_headers["voice_dlq_offset"] == b"41" and dlq_headers["ce_id"] == b"bad-1"
    assert out.sent == [] and ISS not in table
    run(writer.dispatch(start()))  # the next command is applied as usual
    assert out.acks()[-1].outcome == "accepted"


def test_a_record_that_cannot_be_decoded_is_dead_lettered(parts) -> None:  # noqa: ANN001
    _, out, table, writer = parts
    run(writer.receive(Raw(TOPIC, 0, 7, b"k", b"{not json", [("ce_type", b"nope")])))
    [(topic, value, headers)] = out.dlq
    assert topic == f"{TOPIC}.dlq" and value == b"{not json"
    assert headers["voice_dlq_reason"] and headers["voice_dlq_topic"] == TOPIC.encode()
    assert out.sent == [] and dict(table) == {}


def test_each_command_type_has_one_writer_and_plain_handlers_get_the_rest(parts) -> None:  # noqa: ANN001
    _, _, table, writer = parts
    with pytest.raises(ValueError, match="'StartConversation' already has a writer"):
        writer.register(ConversationSequencer(), table)
    seen: list[str] = []

    async def handler(env: Envelope) -> None:
        seen.append(env.id)

    writer.route((OpenIssue,), handler)
    run(writer.dispatch(Envelope(record=OpenIssue(issue=ISS, title="t", by="s"),
                                 key=ISS, source="/test", id="x1")))
    assert seen == ["x1"]


class Uncounted(Exploding):
    """Appends a record without counting it into the state's seq."""

    def decide(self, state: ConversationState | None, cmd: Envelope
               ) -> Decision[ConversationState]:
        rec = StartConversation(conversation=CNV, owner="x")
        return Decision(ConversationState(owner="x"), (rec,))


def test_records_a_decide_did_not_count_are_refused_not_given_wrong_seqs(parts) -> None:  # noqa: ANN001
    _, out, table, writer = parts
    writer.register(Uncounted(), table)
    bad = Envelope(record=OpenIssue(issue=ISS, title="t", by="sam"), key=ISS, source="/test",
                   id="bad-2")
    run(writer.dispatch(bad))
    assert out.sent == [] and len(out.dlq) == 1 and ISS not in table
    assert b"took seq 0 to 0" in out.dlq[0][2]["voice_dlq_reason"]


def test_records_the_broker_refuses_are_dead_lettered_and_their_seqs_never_reused(parts
                                                                                  ) -> None:  # noqa: ANN001
    # Regression (issue 12): a failed produce was logged and committed past; the next message
    # then reused the seq of a record that may have landed, and readers deduped it away.
    _, out, table, writer = parts
    run(writer.dispatch(start()))
    def idem(id_: str) -> Envelope:
        return Envelope(record=SendMessage(conversation=CNV, message_id="m1", text=SEALED,
                                           idempotency_key="k1"),
                        key=CNV, source="/test", id=id_, time=T0, tenant="t1")
    out.refuse = "voice.conversations"  # its record (seqs 2-4) is refused
    run(writer.dispatch(idem("c1")))
    ack = out.acks()[-1]
    assert (ack.command_id, ack.outcome) == ("c1", "rejected") and ack.detail["retryable"]
    [(topic, _, headers)] = out.dlq
    assert topic == f"{TOPIC}.dlq" and b"could not record" in headers["voice_dlq_reason"]
    state = ConversationState.from_dict(table[CNV])
    assert state is not None and state.seq == 4  # seqs 2..4 were attempted: never again
    assert "c1" not in state.commands and "idem:k1" not in state.commands
    assert not state.open_turns, "the refused message's turn was decided on the writer's copy"

    run(writer.dispatch(send("c2")))
    assert [e.seq for e in out.log() if e.causation == "c2"] == [5]  # holding seqs 5-7
    run(writer.dispatch(idem("c3")))  # the client's retry, same idempotency key
    assert out.acks()[-1].outcome == "accepted" and out.acks()[-1].seq == 8


def test_records_refused_as_too_large_are_answered_so_not_try_again(parts) -> None:  # noqa: ANN001
    # Regression (issue 12, fault 6): a command whose record was too large for its topic was
    # answered "could not record the command; try again" (the edge: 503) — no retry can
    # help, and the client was not told why. Now the answer names the limit (the edge: 413).
    _, out, table, writer = parts
    run(writer.dispatch(start()))
    out.refuse, out.refuse_too_large = "voice.conversations", True
    run(writer.dispatch(send("c1")))
    ack = out.acks()[-1]
    assert ack.outcome == "rejected" and ack.detail["too_large"]
    assert not ack.detail.get("retryable")
    assert "too large" in ack.detail["reason"] and "max.message.bytes" in ack.detail["reason"]
    [(_topic, _, headers)] = out.dlq
    assert b"too large" in headers["voice_dlq_reason"]
    run(writer.dispatch(send("c2")))  # the next message: past the refused seqs, accepted
    assert out.acks()[-1].outcome == "accepted" and out.acks()[-1].seq == 5


def test_refused_records_whose_dead_letter_fails_too_are_raised_not_committed_past(parts
                                                                                   ) -> None:  # noqa: ANN001
    # Regression (issue 12): the writer logged the failed dead letter and answered the command
    # rejected; the agent then committed past a command that was neither recorded nor
    # dead-lettered. Now it raises, so the agent retries it (and never commits past it).
    _, out, table, writer = parts
    run(writer.dispatch(start()))
    out.refuse = "voice.conversations"

    def no_dlq(*_args: Any, **_kw: Any) -> Any:
        raise ProduceError("produce to 't.voice.commands.dlq' failed: Local: Message timed "
                           "out", retryable=True)

    out.produce_raw = no_dlq  # type: ignore[method-assign]
    acks = len(out.acks())
    with pytest.raises(ProduceError, match="commands.dlq"):
        run(writer.dispatch(send("c1")))
    assert len(out.acks()) == acks  # no answer for a command the writer has not settled
    state = ConversationState.from_dict(table[CNV])
    assert state is not None and state.seq == 4 and "c1" not in state.commands
    del out.produce_raw  # the broker is back: the agent's retry records it, under new seqs
    run(writer.dispatch(send("c1")))
    assert out.acks()[-1].outcome == "accepted" and out.acks()[-1].seq == 5


def test_a_command_type_nobody_owns_is_unprocessable(parts) -> None:  # noqa: ANN001
    _, out, _table, writer = parts
    stray = Envelope(record=OpenIssue(issue=ISS, title="t", by="sam"), key=ISS, source="/test",
                     id="stray")
    with pytest.raises(Unprocessable, match="no writer takes 'voice.issue.open.v1'"):
        run(writer.dispatch(stray))
    assert out.sent == []


def test_a_command_of_another_tenant_is_answered_no_such_and_applies_nothing(parts) -> None:  # noqa: ANN001
    _, out, table, writer = parts
    run(writer.dispatch(replace(start(), tenant="t1")))
    assert table[CNV]["tenant"] == "t1"  # the state carries the tenant that made it
    before = (len(out.log()), dict(table))
    forged = replace(send("c-forged"), tenant="t2")
    run(writer.dispatch(forged))
    again = replace(start("c-start-2"), tenant="t2")
    run(writer.dispatch(again))
    assert len(out.log()) == before[0]  # nothing on the conversation's log
    assert dict(table) == before[1]
    refused = out.acks()[-2:]
    assert [(a.outcome, a.detail.get("reason")) for a in refused] == [
        ("rejected", "no such conversation")] * 2
    run(writer.dispatch(send("c-own")))  # the owner's tenant still writes
    assert out.acks()[-1].outcome == "accepted"


def test_a_long_conversations_command_copies_only_what_it_changes(parts) -> None:  # noqa: ANN001
    """Regression (issue 14, eleventh pass): every command deep-copied its conversation's
    whole state several times over — a thousand memos and index entries at a few hundred
    turns, ~25 ms of CPU a turn at 600. The writer decides on the one copy it loads, and that
    copy shares the memos and index entries (never changed in place) with the table's value."""
    _, out, table, writer = parts
    run(writer.dispatch(start()))
    for i in range(1, 41):
        turn = f"{CNV}:turn-{table[CNV]['seq'] + 1}"
        run(writer.dispatch(send(f"c{i}")))
        run(writer.dispatch(Envelope(record=RecordTurnResults(
            conversation=CNV, turn=turn,
            reply=ReplyRecorded(conversation=CNV, turn=turn, reply_id=f"{turn}:reply",
                                text=SEALED),
            ended=TurnStateChanged(conversation=CNV, turn=turn, state="Replied")),
            key=CNV, source="/test", id=f"{turn}:results", time=T0, tenant="t1")))
    before = table[CNV]
    run(writer.dispatch(send("c-next")))
    after = table[CNV]
    assert after is not before and after["seq"] == before["seq"] + 3
    assert len(after["commands"]) == len(before["commands"]) + 1
    assert all(after["commands"][k] is v for k, v in before["commands"].items())
    old_entries = {e[0]: e for e in before["transcript"]["entries"]}
    kept = [e for e in after["transcript"]["entries"] if e[0] in old_entries]
    assert len(kept) == 80 and all(old_entries[e[0]] is e for e in kept)
    # ... and the table's old value was not changed by deciding on the copy
    assert "c-next" not in before["commands"] and len(before["transcript"]["entries"]) == 80
    assert len(before["open_turns"]) == 0 and len(after["open_turns"]) == 1



def test_each_record_put_on_a_log_is_remembered_where_it_landed(parts) -> None:  # noqa: ANN001
    """For this worker's steps: a turn's step reads its opening record back by position, and
    its start is produced before any consumer of the log could have read that record."""
    _, out, _, writer = parts
    told: list[tuple[str, int, int, str, int]] = []
    writer.remember = lambda spec, p, o, env, size: told.append((spec.name, p, o, env.id, size))
    run(writer.dispatch(start()))
    run(writer.dispatch(send("c1")))
    key = len(CNV.encode())
    assert told == [("voice.conversations", 0, 0, "c-start-1", key + 100),
                    ("voice.conversations", 0, 1, "c1-2", key + 101)]
    assert [e.id for e in out.log()] == ["c-start-1", "c1-2"]


def test_a_hook_on_the_log_is_told_each_placed_record_before_the_state(parts) -> None:  # noqa: ANN001
    """What a worker's product did as a consumer of its own writer's log (decision 0016): told
    each record with where it landed, after the acknowledgement and before the table write, and
    told again when what the command started has to be produced again."""
    journal, out, _, writer = parts
    writer.backoff = RetryPolicy(initial_s=0.001, max_s=0.001)
    told: list[tuple[str, int, int]] = []

    async def hook(env: Envelope, partition: int, offset: int) -> None:
        told.append((env.id, partition, offset))
        journal.append(("hook", env.id))

    writer.on_recorded(CONVERSATIONS, hook)
    run(writer.dispatch(start()))
    assert told == [("c-start-1", 0, 0)]
    assert journal.index(("hook", "c-start-1")) < journal.index(("table", CNV))
    assert journal.index(("produce", "voice.acks", "c-start-ack")) < journal.index(
        ("hook", "c-start-1"))
    out.refuse = "voice.workflows"  # the turn's start refused once: all of 5b again
    run(writer.dispatch(send("c1")))
    assert told[1:] == [("c1-2", 0, 1)]  # told once the start was taken, not before
    assert journal[-2:] == [("hook", "c1-2"), ("table", CNV)]


def test_a_record_a_hook_fails_on_is_dead_lettered_and_the_command_goes_on(parts) -> None:  # noqa: ANN001
    """A hook's failure other than the broker's (a bug, an index value over the bound) is not
    the command's: were its state left unwritten after its records are on the log, the next
    command would be given the same seqs. The record goes to ``<log>.dlq`` with the reason."""
    journal, out, table, writer = parts

    async def hook(env: Envelope, partition: int, offset: int) -> None:  # noqa: ARG001
        if env.id == "c1-2":
            raise ValueError("an index value over the bound")
        journal.append(("hook", env.id))

    writer.on_recorded(CONVERSATIONS, hook)
    run(writer.dispatch(start()))
    run(writer.dispatch(send("c1")))  # its TurnOpened (folding the message): seq 2 on
    assert [a.outcome for a in out.acks()] == ["accepted", "accepted"]
    seq = table[CNV]["seq"]
    assert seq > 1 and journal[-1] == ("table", CNV)  # written: the seqs moved on
    [(topic, value, headers)] = out.dlq
    assert topic == "t.voice.conversations.dlq"
    assert value == encode(out.log()[1])[1] and headers["ce_id"] == b"c1-2"
    assert headers["voice_dlq_reason"].startswith(b"test_a_record_a_hook_fails_on_is_dead_")
    assert b"could not take 'voice.conversation.turn_opened.v1': ValueError" in headers[
        "voice_dlq_reason"]
    assert headers["voice_dlq_offset"] == b"1"
    run(writer.dispatch(send("c2")))  # the next command: the next seqs, told as before
    assert out.log()[-1].seq == seq + 1
    assert journal[-2:] == [("hook", f"c2-{seq + 1}"), ("table", CNV)]


def test_what_a_command_starts_refused_for_good_is_dead_lettered_and_the_command_goes_on(
        parts) -> None:  # noqa: ANN001
    """A follow-up too large for its topic is refused at every try: tried for ever, it would
    hold its aggregate's commands (and the partition's offsets) for good. It goes to
    ``<its topic>.dlq`` with the reason; the command's state is written and the next goes on."""
    journal, out, table, writer = parts
    writer.backoff = RetryPolicy(initial_s=0.001, max_s=0.001)
    run(writer.dispatch(start()))
    out.too_large_for = {"voice.workflows"}
    run(asyncio.wait_for(writer.dispatch(send("c1")), 5))
    turn = f"{CNV}:turn-2:1"
    [(topic, value, headers)] = out.dlq
    assert topic == "t.voice.workflows.dlq"
    assert value == encode(out.of(WORKFLOWS)[-1])[1] and headers["ce_id"] == turn.encode()
    assert headers["voice_dlq_reason"].startswith(b"what c1-2 started was refused for good: ")
    assert b"too large" in headers["voice_dlq_reason"]
    assert journal[-1] == ("table", CNV)
    seq = ConversationState.from_dict(table[CNV]).seq  # type: ignore[union-attr]
    assert [a.outcome for a in out.acks()] == ["accepted", "accepted"]
    out.too_large_for = set()
    run(writer.dispatch(send("c2")))  # the conversation's next command: the next seqs
    assert out.log()[-1].seq == seq + 1 and journal[-1] == ("table", CNV)


def test_a_record_whose_hook_the_broker_refuses_for_good_is_dead_lettered(parts) -> None:  # noqa: ANN001
    """A hook's produce refused as too large is its failure, not the broker's passing one:
    dead-lettered like any other, not tried for ever."""
    journal, out, table, writer = parts
    writer.backoff = RetryPolicy(initial_s=0.001, max_s=0.001)
    calls: list[str] = []

    async def hook(env: Envelope, partition: int, offset: int) -> None:  # noqa: ARG001
        calls.append(env.id)
        if env.id == "c1-2":
            raise ProduceError("a record of 2000000 bytes is over the limit", retryable=False,
                               code=KafkaError.MSG_SIZE_TOO_LARGE)

    writer.on_recorded(CONVERSATIONS, hook)
    run(writer.dispatch(start()))
    run(asyncio.wait_for(writer.dispatch(send("c1")), 5))
    assert calls == ["c-start-1", "c1-2"]  # told once: not tried again
    [(topic, _value, headers)] = out.dlq
    assert topic == "t.voice.conversations.dlq" and headers["ce_id"] == b"c1-2"
    assert b"over the limit" in headers["voice_dlq_reason"]
    assert journal[-1] == ("table", CNV) and table[CNV]["seq"] > 1
