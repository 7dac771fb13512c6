"""The issue catalog the concern agent searches (``consumers.conversations.catalog``): folded
from issue-log records per tenant, searched with BM25 within one tenant only, and — through the
model simulator — a concern that repeats an existing issue is related to it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anthropic
import pytest

from consumers.conversations.catalog import FollowedIssues, IssueIndex
from consumers.conversations.concern import concern_spec, run_concern_extraction
from consumers.engine import RecordingSink
from deploy.simulator import serve_simulator
from schemas.base import Record
from schemas.staff import DevelopmentRecorded, EvidenceAdded, FollowerAdded, IssueOpened
from streams.envelope import Envelope
from streams.settings import VoiceSettings

OAK = "iss-0a0a0a0a"
ELM = "iss-0b0b0b0b"


def on_log(record: Record, issue: str, seq: int, tenant: str | None) -> Envelope:
    return Envelope(record=record, key=issue, source="/test", subject=issue, seq=seq,
                    tenant=tenant, id=f"{issue}-{seq}", correlation=issue)


def opened(issue: str, title: str, summary: str = "", tenant: str | None = "t1") -> Envelope:
    return on_log(IssueOpened(issue=issue, title=title, summary=summary, by="sam", at="now"),
                  issue, 1, tenant)


@pytest.fixture
def index() -> IssueIndex:
    index = IssueIndex()
    index.apply(opened(OAK, "Broken streetlights on Oak Street", "Dark for two weeks."))
    index.apply(opened(ELM, "Speeding cars on Elm Road", "Cars race at night."))
    return index


def test_a_search_finds_the_issue_and_says_why(index: IssueIndex) -> None:
    found = index.for_tenant("t1").search("the oak street lights are out again")
    assert [f["id"] for f in found] == [OAK]
    hit = found[0]
    assert hit["title"] == "Broken streetlights on Oak Street" and hit["strong"] is True
    assert hit["matched"] == ["oak", "street", "light~streetlight"]
    assert hit["score"] > 0 and 0.6 <= hit["relevance"] <= 1


def test_one_shared_word_is_a_weak_match(index: IssueIndex) -> None:
    found = index.for_tenant("t1").search("noise at night from the bar")
    assert [(f["id"], f["strong"]) for f in found] == [(ELM, False)]


def test_another_tenants_issue_is_never_found_nor_fetched(index: IssueIndex) -> None:
    index.apply(opened("iss-0c0c0c0c", "Broken streetlights on Oak Street", tenant="t2"))
    t2 = index.for_tenant("t2")
    assert [f["id"] for f in t2.search("oak street streetlights")] == ["iss-0c0c0c0c"]
    assert t2.get(OAK) is None
    assert index.for_tenant("t3").search("oak street streetlights") == []
    assert index.for_tenant(None).search("oak street") == []
    assert index.for_tenant("t1").get(OAK) == {
        "id": OAK, "title": "Broken streetlights on Oak Street", "summary": "Dark for two weeks."}


def test_evidence_and_developments_keep_the_catalog_current(index: IssueIndex) -> None:
    t1 = index.for_tenant("t1")
    assert t1.search("lamp post wiring") == []
    index.apply(on_log(EvidenceAdded(issue=OAK, evidence="ev-1", title="Photo of a lamp post",
                                     added_by="sam", at="now"), OAK, 2, "t1"))
    index.apply(on_log(FollowerAdded(issue=OAK, participant="p1"), OAK, 3, "t1"))
    index.apply(on_log(DevelopmentRecorded(issue=OAK, development=f"{OAK}:dev-1",
                                           title="Wiring replaced", body="b", by="sam",
                                           at="now"), OAK, 4, "t1"))
    assert [f["id"] for f in t1.search("lamp post wiring")] == [OAK]
    # a redelivered record (an old seq) changes nothing
    index.apply(on_log(EvidenceAdded(issue=OAK, evidence="ev-9", title="Graffiti",
                                     added_by="sam", at="now"), OAK, 2, "t1"))
    assert t1.search("graffiti") == []
    # a second open of the same id (replayed) keeps the first
    index.apply(opened(OAK, "Something else entirely"))
    assert t1.get(OAK)["title"] == "Broken streetlights on Oak Street"  # type: ignore[index]


def test_the_followed_catalog_syncs_before_each_search(index: IssueIndex) -> None:
    asked: list[float] = []
    catalog = FollowedIssues(index, lambda timeout: asked.append(timeout) or True)
    catalog.for_tenant("t1").search("oak")
    catalog.for_tenant("t1").get(OAK)
    assert len(asked) == 2 and all(t > 0 for t in asked)


@pytest.fixture(scope="module")
def simulator() -> Iterator[anthropic.AsyncAnthropic]:
    with serve_simulator() as url:
        yield anthropic.AsyncAnthropic(api_key="simulator", base_url=url, max_retries=0)


async def concern(simulator: anthropic.AsyncAnthropic, index: IssueIndex, tenant: str,
                  text: str, tmp_path: Path) -> dict:
    settings = VoiceSettings(env="test", kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path,
                             model="claude-sim-1")
    reply = await run_concern_extraction(
        concern_spec(settings, index.for_tenant(tenant)), simulator, RecordingSink(), "cnv-1",
        "cnv-1:turn-1", 1, [{"role": "user", "content": text}])
    assert reply.proposal is not None
    return reply.proposal.model_dump()


async def test_a_repeated_concern_relates_to_the_existing_issue(
        simulator: anthropic.AsyncAnthropic, index: IssueIndex, tmp_path: Path) -> None:
    text = "The Oak Street lights are out again. Please fix them."
    proposal = await concern(simulator, index, "t1", text, tmp_path)
    assert proposal["relates_to_issue"] == OAK and proposal["new_issue"] is None
    # the same words in a tenant without that issue: a new issue is proposed
    proposal = await concern(simulator, index, "t2", text, tmp_path)
    assert proposal["relates_to_issue"] is None and proposal["new_issue"]


async def test_a_weak_match_is_not_related(simulator: anthropic.AsyncAnthropic,
                                           index: IssueIndex, tmp_path: Path) -> None:
    """One word in common with a title ("speeding") is what the catalog calls weak; the
    simulator relates only to a strong match, so a new issue is proposed."""
    proposal = await concern(simulator, index, "t1",
                             "Speeding bikes on the canal path scare us. Please stop them.",
                             tmp_path)
    assert proposal["relates_to_issue"] is None and proposal["new_issue"]
