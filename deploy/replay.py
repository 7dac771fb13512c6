"""``voice replay``: read a conversation or a workflow back from Kafka and show, in order, what
its SSE clients saw. Sealed content is opened with the conversation's key; once the key is
erased the content shows as erased — replay cannot bring it back either."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from api.conversations.render import sse_event
from schemas.agent import DisplayEventRecorded, agent_parts
from streams.envelope import DecodeError, Envelope, decode, unfolded
from streams.ids import turn_conversation
from streams.reading import read_topic
from streams.sealing import KeyErased, KeyNotFound, Sealer, sealer_for
from streams.settings import VoiceSettings
from streams.topics import AGENT, CONVERSATIONS, WORKFLOWS, topic_name


def records(settings: VoiceSettings, spec: Any, key: str) -> list[Envelope]:
    """The decoded records of one aggregate, deduped by id, in log order, each folded record
    as the records it stands for (``streams.envelope.unfolded``: what clients saw)."""
    out: list[Envelope] = []
    seen: set[str] = set()
    for msg in read_topic(settings, topic_name(settings, spec), key=key.encode()):
        try:
            env = decode(msg.key(), msg.value(), msg.headers())
        except DecodeError:
            continue  # it is on the DLQ; replay shows what clients saw
        if env.id not in seen:
            seen.add(env.id)
            out.extend(unfolded(env))
    return out


@contextmanager
def _sealing(settings: VoiceSettings, sealer: Sealer | None) -> Iterator[Sealer]:
    """``sealer``, or one of this call's own on the key service, closed at the end."""
    if sealer is not None:
        yield sealer
        return
    own = sealer_for(settings)
    try:
        yield own
    finally:
        own.close()


def sse_wire(event: Any) -> str:
    """One SSE event as it is framed on the wire."""
    data = event.data.model_dump(mode="json") if hasattr(event.data, "model_dump") else event.data
    return f"id: {event.id}\nevent: {event.event}\ndata: {json.dumps(data)}\n"


def replay_conversation(settings: VoiceSettings, conversation: str,
                        sealer: Sealer | None = None) -> Iterator[str]:
    """The conversation's SSE events in seq order (each once), then its erasure if erased."""
    with _sealing(settings, sealer) as opener:
        last = 0
        for env in sorted((e for e in records(settings, CONVERSATIONS, conversation)
                           if e.seq is not None), key=lambda e: e.seq or 0):
            if env.seq is None or env.seq <= last:
                continue  # a redelivered record: clients saw it once
            last = env.seq
            if env.type == "voice.conversation.erased.v1":
                yield f": seq {env.seq}: conversation erased\n"
                continue
            try:
                event = sse_event(opener, env)
            except (KeyErased, KeyNotFound):  # not found: erased, and its tombstone compacted
                yield f"id: {env.seq}\nevent: erased\ndata: {json.dumps({'type': env.type})}\n"
                continue
            if event is not None:
                yield sse_wire(event)


def replay_workflow(settings: VoiceSettings, workflow: str,
                    sealer: Sealer | None = None) -> Iterator[str]:
    """The workflow's lifecycle and its agent's records (display events opened if possible),
    one line per record of the first shapes: a batch of display events, or a model call's
    record with the events around it, as the records they were before (``agent_parts``)."""
    envs = records(settings, WORKFLOWS, workflow) + records(settings, AGENT, workflow)
    envs.sort(key=lambda e: e.time)
    with _sealing(settings, sealer) as opener:
        for env in envs:
            rec = env.record
            parts = [(p.ce_type, p.event_id if isinstance(p, DisplayEventRecorded) else env.id,
                      p) for p in agent_parts(rec)]
            for ce_type, content, part in parts:
                payload = part.model_dump(mode="json")
                conversation = payload.get("conversation_id") or (
                    turn_conversation(workflow))
                for field in ("data", "response", "arguments", "result"):
                    sealed = payload.get(field)
                    if conversation and isinstance(sealed, dict) and "ciphertext" in sealed:
                        payload[field] = _open(opener, conversation, content, field, sealed)
                seq = "-" if env.seq is None else env.seq
                yield f"{env.time.isoformat(timespec='milliseconds')} seq={seq} {ce_type} " \
                      f"{json.dumps(payload, separators=(',', ':'))}"


def _open(sealer: Sealer, conversation: str, content: str, field: str, sealed: dict) -> Any:
    """``field`` of the record (or batched event) whose content ids start with ``content``."""
    from schemas.base import Sealed

    content_id = f"{content}/{field}"
    try:
        return sealer.open_json(conversation, content_id, Sealed.model_validate(sealed))
    except (KeyErased, KeyNotFound):
        return "<erased>"
    except Exception:
        return f"<sealed v{sealed.get('key_version')}>"


# --- re-running a turn from its records -------------------------------------------------------


