"""Free text outside the seal (issue 12 §5): a reason or an error that may quote a participant
or a model is sealed with its aggregate's key beside a plain code, or only described.

Each test puts a marker where a participant's or a model's words would be, and looks for it in
everything Voice writes: the records as encoded for Kafka, the workflow table's value (what
its changelog holds), dead-letter reasons, telemetry rows and log lines. Before this change
each of them carried the marker in plain text.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from consumers.conversations.concern import ConcernReply
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef, WorkflowState
from consumers.workflows.runtime import Erased, WorkflowRuntime, failure_words
from schemas.conversation import RecordTurnResults, TurnStateChanged
from schemas.workflow import WorkflowStarted
from streams.envelope import DecodeError, Envelope, decode, encode
from streams.free_text import describe, open_text, seal_text
from streams.producer import Publisher, RecordTooLarge
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.topics import COMMANDS
from telemetry.rows import RawRecord, map_record
from tests.unit.test_transcript_refs import CNV, Conversation

MARKER = "zqxmarker-Hannelore-7731"


def plain(env: Envelope) -> str:
    """Everything of a record as it goes on Kafka: key, value and headers."""
    key, value, headers = encode(env)
    return repr((key, value, headers))


# --- describe: the plain form of an exception ----------------------------------------------


class Payload(BaseModel):
    text: int


def test_describe_keeps_codes_and_fields_never_values() -> None:
    with pytest.raises(ValidationError) as caught:
        Payload.model_validate({"text": MARKER})
    assert describe(caught.value) == "ValidationError: text: int_parsing"
    assert describe(ValueError(f"cannot apply {MARKER}")) == "ValueError"
    # Voice's own words (ids, sizes, settings) are kept: their class says so.
    too_large = RecordTooLarge("voice.commands", 2_000_000, 900_000)
    assert "over the limit of 900000" in describe(too_large)


def test_a_decode_error_names_the_field_not_its_value() -> None:
    env = Envelope(record=TurnStateChanged(conversation=CNV, turn="t", state="Thinking"),
                   key=CNV, source="/t")
    key, value, headers = encode(env)
    bad = value.replace(b'"Thinking"', json.dumps(MARKER).encode())
    with pytest.raises(DecodeError) as caught:
        decode(key, bad, headers)
    assert MARKER not in caught.value.reason and "state: literal_error" in caught.value.reason
    # The sink keeps the undecodable record's reason in a column: plain too.
    rows = map_record(RawRecord("t.voice.conversations", 0, 1, key, bad, headers))
    [event] = rows.as_dicts("events")
    assert event["ce_type"] == "undecodable" and MARKER not in event["decode_error"]


def test_sealed_text_opens_for_its_aggregate_until_erasure() -> None:
    sealer = Sealer(MemoryKeyStore())
    sealed = seal_text(sealer, CNV, "t:reason", f"words {MARKER}")
    assert MARKER not in sealed.model_dump_json()
    assert open_text(sealer, CNV, "t:reason", sealed) == f"words {MARKER}"
    assert open_text(sealer, CNV, "other:reason", sealed) is None  # bound to its content id
    sealer.erase(CNV)
    assert open_text(sealer, CNV, "t:reason", sealed) is None


# --- a conversation turn that could not interpret the message -------------------------------


class Uninterpretable:
    """The concern agent answering ``COULD_NOT_INTERPRET`` with a quote of the message."""

    async def __call__(self, conversation: str, turn: str, attempt: int,
                       history: list[dict[str, Any]], *_: Any) -> ConcernReply:
        quoted = history[-1]["content"]
        return ConcernReply(text="", proposal=None,
                            could_not_interpret=f'the message "{quoted}" looks like gibberish')


async def test_could_not_interpret_seals_the_models_words_and_keeps_a_code() -> None:
    c = Conversation()
    c.turns.agent = Uninterpretable()
    started = await c.message(f"{MARKER} {MARKER}")
    assert (await c.run(started))["state"] == "CouldNotInterpret"
    [state] = [e for e in c.out.of(COMMANDS) if isinstance(e.record, RecordTurnResults)]
    rec = state.record.ended
    assert isinstance(rec, TurnStateChanged) and state.record.reply is None
    assert rec.reason is None and rec.reason_code == "could_not_interpret"
    assert MARKER not in plain(state), "the model's quote of the participant is sealed"
    words = open_text(c.sealer, CNV, f"{rec.turn}:reason", rec.sealed_reason)
    assert words is not None and MARKER in words  # the owner still reads why
    c.sealer.erase(CNV)
    assert open_text(c.sealer, CNV, f"{rec.turn}:reason", rec.sealed_reason) is None


# --- a failing workflow step -----------------------------------------------------------------


class Producer:
    def __init__(self) -> None:
        self.sent: list[Envelope] = []

    def produce_raw(self, topic: str, key: bytes, value: bytes, headers: Any) -> Any:
        self.sent.append(decode(key, value, headers))
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


async def _fail_a_workflow(sealer: Sealer, caplog: pytest.LogCaptureFixture,
                           failure: Exception | None = None
                           ) -> tuple[Producer, dict[str, Any], list[WorkflowState]]:
    async def step(ctx: StepContext) -> dict[str, Any]:
        raise failure or ValueError(f"the model said: {MARKER}")

    ended: list[WorkflowState] = []

    async def on_end(state: WorkflowState) -> None:
        ended.append(state)

    producer, table = Producer(), {}
    settings = VoiceSettings(step_attempts=2)
    rt = WorkflowRuntime(settings, table, Publisher(settings, lambda: producer),  # type: ignore[arg-type, return-value]
                         sealer)
    rt.register(WorkflowDef("k", (StepDef("s", step),), on_end=on_end,
                            sealed_by=lambda i: i["conversation"]))
    env = Envelope(record=WorkflowStarted(workflow="w1", kind="k",
                                          input={"conversation": CNV}), key="w1", source="/t",
                   seq=1)
    with caplog.at_level(logging.DEBUG):
        await rt.handle(env, lambda: None)
        for _ in range(200):
            await asyncio.sleep(0)
            outcomes = [e for e in producer.sent if e.type.endswith("step_outcome.v1")]
            for outcome in outcomes:
                producer.sent.remove(outcome)
                await rt.handle(outcome, lambda: None)
            if ended:
                break
    return producer, table, ended


async def test_a_failing_steps_message_is_sealed_in_every_record_and_the_table(
        caplog: pytest.LogCaptureFixture) -> None:
    sealer = Sealer(MemoryKeyStore())
    producer, table, ended = await _fail_a_workflow(sealer, caplog)
    assert ended and ended[0].status == "failed"
    types = [e.type for e in producer.sent]
    assert types.count("voice.workflow.step_failed.v1") == 2
    assert "voice.workflow.failed.v1" in types
    for env in producer.sent:
        assert MARKER not in plain(env), env.type
        rows = map_record(RawRecord("t.voice.workflows", 0, 1, *encode(env)))
        assert MARKER not in repr(rows.tables), env.type
    assert MARKER not in json.dumps(table), "the workflows changelog holds the state"
    assert MARKER not in caplog.text, "log lines describe, never quote"
    failed = next(e.record for e in producer.sent if e.type == "voice.workflow.failed.v1")
    assert (failed.error, failed.error_type, failed.sealed_by) == ("ValueError", "ValueError",
                                                                   CNV)
    # Its words open for the aggregate's owner (e.g. the turn's reason), until erasure.
    assert failure_words(sealer, ended[0]) == f"ValueError: the model said: {MARKER}"
    sealer.erase(CNV)
    assert failure_words(sealer, ended[0]) == "ValueError"


async def test_a_step_ended_by_erasure_says_so_in_plain_words(
        caplog: pytest.LogCaptureFixture) -> None:
    """Regression: the erasure's reason was reduced to the code ``StepError`` and sealed under
    the erased key, so no one could ever read why the turn failed."""
    sealer = Sealer(MemoryKeyStore())
    sealer.create(CNV)
    sealer.erase(CNV)
    producer, _table, ended = await _fail_a_workflow(sealer, caplog, Erased("conversation", CNV))
    assert ended and ended[0].status == "failed"
    failed = next(e.record for e in producer.sent if e.type == "voice.workflow.failed.v1")
    assert failed.error == f"Erased: conversation {CNV!r} was erased"
    assert failed.attempts == 1, "an erased aggregate is not retried"
    assert failure_words(sealer, ended[0]) == failed.error


async def test_without_an_aggregate_to_seal_under_only_the_code_is_kept(
        caplog: pytest.LogCaptureFixture) -> None:
    producer, table, ended = await _fail_a_workflow(None, caplog)  # type: ignore[arg-type]
    assert ended and all(MARKER not in plain(e) for e in producer.sent)
    failed = next(e.record for e in producer.sent if e.type == "voice.workflow.failed.v1")
    assert failed.sealed_error is None and failed.error_type == "ValueError"


def test_an_assistant_turns_end_keeps_error_kinds_plain_and_their_words_sealed() -> None:
    from types import SimpleNamespace

    from consumers.assistant.worker import Assistant

    assistant = Assistant()
    assistant.ctx = SimpleNamespace(sealer=Sealer(MemoryKeyStore()))  # type: ignore[assignment]
    ended = assistant._ended("c1", "c1:turn-1", "Replied", "error", "model_error",
                             f"model_error: the model said {MARKER}")
    assert ended.reason is None and ended.reason_code == "model_error"
    assert MARKER not in ended.model_dump_json()
    assert MARKER in (open_text(assistant.sealer, "c1", "c1:turn-1:reason", ended.sealed_reason)
                      or "")
    assistant.sealer.erase("c1")  # erased meanwhile: the code alone, nothing sealed anew
    gone = assistant._ended("c1", "c1:turn-2", "Failed", "error", "step_failed", "words")
    assert gone.sealed_reason is None and gone.reason_code == "step_failed"
