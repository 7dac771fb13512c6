"""Quotas configured by environment, on a real broker with the real edge and worker processes:
the edge answers 429 with Retry-After past a principal's quota, and a worker with a tiny model
token budget lets a tenant's first turn run, ends its second with ``TOKEN_QUOTA_EXCEEDED``, and
still serves another tenant."""

from __future__ import annotations

import httpx
import pytest

from streams.settings import VoiceSettings
from streams.tokens import mint_token
from tests.support import wait_for

pytestmark = pytest.mark.integration

TERMINAL = ("Replied", "CouldNotInterpret")


def auth(settings: VoiceSettings, sub: str, tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, sub, 'participant', tenant)}"}


def ended_turn(url: str, headers: dict[str, str], cnv: str, text: str) -> dict:
    """Send ``text`` to ``cnv`` and wait for its turn to end; the turn's state."""
    sent = httpx.post(f"{url}/me/conversations/{cnv}/messages", json={"text": text},
                      headers=headers, timeout=10)
    assert sent.status_code == 202, sent.text
    turn = sent.json()["turn"]

    def ended() -> dict | None:
        r = httpx.get(f"{url}/me/conversations/{cnv}/turns/{turn}", headers=headers, timeout=10)
        return r.json() if r.status_code == 200 and r.json()["state"] in TERMINAL else None

    return wait_for(ended, timeout=60, what=f"the end of turn {turn}")


def test_edge_and_token_quotas_from_the_environment(settings: VoiceSettings, start_worker,
                                                    start_edge) -> None:  # noqa: ANN001
    start_worker(VOICE_QUOTA_TENANT_TOKENS_PER_DAY="1")
    url = start_edge(VOICE_QUOTA_CONVERSATIONS_PER_DAY="1")
    alice, bob = auth(settings, "alice", "t1"), auth(settings, "bob", "t2")

    opened = httpx.post(f"{url}/me/conversations", headers=alice, timeout=10)
    assert opened.status_code == 201, opened.text
    cnv = opened.json()["conversation"]
    again = httpx.post(f"{url}/me/conversations", headers=alice, timeout=10)
    assert again.status_code == 429, again.text
    assert "VOICE_QUOTA_CONVERSATIONS_PER_DAY" in again.json()["detail"]
    assert 86_000 < int(again.headers["Retry-After"]) <= 86_400

    # The tenant's first turn runs to its end (it was under the budget when it started) …
    first = ended_turn(url, alice, cnv, "The crossing by the school is unsafe.")
    assert first["state"] == "Replied", first
    # … its second starts over the budget and ends at once, saying why.
    second = ended_turn(url, alice, cnv, "And the bins are not collected.")
    assert second["state"] == "CouldNotInterpret", second
    assert "TOKEN_QUOTA_EXCEEDED" in second["reason"] and "'t1'" in second["reason"]
    assert "VOICE_QUOTA_TENANT_TOKENS_PER_DAY" in second["reason"]
    assert "after 1 attempts" in second["reason"], "not retried: another attempt is refused too"

    # Another tenant has its own budget.
    other = httpx.post(f"{url}/me/conversations", headers=bob, timeout=10).json()["conversation"]
    assert ended_turn(url, bob, other, "The park lights are out.")["state"] == "Replied"
