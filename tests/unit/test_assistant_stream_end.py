"""A chat's stream (``POST /chat`` with ``stream: true``) ends when its turn has ended on the
edge's view, not at the turn's ``done`` display event: the engine shows ``done`` before the
sequencer ends the turn, and a client that sends its next message as its stream ends must not
be answered 409 "busy" (regression: CI saw exactly that in
``test_an_uploaded_image_reaches_the_model_now_and_in_later_turns``)."""

from __future__ import annotations

import asyncio

from api.assistant.routes import display_stream
from api.assistant.views import AssistantConversations
from schemas.assistant import (
    AssistantConversationStarted,
    AssistantDisplayRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    ChatOptions,
    DisplayPayload,
)
from schemas.base import Record
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer

CONV = "c-1"
TURN = f"{CONV}:turn-2"


class Log:
    def __init__(self, conversations: AssistantConversations, sealer: Sealer) -> None:
        self.conversations, self.sealer, self.seq = conversations, sealer, 0

    def add(self, record: Record) -> None:
        self.seq += 1
        self.conversations.apply(Envelope(record=record, key=CONV, source="/t", seq=self.seq,
                                          tenant="acme"))
        self.conversations.notify(CONV)

    def display(self, n: int, type_: str) -> None:
        event_id = f"e{n}"
        self.add(AssistantDisplayRecorded(
            conversation=CONV, turn=TURN, display_seq=n, event=DisplayPayload(
                event_id=event_id, type=type_, channel="status", message_id=TURN, ts=0.0,
                data=self.sealer.seal_json(CONV, f"{event_id}/data", {}))))


def running() -> Log:
    """A conversation whose turn ``TURN`` runs, as the edge's view has it."""
    sealer = Sealer(MemoryKeyStore())
    sealer.create(CONV)
    log = Log(AssistantConversations(), sealer)
    log.add(AssistantConversationStarted(conversation=CONV, owner="alice"))
    log.add(AssistantTurnRequested(conversation=CONV, turn=TURN, message_id="m",
                                   request=sealer.seal_json(CONV, "m", {}), datasets=[],
                                   options=ChatOptions(), after=0, at="t"))
    return log


async def test_the_stream_ends_after_done_only_once_the_turn_has_ended() -> None:
    log = running()
    conversations, sealer = log.conversations, log.sealer
    log.display(1, "text_complete")
    log.display(2, "done")
    sent: list[str] = []

    async def read() -> None:
        async for sse in display_stream(conversations, sealer, CONV, 0, 10.0, until_done=TURN):
            sent.append(sse.comment or str(sse.id))

    reader = asyncio.create_task(read())
    await asyncio.sleep(0.2)
    assert sent == ["1", "2"] and not reader.done()  # done shown; the turn still runs
    log.add(AssistantTurnEnded(conversation=CONV, turn=TURN, state="Replied",
                               end_reason="done"))
    await asyncio.wait_for(reader, 2)
    assert sent[-1] == "end; turn done; resume with after=2"


async def test_a_stream_whose_turn_has_already_ended_ends_at_done() -> None:
    log = running()
    conversations, sealer = log.conversations, log.sealer
    log.display(1, "done")
    log.add(AssistantTurnEnded(conversation=CONV, turn=TURN, state="Replied",
                               end_reason="done"))
    sent = [sse.comment or str(sse.id) async for sse in
            display_stream(conversations, sealer, CONV, 0, 10.0, until_done=TURN)]
    assert sent == ["1", "end; turn done; resume with after=1"]
