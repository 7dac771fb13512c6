"""The worker's issue catalog on a real broker (issue 13, point 1): a concern that repeats an
existing issue of the participant's tenant is proposed as related to it — found by the concern
agent's ``search_issues`` in the catalog each worker follows from ``voice.issues`` — and an
issue of another tenant is never the answer, however well it matches."""

from __future__ import annotations

import httpx
import pytest

from streams.settings import VoiceSettings
from streams.tokens import mint_token
from tests.support import wait_for

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
