"""Steady load and the log's audit, shared by the fault tests that run traffic through a fault
(broker restart, rebalance storm).

``SteadyPosts`` sends messages at a fixed rate round-robin over conversations, each with its
own ``Idempotency-Key``, from a thread pool (a slow answer never slows the rate), and keeps
every answer. ``resend_refused`` sends each message that never got a ``202`` again with its
key, as a client following ``Retry-After`` would. ``audit`` reads the conversations' log back
from the broker and checks the promise: dense seqs with no duplicate, each message on the log
once, each turn requested once, terminal once, replied at most once.
"""

from __future__ import annotations

import signal
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from subprocess import Popen

import httpx

from schemas.conversation import MessageRecorded, ReplyRecorded, TurnRequested, TurnStateChanged
from streams.envelope import Envelope, decode, unfolded
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, CONVERSATIONS, WORKFLOWS, topic_name
from tests.support import committed, read_all, wait_for

DUMP_WAIT_S = 2.0
"""How long ``stuck_turns`` gives the workers it signals to log their state."""


@dataclass
class Answer:
    """One POST of one message and what the edge said."""

    conversation: str
    text: str
    key: str
    sent_at: float
    """Seconds since the load began."""
    status: int = 0
    took: float = 0.0
    retry_after: str | None = None
    body: str = ""
    turn: str | None = None
    seq: int | None = None


@dataclass
class SteadyPosts:
    """POST ``rate`` messages a second, round-robin over ``conversations``, for ``seconds``."""

    client: httpx.Client
    conversations: list[str]
    rate: float = 20.0
    seconds: float = 20.0
    answers: list[Answer] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def post(self, a: Answer) -> Answer:
        """Send ``a``'s message (with its key) and fill in the answer; never raises."""
        began = time.monotonic()
        try:
            r = self.client.post(f"/me/conversations/{a.conversation}/messages",
                                 json={"text": a.text}, headers={"Idempotency-Key": a.key})
            a.status, a.body = r.status_code, r.text[:300]
            a.retry_after = r.headers.get("Retry-After")
            if r.status_code == 202:
                a.turn, a.seq = r.json()["turn"], r.json()["message"]["seq"]
        except httpx.HTTPError as exc:  # counted as no answer (the assertions say which)
            a.status, a.body = -1, f"{type(exc).__name__}: {exc}"
        a.took = time.monotonic() - began
        return a

    def run(self, during: list[tuple[float, object]] | None = None,
            longest: float = 300.0) -> list[Answer]:
        """Send for ``seconds``, and on until the steps of ``during`` are done (at most
        ``longest`` seconds in all). ``during`` is ``(not before second, callable)``, run in
        the order given on a thread of their own (a fault injected mid-load; a step may
        wait for its effect). Returns every answer."""
        steps = list(during or [])
        interval = 1.0 / self.rate
        start = time.monotonic()
        pending: list[Future[Answer]] = []
        with ThreadPoolExecutor(max_workers=int(self.rate * 4) + 8) as pool:
            failed: list[BaseException] = []
            fault = threading.Thread(target=_run_steps, args=(steps, start, failed),
                                     daemon=True)
            fault.start()
            n = 0
            while ((now := time.monotonic() - start) < self.seconds or fault.is_alive()) \
                    and now < longest:
                cnv = self.conversations[n % len(self.conversations)]
                a = Answer(cnv, f"Message {n} in {cnv}: the bins on Elm Road were not "
                                f"collected this week.", f"k-{uuid.uuid4().hex}", now)
                pending.append(pool.submit(self.post, a))
                n += 1
                time.sleep(max(0.0, start + n * interval - time.monotonic()))
            fault.join(timeout=1)
            assert not fault.is_alive(), f"the load's steps took over {longest}s"
            if failed:
                raise failed[0]
            self.answers = [f.result() for f in pending]
        return self.answers

    def resend_refused(self, deadline_s: float = 120.0) -> None:
        """Send every message without a ``202`` again, with its key, until each has one
        (concurrently, waiting ``Retry-After`` between tries, as a client would)."""
        deadline = time.monotonic() + deadline_s

        def resend(a: Answer) -> Answer:
            while a.status != 202 and time.monotonic() < deadline:
                time.sleep(min(float(a.retry_after or 1), 2.0))
                self.post(a)
            return a

        with ThreadPoolExecutor(max_workers=int(self.rate * 2) + 8) as pool:
            left = [a for a in pool.map(resend, self.answers) if a.status != 202]
        assert not left, f"{len(left)} never accepted in {deadline_s}s: {left[:3]}"


