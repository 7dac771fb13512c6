"""The one registry of Voice's topics, and the idempotent admin call that creates them.

Every topic a process touches is named here; code asks ``topic_name(settings, spec)`` for the
physical name so a test prefix or a deployment prefix applies everywhere at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from aiokafka.partitioner import murmur2
from confluent_kafka.admin import AdminClient, NewTopic

from streams.settings import VoiceSettings

DAY_MS = 24 * 3600 * 1000
HOUR_MS = 3600 * 1000


@dataclass(frozen=True)
class TopicSpec:
    """One topic: its base name, how it is cleaned up, and what it carries."""

    name: str
    doc: str
    compacted: bool = False
    retention_ms: int = -1
    """``-1`` keeps records forever (the log is the source of truth)."""
    partitions: int | None = None
    """``None`` takes ``VOICE_TOPIC_PARTITIONS``."""
    read_by_workers: bool = False
    """True when a worker consumes it, so undecodable records must reach its DLQ."""
    extra: tuple[tuple[str, str], ...] = ()
    """Further topic configs (``name``, ``value``), e.g. the key topic's compaction bounds."""

    @property
    def dlq(self) -> TopicSpec:
        return TopicSpec(
            name=f"{self.name}.dlq",
            doc=f"Records of {self.name} that could not be decoded, with the reason in headers.",
            retention_ms=30 * DAY_MS,
        )

    def config(self) -> dict[str, str]:
        cfg = {
            "cleanup.policy": "compact" if self.compacted else "delete",
            "retention.ms": str(self.retention_ms),
        }
        cfg.update(self.extra)
        return cfg


COMMANDS = TopicSpec(
    "voice.commands",
    "Commands from the edge (send a message, erase, cancel, review, retry); key = aggregate id.",
    retention_ms=7 * DAY_MS,
    read_by_workers=True,
)
CONVERSATIONS = TopicSpec(
    "voice.conversations",
    "Each conversation's log, appended by its sequencer only; key = conversation id. Read by "
    "the edges and the sink; its writer tells its worker what it put there (decision 0016).",
)
OWNERS = TopicSpec(
    "voice.owners",
    "The index of conversations by owner (one record a conversation started), written by "
    "the conversation's writer; key = tenant/owner.",
)
ACKS = TopicSpec(
    "voice.acks",
    "Acknowledgements of commands for the edge that waits on them; key = command id.",
    retention_ms=1 * DAY_MS,
)
WORKFLOWS = TopicSpec(
    "voice.workflows",
    "Workflow lifecycle records (started, step_started, …, completed); key = workflow id.",
    read_by_workers=True,
)
AGENT = TopicSpec(
    "voice.agent",
    "Model calls, tool calls, tool results and display events of agent turns; key = workflow id.",
)
TELEMETRY = TopicSpec(
    "voice.telemetry",
    "Telemetry events (labels, envelopes, costs) for ClickHouse; key = correlation id.",
    retention_ms=14 * DAY_MS,
)

ISSUES = TopicSpec(
    "voice.issues",
    "Each issue's log (opened, evidence, followers, developments, investigations), appended by "
    "its writer only; key = issue id. Its writer tells its worker what it put there "
    "(decision 0016).",
)
CONTRIBUTIONS = TopicSpec(
    "voice.contributions",
    "Each contribution's current state (sealed text, flags, reviews, publication); "
    "key = contribution id.",
    compacted=True,
)
INBOX = TopicSpec(
    "voice.inbox",
    "Each participant's inbox of notifications, appended by its writer only; key = recipient.",
)
REVIEW_QUEUE = TopicSpec(
    "voice.review-queue",
    "Each tenant's review queue (a contribution entered, reviewed, published, rejected), "
    "appended by the queue's writer only; key = the tenant's queue key.",
)

ASSISTANT = TopicSpec(
    "voice.assistant",
    "Each assistant conversation's log (turns, display events, replies, patterns), appended by "
    "its sequencer only; key = conversation id. Its writer tells its worker what it put there "
    "(decision 0016).",
)
DATASETS = TopicSpec(
    "voice.datasets",
    "Uploaded CSV datasets and images, each sealed with its own data key; key = dataset or "
    "image id.",
    compacted=True,
)

DELTAS = TopicSpec(
    "voice.deltas",
    "A participant turn's reply text as the model streams it (sealed), for the edges' live SSE "
    "streams only: transient, never a record of the conversation (its ReplyRecorded is); "
    "key = conversation id.",
    retention_ms=HOUR_MS,
)

TOPICS: tuple[TopicSpec, ...] = (COMMANDS, CONVERSATIONS, OWNERS, ACKS, WORKFLOWS, AGENT,
                                 TELEMETRY, ISSUES, CONTRIBUTIONS, INBOX, REVIEW_QUEUE, ASSISTANT,
                                 DATASETS, DELTAS)
"""The record topics: every one is read by the telemetry sink and has a dead-letter topic."""

