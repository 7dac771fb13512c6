"""``python -m bench.patched_worker``: ``voice worker`` with what-if patches, for measuring a
suggested change to production code *before* anyone makes it. Never used by ``voice up``.

``VOICE_BENCH_WORKER_PATCHES`` names the patches (comma-separated):

* ``spinner`` — Faust's ``Worker`` always builds a terminal spinner, and
  ``faust.worker.Worker._setup_spinner_handler`` then sets the *root logger* to DEBUG, so every
  ``log.debug`` in aiokafka and Faust builds a ``LogRecord`` that no handler prints. The patch
  drops the spinner (``worker.spinner = None`` before ``execute_from_commandline``), which is
  the change suggested for ``consumers.app.run_worker``.
* ``effects_nowait`` — ``KafkaEffectSink.emit`` produces the record and returns at once
  instead of awaiting its ack; the turn awaits every pending ack at its end, before the step
  submits the reply (so the agent's records are still durable before the reply is recorded,
  and before the step's outcome). Same keys, same partition, idempotent producer: order is
  unchanged. The suggested change to ``consumers/engine/effects.py`` + ``consumers/app.py``.
* ``submit_together`` — ``Turns.reply_step`` produces its reply, proposal and state commands
  together and awaits their acks once, instead of one produce-and-ack after the other.

Each patch replaces a function at import time; nothing on disk changes.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any


def _patch_effects_nowait() -> None:
    from consumers import app as worker_app
    from consumers.engine import effects
    from streams.envelope import Envelope, encode

    async def emit(self: Any, effect: Any) -> None:
        record = effects.to_record(effect, self._workflow, self._sealer)
        topic = (self._telemetry_topic if isinstance(effect, effects.TelemetryEffect)
                 else self._agent_topic)
        env = Envelope(record=record, key=self._workflow, source=self._source,
                       subject=effect.turn_id, tenant=self._tenant,
                       correlation=self._workflow, causation=self._causation, id=effect.key)
        key, value, headers = encode(env)
        pending = self.__dict__.setdefault("_pending", [])
        pending.append(self._producer.produce_raw(topic, key, value, headers))

    async def drain(self: Any) -> None:
        pending, self.__dict__["_pending"] = self.__dict__.get("_pending", []), []
        if pending:
            await asyncio.gather(*pending)

    effects.KafkaEffectSink.emit = emit  # type: ignore[method-assign]
    effects.KafkaEffectSink.drain = drain  # type: ignore[attr-defined]

    async def concern_agent(self: Any, conversation: str, turn: str, attempt: int,
                            history: list[dict[str, Any]]) -> Any:
        if self._client is None:
            self._client = worker_app.model_client(self.settings)
        sink = worker_app.KafkaEffectSink(self.producer, self.settings, turn, self.sealer)
        try:
            return await worker_app.run_concern_extraction(self.concern_spec, self._client, sink,
                                                           conversation, turn, attempt, history)
        finally:
            await sink.drain()  # every record of the turn is acked before the reply goes out

    worker_app.Worker._concern_agent = concern_agent  # type: ignore[method-assign]


def _patch_submit_together() -> None:
    from consumers import turns
    from schemas.conversation import ProposalRecorded, ReplyRecorded, TurnStateChanged
    from streams.envelope import Envelope, encode
    from streams.sealing import KeyErased
    from streams.topics import COMMANDS, topic_name

    async def reply_step(self: Any, ctx: Any) -> dict[str, Any]:
        conversation, turn = ctx.input["conversation"], ctx.input["turn"]
        try:
            history = turns.open_transcript(self.sealer, conversation, ctx.input["transcript"])
        except KeyErased:
            raise turns.StepError(f"conversation {conversation!r} was erased",
                                  retryable=False) from None
        if not history or history[-1]["role"] != "user":
            raise turns.StepError(f"turn {turn!r} has no participant message", retryable=False)
        reply = await self.agent(conversation, turn, ctx.attempt, history)
        tenant = ctx.input.get("tenant")
        topic = topic_name(self.settings, COMMANDS)
        futs = []

        def submit(part: str, record: Any) -> None:
            env = Envelope(record=record, key=conversation, source=turns.SOURCE,
                           subject=conversation, tenant=tenant, correlation=turn,
                           id=f"{turn}:{part}")
            futs.append(self._producer().produce_raw(topic, *encode(env)))

        if reply.could_not_interpret:
            submit("state", TurnStateChanged(
                conversation=conversation, turn=turn, state="CouldNotInterpret",
                reason=f"the agent could not interpret the message: {reply.could_not_interpret}"))
            await asyncio.gather(*futs)
            return {"state": "CouldNotInterpret"}
        reply_id = f"{turn}:reply"
        submit("reply", ReplyRecorded(conversation=conversation, turn=turn, reply_id=reply_id,
                                      text=self.sealer.seal(conversation, reply_id,
                                                            reply.text or "…")))
        if reply.proposal is not None:
            proposal_id = f"{turn}:proposal"
            submit("proposal", ProposalRecorded(
                conversation=conversation, turn=turn, proposal_id=proposal_id,
                proposal=self.sealer.seal_json(conversation, proposal_id,
                                               reply.proposal.model_dump(mode="json"))))
        submit("state", TurnStateChanged(conversation=conversation, turn=turn, state="Replied"))
        await asyncio.gather(*futs)
        return {"state": "Replied", "reply_id": reply_id,
                "proposal": reply.proposal is not None}

    turns.Turns.reply_step = reply_step  # type: ignore[method-assign]


def main() -> None:
    from bench.settings import BenchSettings, patch_names

    patches = patch_names(BenchSettings().worker_patches)
    unknown = patches - {"spinner", "effects_nowait", "submit_together"}
    if unknown:
        raise SystemExit(f"unknown patches: {sorted(unknown)}")
    if "effects_nowait" in patches:
        _patch_effects_nowait()
    if "submit_together" in patches:
        _patch_submit_together()

    from faust.worker import Worker as FaustWorker

    from consumers.app import create_worker
    from deploy.cli import _settings

    sys.argv = [sys.argv[0]]
    w = create_worker(_settings())
    fw = FaustWorker(w.app, loglevel="warning", quiet=True)
    if "spinner" in patches:
        fw.spinner = None
    fw.execute_from_commandline()


if __name__ == "__main__":
    main()
