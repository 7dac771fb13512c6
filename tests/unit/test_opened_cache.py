"""The worker's one cache of opened datasets and images (``OpenedCache``): least recently used
out first, bounded in bytes but never empty of the last one, and an erased hit dropped."""

from __future__ import annotations

import pytest

from consumers.assistant.datasets import DatasetUnavailable, OpenedCache
from streams.sealing import MemoryKeyStore, Sealer


def cache(bound: int) -> tuple[OpenedCache[bytes], Sealer]:
    sealer = Sealer(MemoryKeyStore())
    for item in ("a", "b", "c", "big"):
        sealer.create(item)
    return OpenedCache(sealer, bound, len, "image"), sealer


def test_the_least_recently_used_go_first_once_over_the_bound() -> None:
    opened, _ = cache(10)
    opened.put("a", b"x" * 4)
    opened.put("b", b"x" * 4)
    assert opened.get("a") == b"x" * 4  # now b is the least recently used
    opened.put("c", b"x" * 4)
    assert "b" not in opened and "a" in opened and "c" in opened
    assert opened.get("b") is None


def test_one_item_over_the_bound_is_still_kept() -> None:
    opened, _ = cache(10)
    opened.put("a", b"x" * 4)
    opened.put("big", b"x" * 50)
    assert "a" not in opened and opened.get("big") == b"x" * 50


def test_an_item_erased_since_it_was_opened_is_dropped_and_unavailable() -> None:
    opened, sealer = cache(10)
    opened.put("a", b"x" * 4)
    sealer.erase("a")
    with pytest.raises(DatasetUnavailable, match="image 'a' cannot be opened: KeyErased"):
        opened.get("a")
    assert "a" not in opened
    opened.put("b", b"x" * 10)  # the erased one's bytes were given back
    assert "b" in opened
