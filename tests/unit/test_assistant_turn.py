"""An assistant turn on the engine, in process: the Louisiana map example on the model
simulator, where its effects go (the sequencer's commands, sealed), the transcript fold, the
history, and suggested context from patterns in ``[CURRENT_STATE]``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from consumers.assistant.agent import history_messages, state_text, user_content
from consumers.assistant.datasets import MemoryDatasets, from_csv
from consumers.assistant.patterns import Pattern, keywords, provisional, rank, tools_used
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.transcript import EXTRACT_KIND, TURN_KIND, Transcript
from consumers.assistant.turn import ConversationSink, run_assistant_turn
from consumers.engine import RecordingSink
from consumers.engine.testing import ScriptedModel, text
from consumers.frame.logrefs import MemoryLogReader
from deploy.simulator import serve_simulator
from schemas.assistant import (
    AppendDisplay,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    DatasetRef,
)
from schemas.base import Record
from streams.assistant_settings import AssistantSettings
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer
from streams.topics import ASSISTANT

CSV = (Path(__file__).resolve().parents[1] / "fixtures" / "assistant_facilities.csv").read_text()
DS = "0123456789abcdef" * 2
CONV = str(uuid.UUID(int=7))
TURN = f"{CONV}:turn-2"
REQUEST = {"message": "Show me RCRA facilities in Louisiana on a map", "file_context": [],
           "datasets": [{"dataset_id": DS, "name": "facilities.csv", "rows": 12,
                         "columns": ["name", "state", "lat", "lon", "program"]}]}


@pytest.fixture(scope="module")
def box() -> Iterator[SqlBox]:
    b = SqlBox(timeout_s=20)
    yield b
    b.close()


@pytest.fixture(scope="module")
def simulator() -> Iterator[anthropic.AsyncAnthropic]:
    with serve_simulator() as url:
        yield anthropic.AsyncAnthropic(api_key="simulator", base_url=url, max_retries=0)


def settings(tmp_path: Path) -> AssistantSettings:
    return AssistantSettings(env="test", state_dir=tmp_path, kafka_bootstrap="127.0.0.1:1")


class Commands:
    def __init__(self) -> None:
        self.sent: list[tuple[Record, str]] = []

    async def __call__(self, record: Record, command_id: str) -> None:
        self.sent.append((record, command_id))


async def test_the_louisiana_map_example_on_the_simulator(tmp_path: Path, box: SqlBox,
                                                          simulator) -> None:  # noqa: ANN001
    sealer, commands, inner = Sealer(MemoryKeyStore()), Commands(), RecordingSink()
    sink = ConversationSink(inner, commands, sealer, CONV, TURN)
    result, suggested = await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=TURN, owner="alice", attempt=1,
        request=REQUEST, options={"capabilities": ["converse"]},
        refs=[DatasetRef(dataset_id=DS, partition=0, offset=0)],
        history=[], patterns=[], source=MemoryDatasets([from_csv(DS, "alice", "f.csv", CSV)]),
        box=box, client=simulator, sink=sink)
    assert result.end_reason == "end_turn" and suggested == []
    assert tools_used({"structured_content": result.messages_appended}) == [
        "describe_dataset", "query_dataset", "display_map"]
    assert "Louisiana" in result.final_text and "4 matching rows" in result.final_text
    (card,) = result.cards
    features = card["card_data"]["features"]
    assert card["card_type"] == "map_display" and len(features) == 4
    assert {f["properties"]["state"] for f in features} == {"LA"}
    # Every display event went to the sequencer too, in order, with its data sealed.
    shown = [r for r, _ in commands.sent if isinstance(r, AppendDisplay)]
    assert [r.event.event_id for r in shown] == [e.id for e in inner.display()]
    assert [r.event.type for r in shown][-3:] == ["cost", "idle", "done"]
    card_cmd = next(r for r in shown if r.event.type == "card")
    opened = sealer.open_json(CONV, f"{card_cmd.event.event_id}/data", card_cmd.event.data)
    assert opened["card_data"]["features"] == features
    (reply,) = [r for r, _ in commands.sent if isinstance(r, AssistantReplyRecorded)]
    chain = sealer.open_json(CONV, f"{reply.reply_id}/chain", reply.chain)
    assert chain["text"] == result.final_text


async def test_suggested_context_reaches_current_state(tmp_path: Path, box: SqlBox) -> None:
    patterns = [
        Pattern("p1", f"{CONV}:turn-2", "provisional", "Asked: map of Louisiana RCRA sites",
                ("map", "louisiana", "rcra", "site"), 10),
        Pattern("p2", f"{CONV}:turn-2", "extracted", "Summary: RCRA sites by state on a map",
                ("rcra", "site", "state", "map"), 12),
        Pattern("p3", f"{CONV}:turn-5", "extracted", "Summary: average rainfall per county",
                ("average", "rainfall", "county"), 20),
    ]
    model = ScriptedModel([[text("ok")]])
    result, suggested = await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=f"{CONV}:turn-9", owner="alice",
        attempt=1, request={**REQUEST, "message": "Which RCRA sites are in Texas?"},
        options={}, refs=[DatasetRef(dataset_id=DS, partition=0, offset=0)], history=[],
        patterns=patterns, source=MemoryDatasets([from_csv(DS, "alice", "f.csv", CSV)]),
        box=box, client=model, sink=RecordingSink())
    assert [p.pattern_id for p in suggested] == ["p2"]  # extracted stands in for provisional
    state = model.requests[0].messages[-1]["content"][0]["text"]
    assert state.startswith("[CURRENT_STATE]")
    assert "[SUGGESTED CONTEXT]" in state and "Summary: RCRA sites by state" in state
    assert "rainfall" not in state and f"ID: {DS}" in state
    isolated = ScriptedModel([[text("ok")]])
    _, none = await run_assistant_turn(
        settings(tmp_path), conversation=CONV, turn=f"{CONV}:turn-11", owner="alice",
        attempt=1, request={**REQUEST, "message": "Which RCRA sites are in Texas?"},
        options={"data_isolation": True}, refs=[], history=[], patterns=patterns,
        source=MemoryDatasets(), box=box, client=isolated, sink=RecordingSink())
    assert none == [] and "SUGGESTED" not in isolated.requests[0].messages[-1]["content"][0][
        "text"]


def test_rank_and_provisional_patterns() -> None:
    assert keywords("Show me the RCRA facilities in Louisiana!") == ["rcra", "facilitie",
                                                                     "louisiana"]
    p = provisional(REQUEST, {"structured_content": [
        {"role": "assistant", "content": [{"type": "tool_use", "name": "query_dataset"}]}]})
    assert p["text"].startswith("Asked: Show me RCRA") and "query_dataset" in p["text"]
    assert "louisiana" in p["keywords"]
    assert rank([Pattern("a", "t1", "provisional", "x", ("rainfall",))], "rcra map") == []


def test_history_alternates_and_carries_the_tool_chain() -> None:
    chain = {"text": "done", "structured_content": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "u1", "name": "q",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1",
                                      "content": "{}"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "done"}]}]}
    msgs = history_messages([("assistant", chain), ("user", REQUEST), ("assistant", chain),
                             ("user", {"message": "again"}), ("user", {"message": "more"})])
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert "Attached datasets:" in msgs[0]["content"] and f"ID: {DS}" in msgs[0]["content"]
    assert [b["text"] for b in msgs[-1]["content"]] == ["again", "more"]
    assert "[Dataset: facilities.csv | 12 rows × 5 columns" in user_content(REQUEST)
    assert "[ACTIVE DATASETS]" in state_text(REQUEST, {"agentic_mode": True}, [])


async def test_the_transcript_starts_turns_and_extractions_with_positions() -> None:
    """The index holds positions, never content; a turn's input refers to its records, which
    the step reads back from the log and opens."""
    sealer = Sealer(MemoryKeyStore())
    log = MemoryLogReader()
    t = Transcript()
    req = sealer.seal_json(CONV, "m1", REQUEST)

    def fold(rec: Record, seq: int) -> list | None:
        e = Envelope(record=rec, key=CONV, source="/t", seq=seq, tenant="default")
        return t.apply(e, 1, log.append(ASSISTANT, 1, e), 10_000, 5)

    ((kind, workflow, inp),) = fold(AssistantTurnRequested(
        conversation=CONV, turn=TURN, message_id="m1", request=req, after=0, at="now"), 2)
    assert (kind, workflow, inp["log"]["transcript"]) == (TURN_KIND, TURN, [])
    assert inp["log"] == {"partition": 1, "request": [2, 0], "summary": [], "transcript": [],
                          "omitted_through": 0, "patterns": []}
    assert req.ciphertext not in json.dumps(inp) and req.ciphertext not in json.dumps(t.to_dict())
    got = await Transcript.read(log, CONV, inp["log"], "request", "transcript", "patterns")
    assert Transcript.open_request(sealer, CONV, got["request"][0])["message"] == \
        REQUEST["message"]
    chain = sealer.seal_json(CONV, "r1/chain", {"text": "hi", "structured_content": []})
    cards = sealer.seal_json(CONV, "r1/cards", {"cards": []})
    reply = AssistantReplyRecorded(conversation=CONV, turn=TURN, reply_id="r1", chain=chain,
                                   cards=cards)
    assert fold(reply, 3) == []
    assert fold(reply, 3) is None, "a redelivery changes nothing"
    ((kind, workflow, inp),) = fold(AssistantTurnEnded(conversation=CONV, turn=TURN,
                                                      state="Replied"), 4)
    assert (kind, workflow) == (EXTRACT_KIND, f"{TURN}:extract")
    got = await Transcript.read(log, CONV, inp["log"], "user", "assistant")
    request, answer = Transcript.open_exchange(sealer, CONV, got["user"][0], got["assistant"][0])
    assert request["message"] == REQUEST["message"] and answer["text"] == "hi"
    # The next turn reads the first exchange as its history.
    req2 = sealer.seal_json(CONV, "m2", {"message": "and Texas?"})
    ((_, _, inp),) = fold(AssistantTurnRequested(
        conversation=CONV, turn=f"{CONV}:turn-5", message_id="m2", request=req2, after=0,
        at="now"), 5)
    assert inp["log"]["transcript"] == [[2, 0], [3, 1]]
    got = await Transcript.read(log, CONV, inp["log"], "request", "transcript", "patterns")
    history, seqs = Transcript.open_history(sealer, CONV, got["transcript"])
    assert [m["role"] for m in history] == ["user", "assistant"] and seqs == [2, 3]


def test_the_assistant_index_stays_small_however_long_the_conversation() -> None:
    """A thousand turns of 20 KB requests: the table value holds positions within twice the
    history budget, and each turn's input names at most what fits the budget."""
    t = Transcript()
    sealer = Sealer(MemoryKeyStore())
    big = sealer.seal_json(CONV, "m", {"message": "x" * 20_000})
    inputs, sizes = [], []
    for n in range(1, 1000):
        e = Envelope(record=AssistantTurnRequested(conversation=CONV, turn=f"{CONV}:turn-{n}",
                                                   message_id="m", request=big, after=0,
                                                   at="now"), key=CONV, source="/t", seq=n)
        inputs += [inp for _, _, inp in t.apply(e, 0, n, 256 * 1024, 5) or []]
        sizes.append(len(json.dumps(t.to_dict())))
    assert max(sizes) < 4_000 and sizes[-1] <= sizes[99] * 1.1, "it does not grow"
    assert max(len(json.dumps(i)) for i in inputs) < 2_000
    assert len(inputs[-1]["log"]["transcript"]) == 256 * 1024 // len(big.ciphertext)
    # what no longer fits is said to be left out, through the seq before the oldest read
    assert inputs[-1]["log"]["omitted_through"] == inputs[-1]["log"]["transcript"][0][0] - 1
