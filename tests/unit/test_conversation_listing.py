"""``api.conversations.listing``: start order kept as ids come, and pages of it, checked
against the plain definition (sort everything, filter, take the newest) on random inputs."""

from __future__ import annotations

import random

from api.conversations.listing import StartOrdered, newest_before
from streams.ids import has_time, new_conversation_id


def reference(ids: set[str], before: str | None, limit: int,
              listed: set[str]) -> tuple[list[str], bool]:
    def key(c: str) -> tuple[bool, str]:
        return has_time(c), c

    kept = sorted((c for c in ids if c in listed and (before is None or key(c) < key(before))),
                  key=key)
    return kept[-limit:] if limit else [], len(kept) > limit


def test_ids_are_kept_in_start_order_as_they_come_each_once() -> None:
    timed = [new_conversation_id(now=1_800_000_000 + i) for i in range(5)]
    ordered = StartOrdered()
    for c in (timed[3], "cnv-ffffffffffffffff", timed[0], timed[4], "cnv-0000000000000001",
              timed[1], timed[2]):
        assert ordered.add(c)
    assert not ordered.add(timed[1])
    # Without a time (older ids) first, whatever their text; then by time.
    assert list(ordered) == ["cnv-0000000000000001", "cnv-ffffffffffffffff", *timed]
    assert len(ordered) == 7


def test_pages_match_the_plain_definition_on_random_inputs() -> None:
    rng = random.Random(14)
    for _ in range(300):
        pool = [new_conversation_id(now=1_800_000_000 + rng.random() * 50)
                for _ in range(rng.randint(0, 30))]
        pool += [f"cnv-{rng.getrandbits(64):016x}" for _ in range(rng.randint(0, 5))]
        # Two sources that overlap (held and indexed), some ids not listed (erased).
        a = {c for c in pool if rng.random() < 0.7}
        b = {c for c in pool if rng.random() < 0.5}
        listed = {c for c in pool if rng.random() < 0.8}
        before = rng.choice([None, *pool, new_conversation_id(now=1_800_000_025),
                             "cnv-8000000000000000"]) if pool else None
        limit = rng.randint(1, 8)
        asked: list[str] = []

        def is_listed(c: str, asked: list[str] = asked, listed: set[str] = listed) -> bool:
            asked.append(c)
            return c in listed

        got = newest_before([StartOrdered.of(a), StartOrdered.of(b)], before, limit, is_listed)
        assert got == reference(a | b, before, limit, listed), (sorted(a | b), before, limit)
        assert len(asked) == len(set(asked))  # each asked once, an id in both sources too


def test_walking_the_pages_lists_each_once_newest_page_first() -> None:
    ids = [new_conversation_id(now=1_800_000_000 + i) for i in range(10)]
    ids += [f"cnv-{i:016x}" for i in range(3)]  # without a time: the oldest
    source = StartOrdered.of(ids)
    seen: list[str] = []
    before = None
    while True:
        page, more = newest_before([source], before, 4, lambda _c: True)
        seen = page + seen
        if not more:
            break
        before = page[0]
    assert seen == list(source) and len(seen) == 13
