"""A route seals or opens with a data key on the event loop only when this edge holds the key:
otherwise the store reads the key topic (or writes a new key), which happens in a thread —
never on the loop, where it would hold up every request and stream of the edge."""

from __future__ import annotations

import threading

from api.frame.deps import with_key
from streams.sealing import MemoryKeyStore, Sealer


class Store(MemoryKeyStore):
    """A store that holds only the ids it is told it holds."""

    def __init__(self, held: set[str]) -> None:
        super().__init__()
        self.held = held

    def holds(self, conversation: str) -> bool:
        return conversation in self.held


def where(sealer: Sealer, key: str) -> threading.Thread:
    sealer.seal(key, "m", "text")
    return threading.current_thread()


async def test_a_held_key_is_used_on_the_loop() -> None:
    sealer = Sealer(Store({"c-1"}))
    assert await with_key(sealer, "c-1", where, sealer, "c-1") is threading.current_thread()


async def test_a_key_not_held_is_learnt_in_a_thread() -> None:
    sealer = Sealer(Store(set()))
    ran_in = await with_key(sealer, "c-2", where, sealer, "c-2")
    assert ran_in is not threading.current_thread()


async def test_the_result_comes_back_either_way() -> None:
    sealer = Sealer(Store({"c-3"}))
    sealed = await with_key(sealer, "c-3", sealer.seal, "c-3", "m", "hello")
    assert sealer.open("c-3", "m", sealed) == b"hello"
    elsewhere = Sealer(Store(set()))
    sealed = await with_key(elsewhere, "c-4", elsewhere.seal_json, "c-4", "m", {"a": 1})
    assert elsewhere.open_json("c-4", "m", sealed) == {"a": 1}
