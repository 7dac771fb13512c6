"""Fault 7: one participant, one long conversation — 60 messages of 16 KB, one every 0.3 s,
through a real edge and worker (the model simulator replies).

Before turn inputs were references, each turn copied the whole sealed transcript into its
``WorkflowStarted`` and the ``transcripts`` table kept it as one value: at about 1 MB the
changelog record was over the broker's limit, Faust's producer buffer raised
``MessageSizeTooLargeError`` and the worker exited; before that, ``WorkflowStarted`` itself was
refused and its turn never ended. Here the bound is set to 256 KiB (a quarter of what the old
design needed for this conversation): the worker must stay up, every turn must end, the long
history must have been summarised, and every record on every topic of the stack — Faust's
changelogs and dead-letter topics included — must be under the bound. The positions of the
transcript are kept by the conversation's writer, in its state: the product's transcript
table is never written.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest
from confluent_kafka.admin import AdminClient

from schemas.conversation import (
    HistorySummarised,
    ReplyRecorded,
    TurnRequested,
    TurnStateChanged,
)
from streams.envelope import Envelope, decode, unfolded
from streams.producer import record_size
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import CONVERSATIONS, topic_name
from tests.support import read_all, wait_for, worker_group

pytestmark = [pytest.mark.faults, pytest.mark.integration]

MESSAGES = 60
MESSAGE_BYTES = 16 * 1024
BOUND = 256 * 1024
EVERY_S = 0.3


def message(n: int) -> str:
    """A 16 KB message the simulator reads as concerns (sentences, real words)."""
    text = f"Message {n}. "
    sentence = (f"The streetlight number {n} on Elm Street has been broken for weeks and the "
                "corner is dangerous at night. ")
    while len(text.encode()) + len(sentence) <= MESSAGE_BYTES:
        text += sentence
    return text + "x" * (MESSAGE_BYTES - len(text.encode()))


def conversation_log(settings: VoiceSettings, cnv: str) -> list[Envelope]:
    envs = [part for m in read_all(settings, topic_name(settings, CONVERSATIONS))
            if m.key() == cnv.encode() for part in unfolded(decode(m.key(), m.value(),
                                                                   m.headers()))]
    return sorted(envs, key=lambda e: e.seq or 0)


def stack_topics(settings: VoiceSettings) -> list[str]:
    """Every topic of this test's stack: its registered topics and their dead-letter twins,
    and the worker's own (table changelogs, Faust's leader topic)."""
    names = AdminClient({"bootstrap.servers": settings.bootstrap}).list_topics(timeout=10).topics
    app = worker_group(settings)
    return sorted(n for n in names if n.startswith((settings.topic_prefix, app)))


def test_a_long_conversation_never_stops_the_worker_and_no_record_is_over_the_bound(
        settings: VoiceSettings, start_worker, start_edge) -> None:  # noqa: ANN001
    worker = start_worker(VOICE_MAX_RECORD_BYTES=str(BOUND),
                          VOICE_QUOTA_TENANT_TOKENS_PER_DAY="0")
    url = start_edge(VOICE_MAX_RECORD_BYTES=str(BOUND), VOICE_QUOTA_MESSAGES_PER_MINUTE="0",
                     VOICE_QUOTA_CONVERSATIONS_PER_DAY="0")
    headers = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        r = client.post("/me/conversations")
        assert r.status_code == 201, r.text
        cnv = r.json()["conversation"]
        turns = []
        for n in range(MESSAGES):
            started = time.monotonic()
            r = client.post(f"/me/conversations/{cnv}/messages", json={"text": message(n)})
            assert r.status_code == 202, (n, r.status_code, r.text)
            turns.append(r.json()["turn"])
            assert worker.poll() is None, f"the worker exited after message {n}"
            time.sleep(max(0.0, EVERY_S - (time.monotonic() - started)))

    def all_terminal() -> list[Envelope] | None:
        assert worker.poll() is None, "the worker exited"
        log = conversation_log(settings, cnv)
        ended = {e.record.turn for e in log if isinstance(e.record, TurnStateChanged)
                 and e.record.state != "Thinking"}
        return log if ended >= set(turns) else None

    log = wait_for(all_terminal, timeout=300, interval=2, what="every turn terminal")
    assert worker.poll() is None, "the worker stayed up"

    # Every turn requested once, ended once; a reply at most once per turn; dense seqs.
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    requested = [e.record.turn for e in log if isinstance(e.record, TurnRequested)]
    assert sorted(requested) == sorted(turns)
    ends = Counter(e.record.turn for e in log if isinstance(e.record, TurnStateChanged)
                   and e.record.state != "Thinking")
    assert set(ends.values()) == {1}, "each turn ended exactly once"
    replies = Counter(e.record.turn for e in log if isinstance(e.record, ReplyRecorded))
    assert all(count == 1 for count in replies.values())
    replied = [e.record for e in log if isinstance(e.record, TurnStateChanged)
               and e.record.state == "Replied"]
    assert len(replied) == MESSAGES, [e.record.reason for e in log
                                      if isinstance(e.record, TurnStateChanged)
                                      and e.record.state == "CouldNotInterpret"][:3]
    # The history went over the engine's budget, so it was summarised (seed 000 §5).
    assert any(isinstance(e.record, HistorySummarised) for e in log)

    # Every record on every topic of the stack, changelogs included, is under the bound.
    topics = stack_topics(settings)
    changelogs = [t for t in topics if t.endswith("-changelog")]
    assert any(t.endswith("-conversations-changelog") for t in changelogs), topics
    assert any(t.endswith("-workflows-changelog") for t in changelogs), topics
    sizes: dict[str, int] = {}
    for topic in topics:
        msgs = read_all(settings, topic, timeout=30)
        sizes[topic] = max((record_size(m.key(), m.value(), m.headers()) for m in msgs),
                           default=0)
        if topic.endswith(".dlq"):
            assert not msgs, f"{topic} holds {len(msgs)} dead letters"
    over = {t: s for t, s in sizes.items() if s > BOUND}
    assert not over, f"records over {BOUND} bytes: {over}"
    # The large records are the messages themselves, not copies of the transcript.
    assert sizes[topic_name(settings, CONVERSATIONS)] < 3 * MESSAGE_BYTES
    workflow_records = [t for t in topics if t.endswith("voice.workflows")
                        or t.endswith("-workflows-changelog")]
    assert all(sizes[t] < 16 * 1024 for t in workflow_records), \
        {t: sizes[t] for t in workflow_records}
    # Its writer keeps where the transcript is (positions, in the conversation's state), so
    # the product's transcript table is never written for it.
    states = [t for t in changelogs if t.endswith("-conversations-changelog")]
    assert all(sizes[t] < 16 * 1024 for t in states), {t: sizes[t] for t in states}
    assert all(sizes[t] == 0 for t in changelogs if t.endswith("-transcript_index-changelog"))