def timeline(answers: list[Answer]) -> str:
    """Answers by second of the load: ``second: status×count …`` (for failure messages)."""
    by_second: dict[int, Counter[int]] = defaultdict(Counter)
    for a in answers:
        by_second[int(a.sent_at)][a.status] += 1
    return "; ".join(f"{s}: " + " ".join(f"{k}×{n}" for k, n in sorted(c.items()))
                     for s, c in sorted(by_second.items()))


def _run_steps(steps: list[tuple[float, object]], start: float,
               failed: list[BaseException]) -> None:
    try:
        for at, step in steps:
            time.sleep(max(0.0, start + at - time.monotonic()))
            step()  # type: ignore[operator]
    except BaseException as exc:  # raised again by ``run``, on the test's thread
        failed.append(exc)


def wait_members(settings: VoiceSettings, group: str, n: int, timeout: float = 180) -> None:
    """Wait until consumer group ``group`` is stable with ``n`` members, each assigned."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": settings.bootstrap})

    def settled() -> bool:
        try:
            desc = admin.describe_consumer_groups([group])[group].result(timeout=5)
        except Exception:  # the coordinator busy: ask again
            return False
        return (str(desc.state).endswith("STABLE") and len(desc.members) == n
                and all(m.assignment.topic_partitions for m in desc.members))

    wait_for(settled, timeout=timeout, interval=0.5, what=f"{group} with {n} members")


def conversation_logs(settings: VoiceSettings) -> dict[str, list[Envelope]]:
    """Every record of the conversations topic, by conversation, as on the log (copies too),
    a folded record as the records it stands for (``unfolded``)."""
    out: dict[str, list[Envelope]] = defaultdict(list)
    for m in read_all(settings, topic_name(settings, CONVERSATIONS), timeout=15):
        env = decode(m.key(), m.value(), m.headers())
        out[env.key].extend(unfolded(env))
    return out


def _ended(logs: dict[str, list[Envelope]]) -> set[str]:
    return {e.record.turn for envs in logs.values() for e in envs
            if isinstance(e.record, TurnStateChanged) and e.record.state != "Thinking"}


def turns_terminal(settings: VoiceSettings, turns: set[str], timeout: float = 300,
                   logs_dir: Path | None = None, workers: Iterable[Popen[bytes]] = ()
                   ) -> dict[str, list[Envelope]]:
    """Wait until every turn in ``turns`` has a terminal state on the log; the logs then.
    On timeout the error says where each turn left off (``stuck_turns``), with the warnings
    of the processes' logs in ``logs_dir`` and the state ``workers`` dump."""

    def ended() -> dict[str, list[Envelope]] | None:
        logs = conversation_logs(settings)
        return logs if _ended(logs) >= turns else None

    try:
        return wait_for(ended, timeout=timeout, interval=3, what=f"{len(turns)} turns terminal")
    except TimeoutError as e:
        raise TimeoutError(f"{e}\n{stuck_turns(settings, turns, logs_dir, workers)}") from None


def stuck_turns(settings: VoiceSettings, turns: set[str], logs_dir: Path | None,
                workers: Iterable[Popen[bytes]] = (), lines: int = 80) -> str:
    """Where each turn of ``turns`` that has not ended left off, for a failure to say:
    every record that names it on the commands, conversations and workflows topics (topic,
    partition, offset, type), the worker group's committed offset beside each of those
    partitions' ends, and the last ``lines`` warnings and errors of each log in ``logs_dir`` —
    among them the state each running process of ``workers`` logs when sent ``SIGUSR1``
    (``consumers.frame.state_dump``: its steps, leases, records in flight, where it waits)."""
    from confluent_kafka.admin import AdminClient

    from deploy.processes import worker_group
    from streams.fetch import log_ends

    asked = [w for w in workers if w.poll() is None]
    for w in asked:
        w.send_signal(signal.SIGUSR1)

    stuck = sorted(turns - _ended(conversation_logs(settings)))
    out = [f"{len(stuck)} turns not ended: {stuck[:10]}"]
    names = [topic_name(settings, t) for t in (COMMANDS, CONVERSATIONS, WORKFLOWS)]
    parts: set[tuple[str, int]] = set()
    for topic in names:
        for m in read_all(settings, topic, timeout=15):
            value = m.value() or b""
            for turn in stuck[:10]:
                if turn.encode() in value:
                    kind = dict(m.headers() or []).get("ce_type", b"?").decode()
                    out.append(f"  {turn}: {m.topic()}[{m.partition()}]@{m.offset()} {kind}")
                    parts.add((m.topic(), m.partition()))
    try:
        done = committed(settings, worker_group(settings), sorted(parts))
        admin = AdminClient({"bootstrap.servers": settings.bootstrap})
        for topic in sorted({t for t, _p in parts}):
            ends = log_ends(admin, topic, [p for t, p in parts if t == topic], timeout=10)
            for partition, end in sorted(ends.items()):
                out.append(f"  committed {topic}[{partition}] {done[(topic, partition)]} "
                           f"of {end}")
    except Exception as e:  # noqa: BLE001 - a diagnosis never hides the failure it explains
        out.append(f"  committed offsets unread: {e!r}")
    if asked:
        time.sleep(DUMP_WAIT_S)  # the dumps are logged from each worker's loop
    for log in sorted(logs_dir.glob("*.log")) if logs_dir else []:
        said = [ln for ln in log.read_text(errors="replace").splitlines()
                if "WARNING" in ln or "ERROR" in ln or "Traceback" in ln]
        out.append(f"-- {log.name}: {len(said)} warnings and errors, the last {lines}:")
        out.extend(said[-lines:])
    return "\n".join(out)


