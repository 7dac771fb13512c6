"""A participant turn's reply, streamed to live SSE clients as the model writes it.

The concern agent's answer is reply text, then a fenced ``json`` block (the proposal) — or only
``COULD_NOT_INTERPRET: <reason>``. ``ShownText`` decides what of the raw stream a participant
may see while it is written: the text before the first fence, nothing of an answer that is (or
may still become) a refusal, and never a trailing backtick that may open a fence. ``ReplyStream``
wraps the turn's ``EffectSink``: every effect goes on as before; each piece of shown text also
becomes a ``ReplyDelta`` on ``voice.deltas`` (sealed with the conversation's key, keyed by the
conversation), produced without waiting on the turn's path. Deltas are transient: the turn's
``ReplyRecorded`` on the conversation's log is the reply, and what a client that reconnects
gets once. A fallback that discards a partial stream starts the shown text again (a new
``attempt`` of the stream, offsets from 0).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from consumers.engine import EffectSink
from consumers.engine.types import DisplayChunk, Effect
from schemas.conversation import ReplyDelta
from streams.envelope import Envelope
from streams.producer import Publisher
from streams.sealing import Sealer
from streams.topics import DELTAS

log = logging.getLogger(__name__)

FENCE = "```"
REFUSAL = "COULD_NOT_INTERPRET:"


class ShownText:
    """The part of a streamed answer a participant may see so far."""

    def __init__(self) -> None:
        self.raw = ""
        self.sent = 0
        """Characters of shown text already handed out."""

    def add(self, delta: str) -> str:
        """Take ``delta``; the newly shown text (maybe empty)."""
        self.raw += delta
        shown = self.shown()
        new = shown[self.sent:] if len(shown) > self.sent else ""
        self.sent = max(self.sent, len(shown))
        return new

    def shown(self) -> str:
        head = self.raw.lstrip()
        if REFUSAL.startswith(head[:len(REFUSAL)]):  # a refusal, or may still become one
            return ""
        fence = self.raw.find(FENCE)
        text = self.raw[:fence] if fence >= 0 else self.raw.rstrip("`")
        return text.rstrip() if fence >= 0 else text

    def restart(self) -> None:
        self.raw, self.sent = "", 0


class ReplyStream:
    """An ``EffectSink`` that also streams the turn's shown reply text as ``ReplyDelta``s."""

    def __init__(self, inner: EffectSink, publisher: Publisher, sealer: Sealer,
                 conversation: str, turn: str, tenant: str | None) -> None:
        self.inner = inner
        self.publisher = publisher
        self.sealer = sealer
        self.conversation, self.turn, self.tenant = conversation, turn, tenant
        self.text = ShownText()
        self.attempt = 1
        self._pending: list[asyncio.Future[Any]] = []

    async def emit(self, effect: Effect) -> None:
        await self.inner.emit(effect)
        if not isinstance(effect, DisplayChunk):
            return
        event = effect.event
        if event.type == "warning" and event.data.get("discard_partial"):
            self.text.restart()  # the fallback model writes the reply again
            self.attempt += 1
        elif event.type == "text_delta":
            offset = self.text.sent
            piece = self.text.add(str(event.data.get("text", "")))
            if piece:
                self._send(offset, piece)

    def _send(self, offset: int, piece: str) -> None:
        content_id = ReplyDelta.content_id(self.turn, self.attempt, offset)
        record = ReplyDelta(conversation=self.conversation, turn=self.turn,
                            attempt=self.attempt, offset=offset,
                            text=self.sealer.seal(self.conversation, content_id, piece))
        env = Envelope(record=record, key=self.conversation, source="/voice/turn-worker",
                       subject=self.turn, tenant=self.tenant, correlation=self.turn)
        self._pending.append(asyncio.ensure_future(self._produce(env)))

    async def _produce(self, env: Envelope) -> None:
        try:
            await self.publisher.send(DELTAS, env)
        except Exception as exc:  # a live nicety: the reply itself is recorded by the step
            log.warning("a reply delta of %s was not produced: %s", self.turn,
                        type(exc).__name__)

    async def drain(self) -> None:
        await self.inner.drain()
        pending, self._pending = self._pending, []
        if pending:
            await asyncio.gather(*pending)
