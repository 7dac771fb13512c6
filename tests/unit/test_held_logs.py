"""The two in-memory ``LogReader``s — ``MemoryLogReader`` (tests) and a history's
``RecordedLog`` (``voice replay … --rerun``) — check positions and scan as one: one contract
class, run against each (they share ``logrefs.checked`` and ``logrefs.scan_held``)."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from consumers.frame.logrefs import LogReader, LogUnavailable, MemoryLogReader, Position
from deploy.histories import RecordedLog
from schemas.conversation import ConversationErased
from streams.envelope import Envelope, encode
from streams.topics import ISSUES

HELD = [("a", 1), ("b", 1), ("a", 2), ("a", 2), ("b", 2), ("a", 3)]
"""(key, seq) at offsets 0, 1, … of partition 0 (seq 2 of ``a`` written twice)."""


def rec(key: str, seq: int) -> Envelope:
    return Envelope(record=ConversationErased(conversation=key), key=key, source="/t", seq=seq,
                    id=f"{key}-{seq}")


class HeldLogContract:
    """What every in-memory reader does; a subclass says how it is filled."""

    def reader(self) -> LogReader:
        raise NotImplementedError

    async def test_reads_the_records_at_their_positions_in_the_order_asked(self) -> None:
        got = await self.reader().read(ISSUES, 0, "a", [Position(3, 5), Position(1, 0)])
        assert [(e.key, e.seq) for e in got] == [("a", 3), ("a", 1)]

    async def test_a_position_holding_another_seq_or_key_is_unavailable_for_good(self) -> None:
        with pytest.raises(LogUnavailable, match=r"voice.issues\[0\]@1 holds seq 1 of 'b', "
                                                 r"not seq 1 of 'a'") as err:
            await self.reader().read(ISSUES, 0, "a", [Position(1, 0), Position(1, 1)])
        assert not err.value.retryable

    async def test_a_position_past_the_log_is_unavailable_for_good(self) -> None:
        with pytest.raises(LogUnavailable, match="has no record at offset 9") as err:
            await self.reader().read(ISSUES, 0, "a", [Position(4, 9)])
        assert not err.value.retryable

    async def test_a_scan_keeps_each_seq_of_one_key_once_and_says_where_it_ends(self) -> None:
        reader = self.reader()
        got = await reader.scan(ISSUES, 0, "a", 2, 3)
        assert [(e.key, e.seq) for e in got] == [("a", 2), ("a", 3)]
        assert await reader.scan(ISSUES, 0, "a", 0, 0) == []
        with pytest.raises(LogUnavailable, match=r"voice.issues\[0\] ends before seq 4 of 'a'"):
            await reader.scan(ISSUES, 0, "a", 0, 4)


class TestMemoryLogReader(HeldLogContract):
    def reader(self) -> LogReader:
        log = MemoryLogReader()
        for key, seq in HELD:
            log.append(ISSUES, 0, rec(key, seq))
        return log


class TestRecordedLog(HeldLogContract):
    def reader(self) -> LogReader:
        raws: list[dict[str, Any]] = []
        for offset, (key, seq) in enumerate(HELD):
            k, v, headers = encode(rec(key, seq))
            raws.append({"key": k.decode(), "value": base64.b64encode(v).decode(),
                         "headers": [[h, base64.b64encode(b or b"").decode()]
                                     for h, b in headers],
                         "partition": 0, "offset": offset})
        return RecordedLog({ISSUES.name: raws})
