"""Recorded histories: a workflow's records, exported to a file that the test suite replays.

A history holds the raw records (key, value, headers, partition, offset) of one workflow — its
lifecycle on ``voice.workflows``, its agent records on ``voice.agent`` — and of the aggregate
log its input refers to by position (``LOGS``: a conversation's, an assistant chat's, an
issue's), and, because its content is sealed, the data keys of the aggregates that seal it
(``sealing_keys``). Export only test aggregates: the keys open them.

``record_workflow`` reads the same from Kafka without a file: ``voice replay … --rerun`` re-runs
a live workflow from exactly what a history would hold, so one path serves both.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from consumers.frame.logrefs import Position, checked, scan_held
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope, decode
from streams.ids import turn_conversation
from streams.reading import read_topic
from streams.sealing import KeyErased, KeyNotFound, MemoryKeyStore, Sealer, sealer_for
from streams.settings import VoiceSettings
from streams.topics import AGENT, ASSISTANT, CONVERSATIONS, ISSUES, WORKFLOWS, TopicSpec, topic_name

LOGS: dict[str, TopicSpec] = {
    "conversation-turn": CONVERSATIONS, "assistant-turn": ASSISTANT,
    "assistant-extraction": ASSISTANT, "research": ISSUES, "update-delivery": ISSUES}
"""The aggregate log each kind's input refers to (a disclosure review carries its text)."""


def aggregate_of(kind: str, workflow: str, inp: dict[str, Any]) -> str | None:
    """The key of the aggregate whose log (``LOGS``) or data key a workflow's input names."""
    if kind == "conversation-turn":
        return inp.get("conversation") or turn_conversation(workflow) or workflow
    if kind in ("assistant-turn", "assistant-extraction"):
        return inp.get("conversation")
    if kind == "research":
        return (inp.get("issue") or {}).get("issue")
    if kind == "update-delivery":
        return inp.get("issue")
    if kind == "disclosure-review":
        return inp.get("contribution")
    return None


def sealing_keys(kind: str) -> bool:
    """Whether the kind's content is sealed under its aggregate's key (staff research and
    delivery read staff records, which are not sealed)."""
    return kind in ("conversation-turn", "assistant-turn", "assistant-extraction",
                    "disclosure-review")


def _raw(msg: Any) -> dict[str, Any]:
    return {"key": msg.key().decode(), "value": base64.b64encode(msg.value()).decode(),
            "headers": [[k, base64.b64encode(v or b"").decode()] for k, v in msg.headers() or []],
            "partition": msg.partition(), "offset": msg.offset()}


def _keys(settings: VoiceSettings, aggregate: str) -> dict[str, str]:
    """Every version of the aggregate's data key (none once erased: nothing opens it)."""
    sealer = sealer_for(settings)  # the key service the stack seals with
    try:
        store = sealer.store
        version = store.current_version(aggregate)
        return {str(v): base64.b64encode(store.get(aggregate, v)).decode()
                for v in range(1, version + 1)}
    except (KeyErased, KeyNotFound):
        return {}
    finally:
        sealer.close()


def record_workflow(settings: VoiceSettings, workflow: str) -> dict[str, Any]:
    """The history of ``workflow`` as a document (what ``export_history`` writes)."""
    records: dict[str, list[dict[str, Any]]] = {}
    for spec in (WORKFLOWS, AGENT):
        msgs = read_topic(settings, topic_name(settings, spec), key=workflow.encode())
        records[spec.name] = [_raw(m) for m in msgs]
    started = next((e.record for e in _decoded(records[WORKFLOWS.name])
                    if isinstance(e.record, WorkflowStarted)), None)
    kind = started.kind if started is not None else "conversation-turn"
    aggregate = aggregate_of(kind, workflow, started.input if started is not None else {})
    keys: dict[str, dict[str, str]] = {}
    if aggregate is not None:
        log = LOGS.get(kind)
        if log is not None:  # the records the input refers to come along
            msgs = read_topic(settings, topic_name(settings, log), key=aggregate.encode())
            records[log.name] = [_raw(m) for m in msgs]
        if sealing_keys(kind):
            keys[aggregate] = _keys(settings, aggregate)
    return {"workflow": workflow, "kind": kind, "keys": keys, "records": records}


def export_history(settings: VoiceSettings, workflow: str, path: Path) -> Path:
    """Write the workflow's records and its aggregate's keys to ``path`` (JSON)."""
    path.write_text(json.dumps(record_workflow(settings, workflow), indent=1) + "\n")
    return path


def _decoded(raws: list[dict[str, Any]]) -> list[Envelope]:
    return [decode(r["key"].encode(), base64.b64decode(r["value"]),
                   [(k, base64.b64decode(v)) for k, v in r["headers"]]) for r in raws]


class RecordedLog:
    """A ``LogReader`` over a history's records, by the partitions and offsets they had."""

    def __init__(self, raws: dict[str, list[dict[str, Any]]]) -> None:
        self.at: dict[tuple[str, int, int], Envelope] = {}
        for topic, recs in raws.items():
            for raw, env in zip(recs, _decoded(recs), strict=True):
                if "offset" in raw:  # histories of before positions were recorded have none
                    self.at[(topic, int(raw["partition"]), int(raw["offset"]))] = env

    async def read(self, spec: TopicSpec, partition: int, key: str,
                   positions: Sequence[Position]) -> list[Envelope]:
        where = f"the history's {spec.name}[{partition}]"
        return [checked(self.at.get((spec.name, partition, p.offset)), where, p.offset, key,
                        p.seq) for p in positions]

    async def scan(self, spec: TopicSpec, partition: int, key: str, start: int,
                   through: int) -> list[Envelope]:
        held = (env for (topic, part, offset), env in sorted(self.at.items())
                if topic == spec.name and part == partition and offset >= start)
        return scan_held(held, f"the history's {spec.name}[{partition}]", key, through)


@dataclass(frozen=True)
class Recorded:
    """One workflow's history, decoded: what a re-run reads instead of Kafka."""

    workflow: str
    kind: str
    sealer: Sealer
    """Holds only the history's keys."""
    envs: dict[str, list[Envelope]]
    """Decoded records per topic base name (``voice.workflows``, ``voice.agent``, …)."""
    log: RecordedLog

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Recorded:
        keys = doc["keys"]
        if "conversation" in doc:  # a history of before other kinds: one conversation's key
            keys = {doc["conversation"]: keys}
        store = {agg: {int(v): base64.b64decode(k) for v, k in versions.items()}
                 for agg, versions in keys.items() if versions}
        return cls(workflow=doc["workflow"], kind=doc.get("kind", "conversation-turn"),
                   sealer=Sealer(MemoryKeyStore(store)),
                   envs={t: _decoded(recs) for t, recs in doc["records"].items()},
                   log=RecordedLog(doc["records"]))

    def of(self, spec: TopicSpec) -> list[Envelope]:
        """The history's records of one topic (none if it holds none)."""
        return self.envs.get(spec.name, [])


def load_recorded(path: Path) -> Recorded:
    """A history file, decoded."""
    return Recorded.from_doc(json.loads(path.read_text()))


def load_history(path: Path) -> tuple[str, Sealer, dict[str, list[Envelope]]]:
    """(workflow, a sealer holding its keys, decoded records per topic base name)."""
    rec = load_recorded(path)
    return rec.workflow, rec.sealer, rec.envs
