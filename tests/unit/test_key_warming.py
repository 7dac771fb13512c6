"""A route about content whose key this edge has not read yet learns it off the event loop.

Regression (issue 10's closing note): a key made on another host and not yet read here made
the first GET or stream of that conversation wait up to the key service's timeout *on the
event loop*, stalling every other request of the edge meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace
from typing import Any

from api.frame.auth import Principal
from api.frame.deps import owned_dependency
from streams.sealing import MemoryKeyStore, Sealer

CNV = "cnv-0123456789abcdef"


class SlowStore(MemoryKeyStore):
    """A key store that, like the key service on a miss, blocks its caller to read the topic."""

    def __init__(self) -> None:
        super().__init__()
        self.known: set[str] = set()
        self.warmed_on: list[str] = []

    def holds(self, conversation: str) -> bool:
        return conversation in self.known

    def current_version(self, conversation: str) -> int:
        self.warmed_on.append(threading.current_thread().name)
        time.sleep(0.5)
        self.known.add(conversation)
        return super().current_version(conversation)


class OneView:
    """A projection that already has the caller's conversation."""

    def __init__(self, view: Any) -> None:
        self.view = view

    async def ensure(self, key: str, timeout: float) -> bool:
        """Nothing before a history window: it already has the view."""
        return True

    async def wait(self, key: str, until: Any, timeout: float) -> bool:
        return True

    def get(self, key: str) -> Any:
        return self.view

    def owned(self, key: str, who: Principal) -> Any:
        return self.view


async def test_an_unknown_key_is_learnt_in_a_thread_while_the_loop_runs_on() -> None:
    store = SlowStore()
    sealer = Sealer(store)
    sealer.create(CNV)
    async def views(_request: Any) -> Any:
        return OneView("the view")

    owned = owned_dependency(views, valid=lambda _c: True, description="id")
    request = SimpleNamespace(app=SimpleNamespace(state=SimpleNamespace(sealer=sealer)))
    who = Principal(sub="ann", role="participant")
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    beat = asyncio.create_task(ticker())
    view = await owned(request, CNV, who)
    beat.cancel()
    assert view == "the view"
    assert store.warmed_on and store.warmed_on[0] != threading.main_thread().name
    assert ticks >= 10, "the event loop ran while the key was being learnt"
    # Known now: the next request asks the key service nothing.
    await owned(request, CNV, who)
    assert len(store.warmed_on) == 1


def test_a_store_without_the_notion_is_taken_as_holding_every_key() -> None:
    assert Sealer(MemoryKeyStore()).holds(CNV)
