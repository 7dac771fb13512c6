"""What a worker learns and finds across a tenant, on a real broker (issue 13).

Point 1: a concern that repeats an existing issue of the participant's tenant is proposed as
related to it — found by the concern agent's ``search_issues`` in the catalog each worker
follows from ``voice.issues`` — and an issue of another tenant is never the answer, however
well it matches. Point 6: a pattern learned in one assistant conversation of a tenant is
offered to a new conversation of that tenant (another person's), never to another tenant's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from schemas.assistant import AssistantPatternRecorded
from schemas.workflow import step_success
from streams.envelope import decode
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import ASSISTANT, WORKFLOWS, TopicSpec, topic_name
from tests.support import read_all, wait_for

pytestmark = pytest.mark.integration

REPEATED = "The Oak Street lights are out again. Please fix them."


def bearer(settings: VoiceSettings, sub: str, role: str, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, sub, role, tenant)}"}


def open_issue(url: str, staff: dict[str, str], title: str, summary: str = "") -> str:
    r = httpx.post(f"{url}/staff/issues", headers=staff, timeout=10,
                   json={"title": title, "summary": summary})
    assert r.status_code == 201, r.text
    return r.json()["issue"]


def proposal_for(url: str, who: dict[str, str], text: str) -> dict:
    """The proposal of a new conversation's first turn on ``text`` (waits for the reply)."""
    r = httpx.post(f"{url}/me/conversations", headers=who, timeout=10)
    assert r.status_code == 201, r.text
    cnv = r.json()["conversation"]
    r = httpx.post(f"{url}/me/conversations/{cnv}/messages", headers=who, timeout=10,
                   json={"text": text})
    assert r.status_code == 202, r.text
    turn = r.json()["turn"]

    def replied() -> dict | None:
        t = httpx.get(f"{url}/me/conversations/{cnv}/turns/{turn}", headers=who, timeout=10)
        return t.json() if t.status_code == 200 and t.json()["state"] != "Thinking" else None

    done = wait_for(replied, timeout=120, interval=0.5, what=f"turn {turn} answered")
    assert done["state"] == "Replied", done
    return done["proposal"]


def test_a_repeated_concern_relates_to_its_tenants_existing_issue(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    url = start_edge()
    oak_t1 = open_issue(url, bearer(settings, "sam", "staff", "t1"),
                        "Broken streetlights on Oak Street",
                        "Several lamps between 3rd and 5th have been dark for weeks.")
    open_issue(url, bearer(settings, "sam", "staff", "t1"), "Potholes on Main Road")
    oak_t2 = open_issue(url, bearer(settings, "kim", "staff", "t2"),
                        "Broken streetlights on Oak Street")

    t1 = proposal_for(url, bearer(settings, "alice", "participant", "t1"), REPEATED)
    assert t1["relates_to_issue"] == oak_t1 and t1["new_issue"] is None, t1
    t2 = proposal_for(url, bearer(settings, "bob", "participant", "t2"), REPEATED)
    assert t2["relates_to_issue"] == oak_t2, t2
    # A tenant with no such issue: the same words make a new issue, never t1's or t2's.
    t3 = proposal_for(url, bearer(settings, "cy", "participant", "t3"), REPEATED)
    assert t3["relates_to_issue"] is None and t3["new_issue"]["title"], t3


# --- point 6: patterns learned per tenant ----------------------------------------------------

CSV = (Path(__file__).resolve().parents[1] / "fixtures" / "assistant_facilities.csv").read_bytes()
ASSISTANT_API = "/api/v1/assistant"


def records(settings: VoiceSettings, spec: TopicSpec) -> list[Any]:
    return [decode(m.key(), m.value(), m.headers()) for m in
            read_all(settings, topic_name(settings, spec))]


def assistant_turn(url: str, who: dict[str, str], settings: VoiceSettings, message: str
                   ) -> tuple[str, str, dict[str, Any]]:
    """(conversation, turn, the turn step's output) of a new conversation's first turn."""
    up = httpx.post(f"{url}{ASSISTANT_API}/files", headers=who, timeout=10,
                    files={"file": ("facilities.csv", CSV, "text/csv")})
    assert up.status_code == 201, up.text
    r = httpx.post(f"{url}{ASSISTANT_API}/chat", headers=who, timeout=10, json={
        "stream": False, "message": message, "data_refs": [up.json()["dataset_id"]]})
    assert r.status_code == 202, r.text
    conversation, turn = r.json()["conversation_id"], r.json()["turn"]

    def step_output() -> dict[str, Any] | None:
        return next((done.output for done in (step_success(e.record)
                                              for e in records(settings, WORKFLOWS))
                     if done is not None and done.workflow == turn), None)

    return conversation, turn, wait_for(step_output, timeout=120, interval=0.5,
                                        what=f"the step of {turn}")


def test_a_pattern_learned_in_one_conversation_is_offered_to_the_tenant_only(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    url = start_edge()
    alice_t = bearer(settings, "alice", "participant", "T")
    a, a_turn, first = assistant_turn(url, alice_t, settings,
                                      "Show me RCRA facilities in Louisiana on a map")
    assert first["suggested"] == []  # nothing learned yet

    def extracted() -> str | None:
        return next((e.record.pattern_id for e in records(settings, ASSISTANT)
                     if isinstance(e.record, AssistantPatternRecorded)
                     and e.record.turn == a_turn and e.record.stage == "extracted"), None)

    pattern = wait_for(extracted, timeout=120, interval=0.5, what="A's extracted pattern")

    ask = "Which RCRA facilities in Louisiana are near rivers?"
    b, _, in_t = assistant_turn(url, bearer(settings, "bob", "participant", "T"), settings, ask)
    assert b != a and in_t["suggested"] == [pattern], in_t
    _, _, in_u = assistant_turn(url, bearer(settings, "carol", "participant", "U"), settings,
                                ask)
    assert in_u["suggested"] == [], in_u
