"""The staff workflows' steps without a broker: the model simulator in a thread, effects in
memory, records collected by a fake producer."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from consumers.engine import RecordingSink
from consumers.engine.runner import AgentRunner
from consumers.frame.logrefs import MemoryLogReader
from consumers.staff.delivery import Delivery
from consumers.staff.research import Research, parse_suggestions
from consumers.staff.review import Review, agent_flags, outcome
from consumers.staff.steps import Agents, StepDelays, fenced_json
from consumers.workflows.engine import Pause, StepContext
from consumers.workflows.runtime import Erased, StepError
from deploy.simulator import serve_simulator
from schemas.base import Record, Sealed
from schemas.staff import (
    DeliverNotification,
    DevelopmentRecorded,
    EvidenceAdded,
    FollowerAdded,
    FollowerRemoved,
    IssueOpened,
    SuggestInvestigation,
)
from streams.envelope import Envelope
from streams.sealing import MemoryKeyStore, Sealer
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, CONTRIBUTIONS, ISSUES, TopicSpec

ISS = "iss-00000000000000aa"


class FakeOut:
    """Collects what a step produces (``Publisher``'s shape)."""

    def __init__(self) -> None:
        self.sent: list[tuple[TopicSpec, Envelope]] = []

    async def send(self, spec: TopicSpec, env: Envelope) -> None:
        self.sent.append((spec, env))

    async def send_all(self, items: list[tuple[TopicSpec, Envelope]]) -> None:
        self.sent += items

    def records(self, spec: TopicSpec) -> list[Any]:
        return [e.record for s, e in self.sent if s is spec]


class MemoryAgents(Agents):
    def __init__(self, runner: AgentRunner) -> None:
        super().__init__(runner)
        self.sinks: list[RecordingSink] = []

    def sink_for(self, workflow: str, sealed: bool, tenant: str | None) -> RecordingSink:  # type: ignore[override]
        self.sinks.append(RecordingSink())
        return self.sinks[-1]


@pytest.fixture(scope="module")
def simulator() -> Iterator[str]:
    with serve_simulator() as url:
        yield url


@pytest.fixture
def parts(simulator: str) -> Iterator[tuple[FakeOut, Sealer, MemoryAgents]]:
    settings = VoiceSettings(env="test", kafka_bootstrap="unused:1", fallback_models=[])
    out, sealer = FakeOut(), Sealer(MemoryKeyStore())
    client = anthropic.AsyncAnthropic(api_key="simulator", base_url=simulator, max_retries=0)
    runner = AgentRunner(settings, lambda: None, sealer, client=client)  # type: ignore[arg-type, return-value]
    yield out, sealer, MemoryAgents(runner)


def ctx(workflow: str, kind: str, step: str, input_: dict[str, Any],
        outputs: dict[str, Any] | None = None, commands: dict[str, Any] | None = None
        ) -> StepContext:
    return StepContext(workflow=workflow, kind=kind, step=step, attempt=1, input=input_,
                       outputs=outputs or {}, commands=commands or {})


# --- research --------------------------------------------------------------------------------

RESEARCH_INPUT = {
    "run": "run-1", "issue": {"issue": ISS, "title": "Streetlights on Elm Road are broken",
                              "summary": "Crime rose at night."},
    "evidence": [{"evidence": "evd-1", "title": "Letter",
                  "body": "Three streetlights on Elm Road are broken since March."},
                 {"evidence": "evd-2", "title": "Reply",
                  "body": "The streetlights on Elm Road are not broken."}],
}


def issue_log(*records: Record, partition: int = 2, noise: bool = True
              ) -> tuple[MemoryLogReader, int]:
    """``records`` as the issue's log (seqs 1, 2, …) on a partition another issue shares;
    returns the reader and the offset of the issue's first record."""
    log = MemoryLogReader()
    other = "iss-00000000000000bb"
    if noise:
        log.append(ISSUES, partition, Envelope(record=IssueOpened(
            issue=other, title="Other", summary="", by="sam", at="t"), key=other,
            source="/t", seq=1))
    opened = None
    for seq, record in enumerate(records, start=1):
        offset = log.append(ISSUES, partition, Envelope(record=record, key=ISS, source="/t",
                                                        seq=seq))
        opened = offset if opened is None else opened
        if noise:  # another issue's record between each two of this one's
            log.append(ISSUES, partition, Envelope(record=FollowerAdded(
                issue=other, participant=f"x{seq}"), key=other, source="/t", seq=seq + 1))
    assert opened is not None
    return log, opened


def research_log() -> tuple[MemoryLogReader, dict[str, Any]]:
    """The issue of ``RESEARCH_INPUT`` on a log, and the input naming it by reference."""
    issue = RESEARCH_INPUT["issue"]
    log, opened = issue_log(
        IssueOpened(issue=ISS, title=issue["title"], summary=issue["summary"], by="sam",
                    at="t"),
        *(EvidenceAdded(issue=ISS, evidence=e["evidence"], title=e["title"], body=e["body"],
                        added_by="sam", at="t") for e in RESEARCH_INPUT["evidence"]),
        EvidenceAdded(issue=ISS, evidence="evd-late", title="Late", body="After the run.",
                      added_by="sam", at="t"))
    return log, {**RESEARCH_INPUT, "evidence": {"partition": 2, "opened": opened, "through": 3}}


async def test_the_research_step_suggests_with_reasons_and_records_read(parts) -> None:  # noqa: ANN001
    out, _sealer, agents = parts
    log, reference = research_log()
    research = Research(out, agents, StepDelays(), log)  # type: ignore[arg-type]
    result = await research.research_step(ctx("run-1", "research", "research", reference))
    s = result["suggestions"]
    assert set(s) == {"sources", "questions", "investigations"}
    assert s["sources"] and all(i["reason"] for section in s.values() for i in section)
    # The simulator calls the first get_/list_ tool: get_issue, which names the evidence.
    assert set(s["sources"][0]["read"]) == {ISS, "evd-1", "evd-2"}
    assert result["investigations"] == ["run-1:inv-1"]
    suggested = out.records(COMMANDS)
    assert len(suggested) == 1 and isinstance(suggested[0], SuggestInvestigation)
    assert suggested[0].issue == ISS and suggested[0].read == s["investigations"][0]["read"]
    assert [e.id for _, e in out.sent] == ["run-1:inv-1:suggest"]
    calls = [e.tool_name for e in agents.sinks[0].effects if e.kind == "tool_call"]
    assert calls == ["get_issue"]


def test_suggestions_keep_only_ids_the_agent_read() -> None:
    answer = ('Done.\n```json\n{"sources": [{"title": "A", "reason": "r", "read": ["evd-1", '
              '"evd-9", "evd-1"]}], "questions": [{"title": " ", "reason": "x"}], '
              '"investigations": "nope"}\n```')
    s = parse_suggestions(answer, {"evd-1"})
    assert s == {"sources": [{"title": "A", "reason": "r", "read": ["evd-1"]}],
                 "questions": [], "investigations": []}
    with pytest.raises(StepError):
        parse_suggestions("no json here", set())
    assert fenced_json('```json\n{"a": 1}\n```\n```json\n{"b": 2}\n```') == {"b": 2}


# --- disclosure review ------------------------------------------------------------------------


def review_input(sealer: Sealer, text: str, c: str = "ctb-1") -> dict[str, Any]:
    return {"contribution": c, "issue": ISS, "author": "ann", "submitted_at": "t",
            "text": sealer.seal(c, "text", text).model_dump()}


async def test_the_flag_step_runs_detectors_then_the_agent_and_seals_the_flags(parts) -> None:  # noqa: ANN001
    out, sealer, agents = parts
    review = Review(out, sealer, agents, StepDelays())  # type: ignore[arg-type]
    text = "I met Jane Porter at jane@example.org about the lights."
    inp = review_input(sealer, text)
    result = await review.flag_step(ctx("ctb-1", "disclosure-review", "flag", inp))
    assert result["flag_count"] == 2 and result["flag_kinds"] == ["email", "person_name"]
    flags = sealer.open_json("ctb-1", "flags", Sealed.model_validate(result["flags"]))["flags"]
    assert [(f["source"], text[f["start"]:f["end"]]) for f in flags] == [
        ("agent", "Jane Porter"), ("detector", "jane@example.org")]
    assert "Jane" not in str(result)  # nothing of the text in the clear
    [record] = out.records(CONTRIBUTIONS)
    assert record.state == "in_review" and record.flag_count == 2


async def test_review_steps_pause_and_refuse_the_same_second_reviewer(parts) -> None:  # noqa: ANN001
    out, sealer, agents = parts
    review = Review(out, sealer, agents, StepDelays())  # type: ignore[arg-type]
    inp = review_input(sealer, "Ask Jane Porter about it.")
    flagged = {"flag": {"flag_count": 1, "flag_kinds": ["person_name"], "flags": None}}
    assert await review.review_step(ctx("c", "k", "review", inp, flagged)) == Pause("review")
    first = {"by": "rev1", "decision": "approve"}
    out1 = await review.review_step(ctx("c", "k", "review", inp, flagged, {"review": first}))
    assert out1 == {"by": "rev1", "decision": "approve", "redactions": []}
    outputs = {**flagged, "review": out1}
    step = review.second_review_step
    assert await step(ctx("c", "k", "s", inp, outputs)) == Pause("second_review")
    same = {"second_review": {"by": "rev1", "decision": "approve"}}
    assert await step(ctx("c", "k", "s", inp, outputs, same)) == Pause("second_review")
    other = {"second_review": {"by": "rev2", "decision": "redact"}}
    assert (await step(ctx("c", "k", "s", inp, outputs, other)))["by"] == "rev2"
    unflagged = {"flag": {"flag_count": 0}, "review": out1}
    assert await step(ctx("c", "k", "s", inp, unflagged)) == {"skipped": True}


async def test_a_review_after_its_contribution_was_erased_records_nothing(parts) -> None:  # noqa: ANN001
    # Its record would stand after the erasure on the compacted topic, the words it carries
    # unreadable but the contribution seemingly alive on an edge started later.
    out, sealer, agents = parts
    review = Review(out, sealer, agents, StepDelays())  # type: ignore[arg-type]
    inp = review_input(sealer, "Ask Jane Porter about it.")
    flagged = {"flag": {"flag_count": 0, "flag_kinds": [], "flags": None}}
    sealer.erase("ctb-1")
    first = {"review": {"by": "rev1", "decision": "approve"}}
    with pytest.raises(Erased, match="contribution 'ctb-1' was erased") as caught:
        await review.review_step(ctx("ctb-1", "k", "review", inp, flagged, first))
    assert caught.value.retryable is False  # the workflow fails at once: it never comes back
    assert out.records(CONTRIBUTIONS) == []


async def test_publish_applies_the_redactions(parts) -> None:  # noqa: ANN001
    out, sealer, agents = parts
    review = Review(out, sealer, agents, StepDelays())  # type: ignore[arg-type]
    text = "I met Jane Porter at jane@example.org about it."
    inp = review_input(sealer, text)
    flag = await review.flag_step(ctx("ctb-1", "disclosure-review", "flag", inp))
    outputs = {"flag": flag, "review": {"by": "r1", "decision": "approve", "redactions": []},
               "second_review": {"by": "r2", "decision": "redact", "redactions": []}}
    result = await review.publish_step(ctx("ctb-1", "disclosure-review", "publish", inp,
                                           outputs))
    assert result == {"state": "published", "redacted_spans": 2}
    final = out.records(CONTRIBUTIONS)[-1]
    assert final.state == "published" and [r.by for r in final.reviews] == ["r1", "r2"]
    assert sealer.open_text("ctb-1", "published", final.published_text) == \
        "I met [redacted: person_name] at [redacted: email] about it."


def test_outcome_rules() -> None:
    flags = [{"start": 0, "end": 4, "kind": "email"}, {"start": 10, "end": 12, "kind": "phone"}]
    approve = {"by": "a", "decision": "approve"}
    assert outcome(flags, [approve]) == ("published", [])
    assert outcome(flags, [approve, {"by": "b", "decision": "reject"}]) == ("rejected", [])
    assert outcome(flags, [{"by": "a", "decision": "redact"}])[1] == [(0, 4, "email"),
                                                                      (10, 12, "phone")]
    chosen = {"by": "a", "decision": "redact", "redactions": [{"start": 10, "end": 12}]}
    assert outcome(flags, [approve, chosen]) == ("published", [(10, 12, "personal_data")])


def test_agent_flags_outside_the_text_are_dropped() -> None:
    answer = ('```json\n{"flags": [{"start": 0, "end": 4, "kind": "person_name", "reason": "r"},'
              '{"start": 3, "end": 99}, {"start": "x"}, {"start": 2, "end": 1}]}\n```')
    assert [(f.start, f.end) for f in agent_flags(answer, "Jane is here")] == [(0, 4)]
    assert agent_flags("nothing", "text") == []


# --- update delivery --------------------------------------------------------------------------


async def test_notify_sends_one_notification_per_follower_with_fixed_ids() -> None:
    out = FakeOut()
    dev = f"{ISS}:dev-1"
    # The followers as of the delivery's start: its log up to seq 6, read back, not copied.
    log, opened = issue_log(
        IssueOpened(issue=ISS, title="Lights", summary="", by="sam", at="t"),
        FollowerAdded(issue=ISS, participant="b"), FollowerAdded(issue=ISS, participant="c"),
        DevelopmentRecorded(issue=ISS, development=dev, title="Fixed", body="All lights work.",
                            by="sam", at="2026-03-05T10:00:00+00:00"),
        FollowerAdded(issue=ISS, participant="a"), FollowerRemoved(issue=ISS, participant="c"),
        FollowerAdded(issue=ISS, participant="late"))
    delivery = Delivery(out, StepDelays(), log)  # type: ignore[arg-type]
    inp = {"issue": ISS, "development": dev, "issue_title": "Lights", "partition": 2,
           "opened": opened, "record": [4, opened + 6], "through": 6, "tenant": "t1"}
    rendered = await delivery.render_step(ctx(dev, "update-delivery", "render", inp))
    assert rendered["title"] == "Lights: Fixed"
    result = await delivery.notify_step(ctx(dev, "update-delivery", "notify", inp,
                                            {"render": rendered}))
    assert result == {"notified": 2}
    sent = [(e.key, e.id, e.record) for _s, e in out.sent]
    # Each follower's inbox in the issue's tenant (a principal's inbox is per tenant).
    assert [(k, i) for k, i, _ in sent] == [("t1/a", f"{dev}:a"), ("t1/b", f"{dev}:b")]
    assert {e.tenant for _s, e in out.sent} == {"t1"}
    assert all(isinstance(r, DeliverNotification) and r.body == rendered["body"]
               for _k, _i, r in sent)


def test_step_delays_come_from_settings(monkeypatch) -> None:
    from streams.settings import VoiceSettings

    monkeypatch.setenv("VOICE_STAFF_STEP_DELAY_MS", "flag=1500, publish=20")
    delays = StepDelays.parse(VoiceSettings(env="test").staff_step_delay_ms)
    assert delays.delays == {"flag": 1.5, "publish": 0.02}
    assert StepDelays.parse(VoiceSettings(env="test", staff_step_delay_ms="").staff_step_delay_ms
                            ).delays == {}
