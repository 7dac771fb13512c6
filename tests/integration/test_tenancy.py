"""Tenants on a real broker: the same subject in two tenants owns two worlds, a header naming a
tenant its bearer is not a member of is refused, and a command forged past the edge with
another tenant's id is answered ``no such …`` by the worker and crosses nothing."""

from __future__ import annotations

import httpx
import pytest

from schemas.base import Sealed
from schemas.conversation import SendMessage
from streams.envelope import Envelope
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import CONVERSATIONS, topic_name
from tests.support import acknowledgement_of, forge_command, read_all

pytestmark = pytest.mark.integration


def bearer(settings: VoiceSettings, sub: str, role: str = "participant", tenant: str = "t1",
           **kw: object) -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, sub, role, tenant, **kw)}"}


def test_tenants_are_separate_worlds_at_the_edge_and_in_the_worker(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    start_worker()
    url = start_edge()
    alice_t1, alice_t2 = bearer(settings, "alice"), bearer(settings, "alice", tenant="t2")
    cnv = httpx.post(f"{url}/me/conversations", headers=alice_t1, timeout=10).json()[
        "conversation"]
    r = httpx.post(f"{url}/me/conversations/{cnv}/messages", headers=alice_t1, timeout=10,
                   json={"text": "The crossing by the school is unsafe."})
    assert r.status_code == 202, r.text

    # The same subject in another tenant: nothing of t1 is there.
    for path in (f"/me/conversations/{cnv}", f"/me/conversations/{cnv}/stream"):
        assert httpx.get(url + path, headers=alice_t2, timeout=10).status_code == 404
    assert httpx.get(f"{url}/me/conversations", headers=alice_t2, timeout=10).json() == []
    listed = httpx.get(f"{url}/me/conversations", headers=alice_t1, timeout=10).json()
    assert [c["conversation"] for c in listed] == [cnv]

    # Membership decides the tenant a request acts in; a non-member's header is refused.
    both = bearer(settings, "alice", tenant="t2", memberships={"t1": "participant"})
    ok = httpx.get(f"{url}/me/conversations/{cnv}", timeout=10,
                   headers={**both, "X-Tenant-ID": "t1"})
    assert ok.status_code == 200, ok.text
    assert httpx.get(f"{url}/me/conversations/{cnv}", headers=both, timeout=10
                     ).status_code == 404  # its claimed tenant (t2) comes first
    refused = httpx.get(f"{url}/me/conversations", timeout=10,
                        headers={**alice_t1, "X-Tenant-ID": "t2"})
    assert refused.status_code == 403 and "t2" in refused.json()["detail"]

    # Staff of t2 do not see t1's issues; t1's staff do.
    staff_t1, staff_t2 = (bearer(settings, "sam", "staff"),
                          bearer(settings, "sam", "staff", tenant="t2"))
    issue = httpx.post(f"{url}/staff/issues", headers=staff_t1, timeout=10,
                       json={"title": "Crossing", "summary": "Unsafe crossing."}).json()["issue"]
    assert httpx.get(f"{url}/staff/issues/{issue}", headers=staff_t1, timeout=10
                     ).status_code == 200
    assert httpx.get(f"{url}/staff/issues/{issue}", headers=staff_t2, timeout=10
                     ).status_code == 404
    assert httpx.post(f"{url}/me/issues/{issue}/follow", headers=alice_t2, timeout=10
                      ).status_code == 404

    # Forged past the edge: a t2 command for t1's conversation. The worker answers it
    # "no such conversation" and the conversation's log does not change.
    before = len(read_all(settings, topic_name(settings, CONVERSATIONS)))
    cmd = Envelope(record=SendMessage(conversation=cnv, message_id="m-forged",
                                      text=Sealed(key_version=1, nonce="bm9uY2U=",
                                                  ciphertext="Zm9yZ2Vk")),
                   key=cnv, source="/test", subject=cnv, id="cmd-forged", tenant="t2",
                   correlation="cmd-forged")

    forge_command(settings, cmd)
    ack = acknowledgement_of(settings, "cmd-forged", timeout=20,
                             what="the forged command's answer")
    assert (ack.outcome, ack.detail.get("reason")) == ("rejected", "no such conversation")
    after = read_all(settings, topic_name(settings, CONVERSATIONS))
    assert all(b"m-forged" not in (m.value() or b"") for m in after)
    # Its own tenant still writes (and nothing forged was counted in between).
    r = httpx.post(f"{url}/me/conversations/{cnv}/messages", headers=alice_t1, timeout=10,
                   json={"text": "Still unsafe."})
    assert r.status_code == 202, r.text
    assert len(after) >= before