async def rerun_workflow(settings: VoiceSettings, workflow: str,
                         sealer: Sealer | None = None) -> list[str]:
    """Run a recorded workflow again with the model responses and tool results served from
    the log, from exactly what its exported history would hold; returns the divergences
    (empty when the re-run matches). ``sealer`` replaces the keys read from the key service."""
    import asyncio
    import dataclasses

    from deploy.histories import Recorded, record_workflow

    rec = Recorded.from_doc(await asyncio.to_thread(record_workflow, settings, workflow))
    if sealer is not None:
        rec = dataclasses.replace(rec, sealer=sealer)
    return await rerun_recorded(settings, rec)


async def rerun_recorded(settings: VoiceSettings, rec: Any) -> list[str]:
    """Re-run a recorded workflow (``deploy.histories.Recorded``) by its kind: a participant
    turn, an assistant turn, or a research, disclosure-review or update-delivery workflow."""
    from consumers.assistant.transcript import TURN_KIND
    from deploy.rerun_assistant import rerun_assistant_turn
    from deploy.rerun_steps import STAFF_KINDS, rerun_steps

    if rec.kind == TURN_KIND:
        return await rerun_assistant_turn(settings, rec)
    if rec.kind in STAFF_KINDS:
        return await rerun_steps(settings, rec)
    if rec.kind != "conversation-turn":
        return [f"workflow {rec.workflow!r} is a {rec.kind!r}: replay re-runs conversation and "
                f"assistant turns and {', '.join(STAFF_KINDS)} workflows"]
    return await rerun_turn(settings, rec.workflow, rec.of(WORKFLOWS), rec.of(AGENT),
                            rec.sealer, rec.of(CONVERSATIONS))


def turn_history(sealer: Sealer, inp: dict[str, Any], conversation_log: list[Envelope]
                 ) -> list[dict[str, Any]]:
    """The history a turn's step read, rebuilt from its input: the records its reference
    names, found by seq in the conversation's log (or, for a turn started before inputs were
    references, its copied transcript). ``LookupError`` names a record that is not there."""
    from consumers.conversations.transcript import reference_from
    from consumers.conversations.turns import history_of, open_transcript
    from consumers.frame.logrefs import LogUnavailable

    conversation = inp["conversation"]
    if "transcript" in inp:
        return open_transcript(sealer, conversation, inp["transcript"])
    ref = inp["history"]
    by_seq: dict[int, Envelope] = {}
    for env in conversation_log:
        if env.seq is not None:
            by_seq.setdefault(env.seq, env)

    def found(seqs: list[int]) -> list[Envelope]:
        """The records of ``seqs``; ``LookupError`` naming those not on the log."""
        missing = [seq for seq in seqs if seq not in by_seq]
        if missing:
            raise LookupError(f"records {missing} of conversation {conversation!r} are not on "
                              "its log")
        return [by_seq[seq] for seq in seqs]

    if "opened" in ref:  # the record that opened the turn names the positions
        seq, offset = ref["opened"]
        try:
            ref = reference_from(found([seq])[0], int(ref["partition"]), offset)
        except LogUnavailable as exc:
            raise LookupError(str(exc)) from None
    wanted = [p[0] for p in ([ref["summary"]] if ref.get("summary") else []) + ref["entries"]]
    return history_of(sealer, conversation, found(wanted),
                      ref.get("omitted_through") or 0)[0]


async def rerun_turn(settings: VoiceSettings, workflow: str, lifecycle: list[Envelope],
                     agent: list[Envelope], sealer: Sealer,
                     conversation_log: list[Envelope] | None = None) -> list[str]:
    """Re-run one conversation turn from its lifecycle and agent records and the
    conversation's log (which its input refers to), from the log or a recorded history."""
    from consumers.conversations.catalog import MemoryIssueCatalog
    from consumers.conversations.concern import concern_spec
    from consumers.conversations.turns import KIND
    from consumers.engine import TurnInput, effects_from_envelopes, rerun
    from schemas.workflow import WorkflowStarted, step_success

    started = next((e.record for e in lifecycle if isinstance(e.record, WorkflowStarted)), None)
    if started is None:
        return [f"no workflow {workflow!r} on the log"]
    if started.kind != KIND:
        return [f"workflow {workflow!r} is a {started.kind!r}, not a participant turn"]
    done = [s for s in (step_success(e.record) for e in lifecycle) if s is not None]
    if not done:
        return [f"workflow {workflow!r} has no successful step to compare with"]
    attempt = done[-1].attempt
    prefix = f"{workflow}/a{attempt}/"
    recorded = effects_from_envelopes([e for e in agent if e.id.startswith(prefix)], sealer)
    conversation = started.input["conversation"]
    try:
        history = turn_history(sealer, started.input, conversation_log or [])
    except LookupError as exc:
        return [str(exc)]
    spec = concern_spec(settings, MemoryIssueCatalog())
    turn_input = TurnInput(turn_id=workflow, user_message=history[-1]["content"],
                           history=history[:-1], conversation_id=conversation, attempt=attempt)
    _result, _sink, divergences = await rerun(spec, turn_input, recorded)
    return divergences


def turns_of(settings: VoiceSettings, conversation: str) -> list[str]:
    """The turn workflows a conversation started, in order."""
    return [e.record.turn for e in records(settings, CONVERSATIONS, conversation)  # type: ignore[attr-defined]
            if e.type == "voice.conversation.turn_requested.v1"]
