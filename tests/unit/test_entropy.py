"""streams.entropy: the CSPRNG's bytes, each handed out once, one system call for many."""

from __future__ import annotations

import os
import threading
import uuid

import pytest

from streams import entropy
from streams.entropy import POOL_BYTES, random_bytes, random_hex, random_uuid_hex
from streams.sealing import MemoryKeyStore, Sealer


class _CountingUrandom:
    def __init__(self, real=os.urandom) -> None:
        self.calls = 0
        self._real = real

    def __call__(self, n: int) -> bytes:
        self.calls += 1
        return self._real(n)


def test_lengths_and_forms() -> None:
    assert [len(random_bytes(n)) for n in (0, 1, 12, 16, POOL_BYTES, POOL_BYTES + 1)] == \
        [0, 1, 12, 16, POOL_BYTES, POOL_BYTES + 1]
    text = random_hex(6)
    assert len(text) == 12 and int(text, 16) >= 0
    ident = uuid.UUID(hex=random_uuid_hex())
    assert ident.version == 4 and ident.variant == uuid.RFC_4122


def test_negative_length_is_refused() -> None:
    with pytest.raises(ValueError, match="-1"):
        random_bytes(-1)


def test_no_bytes_are_handed_out_twice_across_refills() -> None:
    # 12-byte pieces over ten refills: a repeat would mean a byte range handed out twice.
    seen = [random_bytes(12) for _ in range(10 * POOL_BYTES // 12)]
    assert len(set(seen)) == len(seen)


def test_threads_never_share_bytes() -> None:
    taken: list[list[bytes]] = [[] for _ in range(8)]

    def take(mine: list[bytes]) -> None:
        mine.extend(random_bytes(16) for _ in range(2_000))

    threads = [threading.Thread(target=take, args=(mine,)) for mine in taken]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [b for mine in taken for b in mine]
    assert len(every) == 16_000 and len(set(every)) == len(every)


def test_one_system_call_serves_hundreds_of_seals(monkeypatch: pytest.MonkeyPatch) -> None:
    # Regression (issue 14, twentieth pass): a nonce per os.urandom call made the worker's step
    # thread wait for the GIL ~15 times a turn.
    counting = _CountingUrandom()
    monkeypatch.setattr(entropy.os, "urandom", counting)
    monkeypatch.setattr(entropy, "_pool", entropy._Pool())
    sealer = Sealer(MemoryKeyStore())
    sealed = [sealer.seal("cnv-a", f"m{i}", "hello") for i in range(300)]
    assert counting.calls == 1
    assert len({s.nonce for s in sealed}) == 300
    assert all(sealer.open_text("cnv-a", f"m{i}", s) == "hello" for i, s in enumerate(sealed))


def test_a_large_request_goes_to_the_system_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    counting = _CountingUrandom()
    monkeypatch.setattr(entropy.os, "urandom", counting)
    monkeypatch.setattr(entropy, "_pool", entropy._Pool())
    assert len(random_bytes(POOL_BYTES + 1)) == POOL_BYTES + 1
    assert counting.calls == 1
    random_bytes(1)
    assert counting.calls == 2  # the pool was not filled by the large request


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_never_repeats_its_parents_bytes() -> None:
    random_bytes(1)  # the parent's pool holds unread bytes now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next bytes, to the parent
        try:
            os.write(write, random_bytes(64))
        finally:
            os._exit(0)
    os.close(write)
    child = b""
    while len(child) < 64:
        chunk = os.read(read, 64)
        if not chunk:
            break
        child += chunk
    os.close(read)
    os.waitpid(pid, 0)
    parent = random_bytes(64)
    assert len(child) == 64 and child != parent
