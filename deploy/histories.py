"""Recorded histories: a workflow's records exported to a file that the test suite replays.

A history holds the raw records (key, value, headers) of one turn — its lifecycle on
``voice.workflows``, its agent records on ``voice.agent`` and its conversation's log on
``voice.conversations`` (which the turn's input refers to) — and, because its content is
sealed, the conversation's data key. Export only test conversations: the key opens them.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from streams.envelope import Envelope, decode
from streams.ids import turn_conversation
from streams.reading import read_topic
from streams.sealing import MemoryKeyStore, Sealer, sealer_for
from streams.settings import VoiceSettings
from streams.topics import AGENT, CONVERSATIONS, WORKFLOWS, topic_name


def _raw(msg: Any) -> dict[str, Any]:
    return {"key": msg.key().decode(), "value": base64.b64encode(msg.value()).decode(),
            "headers": [[k, base64.b64encode(v or b"").decode()] for k, v in msg.headers() or []]}


def export_history(settings: VoiceSettings, workflow: str, path: Path) -> Path:
    """Write the workflow's records and its conversation's key to ``path`` (JSON)."""
    records: dict[str, list[dict[str, Any]]] = {}
    for spec in (WORKFLOWS, AGENT):
        msgs = read_topic(settings, topic_name(settings, spec), key=workflow.encode())
        records[spec.name] = [_raw(m) for m in msgs]
    conversation = turn_conversation(workflow) or workflow
    # The turn's input refers to the conversation's records: they come along.
    msgs = read_topic(settings, topic_name(settings, CONVERSATIONS), key=conversation.encode())
    records[CONVERSATIONS.name] = [_raw(m) for m in msgs]
    sealer = sealer_for(settings)  # the key service the stack seals with
    try:
        store = sealer.store
        version = store.current_version(conversation)
        keys = {str(v): base64.b64encode(store.get(conversation, v)).decode()
                for v in range(1, version + 1)}
    finally:
        sealer.close()
    doc = {"workflow": workflow, "conversation": conversation, "keys": keys, "records": records}
    path.write_text(json.dumps(doc, indent=1) + "\n")
    return path


def load_history(path: Path) -> tuple[str, Sealer, dict[str, list[Envelope]]]:
    """(workflow, a sealer holding its key, decoded records per topic base name)."""
    doc = json.loads(path.read_text())
    keys = {int(v): base64.b64decode(k) for v, k in doc["keys"].items()}
    sealer = Sealer(MemoryKeyStore({doc["conversation"]: keys}))
    envs = {
        topic: [decode(r["key"].encode(), base64.b64decode(r["value"]),
                       [(k, base64.b64decode(v)) for k, v in r["headers"]]) for r in recs]
        for topic, recs in doc["records"].items()
    }
    return doc["workflow"], sealer, envs
