"""``voice replay``: read a conversation or a workflow back from Kafka and show, in order, what
its SSE clients saw. Sealed content is opened with the conversation's key; once the key is
erased the content shows as erased — replay cannot bring it back either."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from api.conversations.render import sse_event
from streams.envelope import DecodeError, Envelope, decode
from streams.ids import turn_conversation
from streams.reading import read_topic
from streams.sealing import KeyErased, Sealer, sealer_for
from streams.settings import VoiceSettings
from streams.topics import AGENT, CONVERSATIONS, WORKFLOWS, topic_name


def records(settings: VoiceSettings, spec: Any, key: str) -> list[Envelope]:
    """The decoded records of one aggregate, deduped by id, in log order."""
    out: list[Envelope] = []
    seen: set[str] = set()
    for msg in read_topic(settings, topic_name(settings, spec), key=key.encode()):
        try:
            env = decode(msg.key(), msg.value(), msg.headers())
        except DecodeError:
            continue  # it is on the DLQ; replay shows what clients saw
        if env.id not in seen:
            seen.add(env.id)
            out.append(env)
    return out


def sse_wire(event: Any) -> str:
    """One SSE event as it is framed on the wire."""
    data = event.data.model_dump(mode="json") if hasattr(event.data, "model_dump") else event.data
    return f"id: {event.id}\nevent: {event.event}\ndata: {json.dumps(data)}\n"


def replay_conversation(settings: VoiceSettings, conversation: str,
                        sealer: Sealer | None = None) -> Iterator[str]:
    """The conversation's SSE events in seq order (each once), then its erasure if erased."""
    sealer = sealer or sealer_for(settings)
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
            event = sse_event(sealer, env)
        except KeyErased:
            yield f"id: {env.seq}\nevent: erased\ndata: {json.dumps({'type': env.type})}\n"
            continue
        if event is not None:
            yield sse_wire(event)


def replay_workflow(settings: VoiceSettings, workflow: str,
                    sealer: Sealer | None = None) -> Iterator[str]:
    """The workflow's lifecycle and its agent's records (display events opened if possible)."""
    sealer = sealer or sealer_for(settings)
    envs = records(settings, WORKFLOWS, workflow) + records(settings, AGENT, workflow)
    envs.sort(key=lambda e: e.time)
    for env in envs:
        payload = env.record.model_dump(mode="json")
        conversation = payload.get("conversation_id") or (
            turn_conversation(workflow))
        for field in ("data", "response", "arguments", "result"):
            sealed = payload.get(field)
            if conversation and isinstance(sealed, dict) and "ciphertext" in sealed:
                payload[field] = _open(sealer, conversation, env, field, sealed)
        seq = "-" if env.seq is None else env.seq
        yield f"{env.time.isoformat(timespec='milliseconds')} seq={seq} {env.type} " \
              f"{json.dumps(payload, separators=(',', ':'))}"


def _open(sealer: Sealer, conversation: str, env: Envelope, field: str, sealed: dict) -> Any:
    from schemas.base import Sealed

    content_id = f"{env.id}/{field}"
    try:
        return sealer.open_json(conversation, content_id, Sealed.model_validate(sealed))
    except KeyErased:
        return "<erased>"
    except Exception:
        return f"<sealed v{sealed.get('key_version')}>"


# --- re-running a turn from its records -------------------------------------------------------


async def rerun_workflow(settings: VoiceSettings, workflow: str,
                         sealer: Sealer | None = None) -> list[str]:
    """Run a recorded turn again in a fresh engine with the model responses and tool results
    served from the log; returns the divergences (empty when the re-run matches)."""
    return await rerun_turn(settings, workflow, records(settings, WORKFLOWS, workflow),
                            records(settings, AGENT, workflow), sealer or sealer_for(settings))


async def rerun_turn(settings: VoiceSettings, workflow: str, lifecycle: list[Envelope],
                     agent: list[Envelope], sealer: Sealer) -> list[str]:
    """Re-run one conversation turn from its lifecycle and agent records (log or history)."""
    from consumers.conversations.concern import MemoryIssueCatalog, concern_spec
    from consumers.conversations.turns import KIND, open_transcript
    from consumers.engine import TurnInput, effects_from_envelopes, rerun
    from schemas.workflow import StepSucceeded, WorkflowStarted

    started = next((e.record for e in lifecycle if isinstance(e.record, WorkflowStarted)), None)
    if started is None:
        return [f"no workflow {workflow!r} on the log"]
    if started.kind != KIND:
        return [f"workflow {workflow!r} is a {started.kind!r}: only agent turns are re-run"]
    done = [e.record for e in lifecycle if isinstance(e.record, StepSucceeded)]
    if not done:
        return [f"workflow {workflow!r} has no successful step to compare with"]
    attempt = done[-1].attempt
    prefix = f"{workflow}/a{attempt}/"
    recorded = effects_from_envelopes([e for e in agent if e.id.startswith(prefix)], sealer)
    conversation = started.input["conversation"]
    history = open_transcript(sealer, conversation, started.input["transcript"])
    spec = concern_spec(settings, MemoryIssueCatalog())
    turn_input = TurnInput(turn_id=workflow, user_message=history[-1]["content"],
                           history=history[:-1], conversation_id=conversation, attempt=attempt)
    _result, _sink, divergences = await rerun(spec, turn_input, recorded)
    return divergences


def turns_of(settings: VoiceSettings, conversation: str) -> list[str]:
    """The turn workflows a conversation started, in order."""
    return [e.record.turn for e in records(settings, CONVERSATIONS, conversation)  # type: ignore[attr-defined]
            if e.type == "voice.conversation.turn_requested.v1"]
