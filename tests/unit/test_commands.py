"""The edge's one way to record a command: a command the broker did not take leaves nothing
waiting for its acknowledgement (a broker outage must not grow the edge's memory)."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi import HTTPException

from api.frame.auth import Principal
from api.frame.commands import Commands
from api.frame.tail import EdgeTail
from schemas.conversation import StartConversation
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