KEYS = TopicSpec(
    "voice.keys",
    "Wrapped data keys (one per conversation, assistant chat, contribution, dataset) and the "
    "KEK versions in force; a tombstone erases an id; key = the id. Read by every process into "
    "memory, by nothing else (never by the telemetry sink).",
    compacted=True,
    # The bound on how long an erased id's wrapped key stays in the log (docs/keys.md): the
    # segment holding it rolls within segment.ms of its last write (on the next append), is
    # cleanable at once (dirty ratio 0.01) and at the latest after max.compaction.lag.ms; the
    # tombstone itself goes delete.retention.ms after that cleaning.
    extra=(("segment.ms", str(HOUR_MS)),
           ("min.cleanable.dirty.ratio", "0.01"),
           ("max.compaction.lag.ms", str(HOUR_MS)),
           ("delete.retention.ms", str(HOUR_MS))),
)
"""Not in ``TOPICS``: it carries no CloudEvents payload a sink or a worker decodes, and its
undecodable records are skipped by the key readers (logged), not dead-lettered."""

CHANGELOG_CONFIG: dict[str, str] = {
    "segment.ms": str(HOUR_MS),
    "segment.bytes": str(64 * 1024 * 1024),
}
"""Every worker table's changelog topic (compacted by Faust) rolls its segment at least hourly
and every 64 MiB: compaction never touches the active segment, and under Kafka's defaults
(7 days, 1 GiB) one grew to 860 MB of superseded values, every one of them read back by each
worker that recovered the table (``docs/benchmarks.md``, issue 14, fourteenth pass)."""


def all_specs() -> list[TopicSpec]:
    """Every topic: each record topic followed by its dead-letter topic, then the key topic."""
    return [*record_specs(), KEYS]


def record_specs() -> list[TopicSpec]:
    """The record topics, each followed by its dead-letter topic (what the sink reads)."""
    out: list[TopicSpec] = []
    for spec in TOPICS:
        out.extend((spec, spec.dlq))
    return out


def topic_name(settings: VoiceSettings, spec: TopicSpec | str) -> str:
    """The physical topic name, with the configured prefix."""
    base = spec.name if isinstance(spec, TopicSpec) else spec
    return f"{settings.topic_prefix}{base}"


def dlq_name(topic: str) -> str:
    """The dead-letter topic of a physical topic name."""
    return f"{topic}.dlq"


def admin_client(settings: VoiceSettings) -> AdminClient:
    return AdminClient({"bootstrap.servers": settings.bootstrap})


def create_topics(settings: VoiceSettings, timeout: float = 30.0) -> dict[str, str]:
    """Create every registered topic that does not exist yet; returns name → 'created'|'exists'.

    Idempotent: running it again changes nothing and reports every topic as 'exists'.
    """
    admin = admin_client(settings)
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = {topic_name(settings, s): s for s in all_specs()}
    result = {name: "exists" for name in wanted if name in existing}
    new = [
        NewTopic(
            name,
            num_partitions=spec.partitions or settings.topic_partitions,
            replication_factor=settings.replication_factor,
            config=spec.config(),
        )
        for name, spec in wanted.items()
        if name not in existing
    ]
    if new:
        for name, fut in admin.create_topics(new, operation_timeout=timeout).items():
            try:
                fut.result()
                result[name] = "created"
            except Exception as exc:  # a concurrent creator won the race
                if "TOPIC_ALREADY_EXISTS" in str(exc) or "already exists" in str(exc):
                    result[name] = "exists"
                else:
                    raise
    _wait_for_leaders(admin, list(wanted), timeout)
    return dict(sorted(result.items()))


def _wait_for_leaders(admin: AdminClient, names: list[str], timeout: float) -> None:
    """Return once the cluster's metadata shows every topic with a leader per partition.

    A topic is usable only then: right after creation a producer or a watermark query may
    still be told "not leader for partition".
    """
    deadline = time.monotonic() + timeout
    while True:
        md = admin.list_topics(timeout=timeout)
        waiting = [n for n in names
                   if n not in md.topics or md.topics[n].error is not None
                   or not md.topics[n].partitions
                   or any(p.leader < 0 for p in md.topics[n].partitions.values())]
        if not waiting:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics without leaders after {timeout:.0f}s: {waiting[:5]}")
        time.sleep(0.1)


def describe_topics(settings: VoiceSettings, timeout: float = 10.0) -> list[dict[str, object]]:
    """The registered topics as the cluster sees them (partitions, or missing)."""
    md = admin_client(settings).list_topics(timeout=timeout)
    rows: list[dict[str, object]] = []
    for spec in all_specs():
        name = topic_name(settings, spec)
        t = md.topics.get(name)
        rows.append(
            {
                "topic": name,
                "partitions": len(t.partitions) if t and not t.error else None,
                "compacted": spec.compacted,
                "retention_ms": spec.retention_ms,
                "doc": spec.doc,
            }
        )
    return rows


def missing_topics(settings: VoiceSettings, timeout: float = 5.0) -> list[str]:
    """Registered topics absent from the cluster (empty when ready)."""
    md = admin_client(settings).list_topics(timeout=timeout)
    names = [topic_name(settings, s) for s in all_specs()]
    return [name for name in names if name not in md.topics]


def partition_of(key: str, partitions: int) -> int:
    """The partition a key's records land in (murmur2, as every producer here partitions:
    ``streams.producer.PRODUCER_CONFIG``)."""
    return (murmur2(key.encode()) & 0x7FFFFFFF) % partitions