def audit(logs: dict[str, list[Envelope]], accepted: list[Answer]) -> Counter[str]:
    """Assert the promise on the conversations' logs; return the turns' end states.

    - seqs are dense from 1, and two copies of one seq (a writer's replay) are one record;
    - every accepted message is on the log once, at the seq it was answered with, and
      nothing else is (``accepted`` is every message sent, each answered ``202`` at last);
    - every turn is requested once and ends once (``Replied``/``CouldNotInterpret``) and has
      at most one reply.
    """
    by_seq: dict[tuple[str, int], Envelope] = {}
    for cnv, envs in logs.items():
        for e in envs:
            assert e.seq is not None, e
            first = by_seq.setdefault((cnv, e.seq), e)
            assert first.id == e.id, f"{cnv} seq {e.seq} holds two records: {first} and {e}"
        seqs = sorted({e.seq for e in envs if e.seq is not None})
        assert seqs == list(range(1, len(seqs) + 1)), f"{cnv}: gaps in {seqs}"
    recorded = Counter(cnv for (cnv, _seq), e in by_seq.items()
                       if isinstance(e.record, MessageRecorded))
    keys = {(a.conversation, a.key) for a in accepted}
    sent = Counter(cnv for cnv, _key in keys)
    assert recorded == sent, f"messages on the log {dict(recorded)}, sent {dict(sent)}"
    assert len({(a.conversation, a.seq) for a in accepted}) == len(keys), \
        "two keys answered with one seq"
    for a in accepted:
        assert a.seq is not None
        rec = by_seq.get((a.conversation, a.seq))
        assert rec is not None and isinstance(rec.record, MessageRecorded), \
            f"202 for {a.conversation} seq {a.seq}, but the log holds {rec}"
    records = list(by_seq.values())
    requested = Counter(e.record.turn for e in records if isinstance(e.record, TurnRequested))
    assert set(requested.values()) <= {1}, "a turn requested twice"
    ends = Counter(e.record.turn for e in records if isinstance(e.record, TurnStateChanged)
                   and e.record.state != "Thinking")
    assert set(ends) == set(requested), set(requested) ^ set(ends)
    assert set(ends.values()) <= {1}, "a turn ended twice"
    replies = Counter(e.record.turn for e in records if isinstance(e.record, ReplyRecorded))
    assert set(replies.values()) <= {1}, "a turn replied twice"
    return Counter(e.record.state for e in records if isinstance(e.record, TurnStateChanged)
                   and e.record.state != "Thinking")


def assert_within_bound(answers: list[Answer], bound_s: float) -> Counter[int]:
    """Every answer is ``202``, or ``503`` with ``Retry-After``, within ``bound_s``; returns
    the count of each status."""
    statuses = Counter(a.status for a in answers)
    assert set(statuses) <= {202, 503}, (statuses, timeline(answers))
    late = [a for a in answers if a.took >= bound_s]
    assert not late, f"{len(late)} answers over the {bound_s}s bound: {late[:3]}"
    assert all(int(a.retry_after or 0) > 0 for a in answers if a.status == 503)
    return statuses


def resend_and_audit(settings: VoiceSettings, load: SteadyPosts, conversations: list[str],
                     resend_s: float = 180, terminal_s: float = 300,
                     logs_dir: Path | None = None, workers: Iterable[Popen[bytes]] = ()
                     ) -> int:
    """Send every refused message again (as a client following ``Retry-After``) until each is
    accepted, wait for every turn to end, and ``audit`` the log: every turn ``Replied`` once.
    Returns the number of turns."""
    load.resend_refused(deadline_s=resend_s)
    turns = {a.turn for a in load.answers if a.turn}
    logs = turns_terminal(settings, turns, timeout=terminal_s, logs_dir=logs_dir,
                          workers=workers)
    ends = audit({c: logs[c] for c in conversations}, load.answers)
    assert ends == Counter({"Replied": len(turns)}), ends
    return len(turns)
