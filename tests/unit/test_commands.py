"""The edge's one way to record a command: a command the broker did not take leaves nothing
waiting for its acknowledgement (a broker outage must not grow the edge's memory)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import HTTPException

from api.frame.auth import Principal
from api.frame.commands import Commands, refused
from api.frame.tail import EdgeTail
from schemas.conversation import StartConversation
from schemas.system import CommandAcknowledged
from streams.producer import ProduceError
from streams.settings import VoiceSettings

CNV = "cnv-00112233aabbccdd"


class RefusingPublisher:
    async def send(self, spec: Any, env: Any, **kw: Any) -> Any:
        raise ProduceError("broker down", retryable=True)


async def test_a_command_not_produced_leaves_no_waiter_behind() -> None:
    settings = VoiceSettings()
    tail = EdgeTail(settings, on_conversation=lambda env: None)
    commands = Commands(settings, RefusingPublisher(), tail,  # type: ignore[arg-type]
                        Principal(sub="alice", role="participant", tenant="t1"))
    for _ in range(3):
        with pytest.raises(HTTPException) as refused:
            await commands.submit(CNV, StartConversation(conversation=CNV, owner="alice"))
        assert refused.value.status_code == 503
    assert tail._waiters == {}


@pytest.mark.parametrize("detail, status", [
    ({"reason": "the log refused the command's records as too large for their topic",
      "too_large": True}, 413),
    ({"reason": "could not record the command; try again", "retryable": True}, 503),
    ({"reason": "no such conversation"}, 404),
    ({"reason": "conversation exists"}, 409),
])
def test_a_refused_command_is_answered_with_what_the_client_can_do(detail: dict[str, Any],
                                                                   status: int) -> None:
    # Regression (issue 12, fault 6): records too large for their topic were answered 503
    # "try again" — no retry can help, and the client was not told why.
    ack = CommandAcknowledged(command_id="c1", aggregate=CNV, outcome="rejected",
                              detail=detail)
    err = refused(ack, f"conversation {CNV!r}")
    assert err.status_code == status and detail["reason"] in str(err.detail)
