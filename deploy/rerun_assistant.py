"""``voice replay assistant``: an assistant chat read back from its log, and its turns re-run.

``replay_assistant`` prints the chat's records on ``voice.assistant`` in seq order: display
events as the SSE ``display`` events its owner's clients got, every other record as one line,
sealed content opened with the chat's key (``<erased>`` once the key is gone: replay cannot
bring it back either).

``rerun_assistant_turn`` runs a recorded ``assistant-turn`` again: the request, history and
patterns its input names are read from the recorded log and opened as the worker's step opens
them (``Transcript.open_turn``), the turn is built as the worker builds it
(``prepare_assistant_turn``), and the engine re-runs it with the recorded model and tool
results (``consumers.engine.rerun``). Patterns the tenant learned in *other* chats reach only
the model's ``[CURRENT_STATE]``; replay compares the model and tool calls and the step's
outcome, not the prompt, so they are not needed.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from api.assistant.views import display_event
from consumers.assistant.datasets import MemoryDatasets
from consumers.assistant.images import MemoryImages
from consumers.assistant.sqlbox import SqlBox
from consumers.assistant.transcript import TURN_KIND, Transcript
from consumers.assistant.turn import OUTCOMES, prepare_assistant_turn
from consumers.engine import effects_from_envelopes, rerun
from consumers.frame.logrefs import LogUnavailable
from consumers.workflows.engine import StepContext, StepDef, WorkflowDef
from deploy.histories import Recorded
from deploy.rerun_steps import succeeded_steps
from schemas.assistant import (
    AssistantConversationErased,
    AssistantDisplayRecorded,
    AssistantHistorySummarised,
    AssistantPatternRecorded,
    AssistantReplyRecorded,
    AssistantTurnEnded,
    AssistantTurnRequested,
    DatasetRef,
)
from schemas.base import Sealed
from streams.assistant_settings import assistant_settings
from streams.envelope import Envelope
from streams.sealing import KeyErased, KeyNotFound, Sealer
from streams.settings import VoiceSettings
from streams.topics import AGENT, WORKFLOWS


def _sealed_fields(rec: Any) -> dict[str, tuple[str, bool]]:
    """field → (content id, is JSON) of a log record's sealed content."""
    if isinstance(rec, AssistantTurnRequested):
        return {"request": (rec.message_id, True)}
    if isinstance(rec, AssistantReplyRecorded):
        return {"chain": (f"{rec.reply_id}/chain", True), "cards": (f"{rec.reply_id}/cards", True)}
    if isinstance(rec, AssistantPatternRecorded):
        return {"text": (rec.pattern_id, True)}
    if isinstance(rec, AssistantHistorySummarised):
        return {"text": (rec.summary_id, False)}
    if isinstance(rec, AssistantTurnEnded):
        return {"sealed_reason": (f"{rec.turn}:reason", False)}
    return {}


def _opened(sealer: Sealer, chat: str, env: Envelope) -> dict[str, Any]:
    payload = env.record.model_dump(mode="json")
    for name, (content_id, is_json) in _sealed_fields(env.record).items():
        sealed = getattr(env.record, name)
        if not isinstance(sealed, Sealed):
            continue
        try:
            payload[name] = (sealer.open_json(chat, content_id, sealed) if is_json
                             else sealer.open_text(chat, content_id, sealed))
        except (KeyErased, KeyNotFound):
            payload[name] = "<erased>"
    return payload


def chat_log(envs: list[Envelope]) -> list[Envelope]:
    """A chat's records in seq order, each once (a redelivered record was applied once)."""
    out: dict[int, Envelope] = {}
    for env in envs:
        if env.seq is not None:
            out.setdefault(env.seq, env)
    return [out[s] for s in sorted(out)]


def replay_assistant(envs: list[Envelope], chat: str, sealer: Sealer) -> Iterator[str]:
    """The chat's records: display events as SSE, the rest one line each, content opened."""
    for env in chat_log(envs):
        rec = env.record
        if isinstance(rec, AssistantDisplayRecorded):
            try:
                data = display_event(sealer, chat, rec.event)
            except (KeyErased, KeyNotFound):
                yield (f"id: {rec.display_seq}\nevent: erased\n"
                       f"data: {json.dumps({'type': rec.event.type})}\n")
                continue
            yield f"id: {rec.display_seq}\nevent: display\ndata: {json.dumps(data)}\n"
            continue
        if isinstance(rec, AssistantConversationErased):
            yield f": seq {env.seq}: chat erased\n"
            continue
        yield (f": seq {env.seq} {env.type} "
               f"{json.dumps(_opened(sealer, chat, env), separators=(',', ':'))}\n")


def turns_of_chat(envs: list[Envelope]) -> list[str]:
    """The assistant-turn workflows a chat started, in order."""
    return [e.record.turn for e in chat_log(envs) if isinstance(e.record, AssistantTurnRequested)]


async def _never(ctx: StepContext) -> dict[str, Any]:
    raise AssertionError("folding only")  # the fold never runs a step


TURN = WorkflowDef(TURN_KIND, (StepDef("reply", _never),))
"""The assistant-turn workflow's shape (one step, ``reply``), for folding its lifecycle."""


async def rerun_assistant_turn(settings: VoiceSettings, rec: Recorded) -> list[str]:
    """Re-run each succeeded attempt of a recorded assistant turn; the divergences."""
    ran = succeeded_steps(TURN, rec.of(WORKFLOWS), settings.step_attempts)
    if not ran:
        return [f"workflow {rec.workflow!r} has no successful step to compare with"]
    found: list[str] = []
    for step in ran:
        inp, attempt = step.ctx.input, step.ctx.attempt
        conversation, turn = inp["conversation"], inp["turn"]
        if "log" not in inp:
            return [f"turn {turn!r} was started by an older worker (its input is a copy): "
                    "not re-run"]
        try:
            records = await Transcript.read(rec.log, conversation, inp["log"],
                                            *Transcript.turn_records(inp["log"]))
            request, history, _seqs, patterns = Transcript.open_turn(
                rec.sealer, conversation, inp["log"], records)
        except LogUnavailable as exc:
            return [str(exc)]
        except (KeyErased, KeyNotFound):
            return [f"chat {conversation!r} was erased: its turns cannot be re-run"]
        options = inp.get("options") or {}
        spec, turn_input, _suggested = await prepare_assistant_turn(
            assistant_settings(settings), conversation=conversation, turn=turn,
            owner=inp["owner"], attempt=attempt, request=request, options=options,
            refs=[DatasetRef.model_validate(r) for r in inp.get("datasets") or []],
            history=history, patterns=patterns, source=MemoryDatasets(), box=SqlBox(),
            tenant=inp.get("tenant"), images=MemoryImages())
        prefix = f"{turn}/a{attempt}/"
        recorded = effects_from_envelopes([e for e in rec.of(AGENT) if e.id.startswith(prefix)],
                                          rec.sealer)
        result, _sink, divergences = await rerun(spec, turn_input, recorded)
        found += divergences
        outcome = {"state": OUTCOMES[result.end_reason], "end_reason": result.end_reason}
        want = {k: step.output.get(k) for k in outcome}
        if want != outcome:
            found.append(f"turn {turn!r}: recorded {want}, re-run {outcome}")
    return found
