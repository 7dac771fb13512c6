"""Fault 1 of issue 12: the worker SIGKILLed at each point of a turn, for participant turns and
the assistant → the reply recorded exactly once, the turn terminal, the assistant not left busy.

Each point is hit exactly by a test-only crash point (``VOICE_TEST_CRASH_AT=point@conversation``,
``streams.crashpoints``): the worker sends itself ``SIGKILL`` there. One conversation per point;
the workers run one after another, each armed for the next conversation's point and resuming
the previous one's turn; a last worker, armed for nothing, resumes the last. The points:

- ``before_turn_over``: the step failed (its model never answers; ``VOICE_STEP_DEADLINE_S``
  stops it, ``DEADLINE_EXCEEDED``), ``WorkflowFailed`` is recorded, and the worker dies before
  the bookkeeping (the turn's end; the assistant's busy flag) — the next owner runs it;
- ``before_step``: the step's attempt is recorded, its function never ran;
- ``model_call``: a model call of the step is in flight;
- ``after_reply``: the turn's results (reply and end, one command) are on ``voice.commands``,
  the step's outcome is not.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from schemas.assistant import AssistantReplyRecorded, AssistantTurnEnded
from schemas.conversation import (
    ConversationIndexed,
    ConversationStarted,
    MessageRecorded,
    ReplyRecorded,
    StartConversation,
    TurnStateChanged,
)
from schemas.staff import DevelopmentRecorded
from schemas.workflow import StepFailed, WorkflowCompleted, WorkflowFailed, WorkflowStarted
from streams.envelope import Envelope
from streams.ids import inbox_key, new_conversation_id, owner_key
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import (
    ASSISTANT,
    CONVERSATIONS,
    INBOX,
    ISSUES,
    OWNERS,
    WORKFLOWS,
    TopicSpec,
)
from tests.integration.test_staff_delivery import follow, inbox
from tests.integration.test_staff_helpers import Api
from tests.support import (
    accepted,
    forge_command,
    log_of,
    no_duplicate_seqs,
    send_message,
    stop,
    table_holds,
    wait_for,
)

pytestmark = [pytest.mark.integration, pytest.mark.faults]

POINTS = ("before_turn_over", "before_step", "model_call", "after_reply")
"""In this order: the first needs a worker whose model never answers (its step must fail),
and no later worker should inherit a turn it would fail too."""
KILLED = -9
ASSISTANT_BASE = "/api/v1/assistant"


def crash_env(point: str, conversation: str, held_model: str) -> dict[str, str]:
    env = {"VOICE_TEST_CRASH_AT": f"{point}@{conversation}"}
    if point == "before_turn_over":
        env |= {"ANTHROPIC_BASE_URL": held_model, "VOICE_STEP_DEADLINE_S": "3"}
    return env


def kill_at_each_point(start_worker: Callable[..., Any], held_model: str,
                       conversations: dict[str, str], send: Callable[[str, str], None],
                       ended: Callable[[str], object],
                       explain: Callable[[str], str] = lambda c: "") -> None:
    """Run one worker per point, each killed at its point in its conversation's turn; then one
    armed for nothing. Each resumes the previous point's turn, which ends before the next
    turn is sent: so each turn loses exactly one worker, at its own point. ``explain``: what
    a turn that did not end left on the log, for the failure's message."""
    previous, killed_at = None, None
    for point in POINTS:
        cnv = conversations[point]
        # At info: a turn that does not end shows what its worker did (its rebalance, its
        # tables read back) in the failure's report.
        worker = start_worker(loglevel="info", **crash_env(point, cnv, held_model))
        if previous is not None:
            try:
                wait_for(lambda c=previous: ended(c), timeout=120, what=f"{previous} to end")
            except TimeoutError as exc:
                raise TimeoutError(f"the turn killed at {killed_at} did not end: "
                                   f"{explain(previous)}") from exc
        send(point, cnv)
        worker.wait(timeout=120)
        assert worker.returncode == KILLED, f"the worker armed at {point} exited " \
                                            f"{worker.returncode}"
        previous, killed_at = cnv, point
    start_worker(loglevel="info")


def opened(start_worker: Callable[..., Any], open_one: Callable[[str], str]
           ) -> dict[str, str]:
    """One conversation per point, opened through a worker armed for nothing, which then
    stops (gracefully: it leaves the group at once) so that no turn lands on it."""
    plain = start_worker()
    try:
        return {point: open_one(point) for point in POINTS}
    finally:
        stop(plain)


def workflow_failures(settings: VoiceSettings, workflow: str) -> list[str]:
    """The error types of the workflow's failed attempts, its lifecycle checked dense and
    without a seq given twice. A worker killed after recording an attempt leaves it lost
    (``WorkerLost``); one killed before its table write reached the changelog leaves nothing
    to find, and the next owner starts the step again under the same record ids."""
    lifecycle = [e for e in log_of(settings, WORKFLOWS, workflow) if e.seq is not None]
    return [e.record.error_type for e in no_duplicate_seqs(lifecycle)
            if isinstance(e.record, StepFailed)]


def what_is_logged(settings: VoiceSettings, spec: TopicSpec, key: str) -> str:
    """``key``'s records on ``spec``, as seq and type, for a failure's message."""
    return ", ".join(f"{e.seq}:{type(e.record).__name__}" for e in log_of(settings, spec, key))


def turn_ended(settings: VoiceSettings, cnv: str) -> list[Envelope] | None:
    """``cnv``'s log once a turn of it has ended (a state past ``Thinking``), else None."""
    log = log_of(settings, CONVERSATIONS, cnv)
    done = [e for e in log if isinstance(e.record, TurnStateChanged)
            and e.record.state != "Thinking"]
    return log if done else None


def assistant_turns_ended(settings: VoiceSettings, conversation: str, n: int
                          ) -> list[Envelope] | None:
    """The assistant ``conversation``'s log once ``n`` of its turns have ended, else None."""
    log = log_of(settings, ASSISTANT, conversation)
    ends = [e for e in log if isinstance(e.record, AssistantTurnEnded)]
    return log if len({e.seq for e in ends}) >= n else None


def assistant_chat(client: httpx.Client, text: str, conversation: str | None = None,
                   also: tuple[int, ...] = ()) -> httpx.Response:
    """A chat (a new conversation's, or ``conversation``'s) with ``k-{text}`` as its key,
    posted until it is answered ``202`` or one of ``also`` (``accepted``)."""
    body: dict[str, Any] = {"message": f"Good morning ({text}), can you help me?",
                            "stream": False}
    if conversation is not None:
        body["conversation_id"] = conversation
    return accepted(lambda: client.post("/chat", json=body,
                                        headers={"Idempotency-Key": f"k-{text}"}), also=also)


def open_assistant_conversation(settings: VoiceSettings, client: httpx.Client, text: str,
                                also: tuple[int, ...] = ()) -> str:
    """An assistant conversation opened by a first chat (the edge names it), once its turn
    and its pattern extraction have ended: a workflow of it left running would be resumed by
    a worker armed for it, and crash it at the wrong command."""
    r = assistant_chat(client, text, also=also)
    assert r.status_code == 202, r.text
    conversation, turn = str(r.json()["conversation_id"]), str(r.json()["turn"])
    wait_for(lambda: assistant_turns_ended(settings, conversation, 1), timeout=90,
             what="the opening turn")
    wait_for(lambda: any(isinstance(e.record, (WorkflowCompleted, WorkflowFailed))
                         for e in log_of(settings, WORKFLOWS, f"{turn}:extract")),
             timeout=90, what="the opening turn's pattern extraction")
    return conversation


def test_a_participant_turn_killed_at_each_point_replies_once_and_ends(
        settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str], held_model: str) -> None:
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    client = httpx.Client(base_url=url, headers=auth, timeout=30)

    def open_one(point: str) -> str:
        r = accepted(lambda: client.post("/me/conversations",
                                         headers={"Idempotency-Key": f"open-{point}"}))
        return str(r.json()["conversation"])

    def send(point: str, cnv: str) -> None:
        send_message(client, cnv, f"k-{point}",
                     f"At {point}: the streetlight on Elm Road is broken.")

    try:
        conversations = opened(start_worker, open_one)
        kill_at_each_point(
            start_worker, held_model, conversations, send, lambda c: turn_ended(settings, c),
            lambda c: f"{CONVERSATIONS.name}: [{what_is_logged(settings, CONVERSATIONS, c)}]; "
                      f"{WORKFLOWS.name}: [{what_is_logged(settings, WORKFLOWS, f'{c}:turn-2')}]")
        for point, cnv in conversations.items():
            log = no_duplicate_seqs(wait_for(lambda c=cnv: turn_ended(settings, c), timeout=120,
                                             what=f"the turn killed at {point} to end"))
            records = [e.record for e in log]
            assert sum(isinstance(r, MessageRecorded) for r in records) == 1, point
            states = [(r.state, r.reason_code) for r in records
                      if isinstance(r, TurnStateChanged)]
            replies = [r for r in records if isinstance(r, ReplyRecorded)]
            failures = workflow_failures(settings, f"{cnv}:turn-2")
            if point == "before_turn_over":
                assert replies == [], point
                assert [s for s, _ in states] == ["Thinking", "CouldNotInterpret"], states
                assert states[-1][1] == "step_failed", states  # the failure: its deadline
                assert failures == ["DEADLINE_EXCEEDED"], failures
            else:
                assert len(replies) == 1, f"{point}: {len(replies)} replies"
                assert states == [("Thinking", None), ("Replied", None)], (point, states)
                assert failures in ([], ["WorkerLost"]), (point, failures)
            view = client.get(f"/me/conversations/{cnv}").json()
            assert [t["state"] for t in view["turns"]] == [states[-1][0]], view["turns"]
    finally:
        client.close()


def test_an_assistant_turn_killed_at_each_point_replies_once_and_is_not_left_busy(
        settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str], held_model: str) -> None:
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    client = httpx.Client(base_url=f"{url}{ASSISTANT_BASE}", headers=auth, timeout=30)

    def chat(text: str, conversation: str | None = None) -> httpx.Response:
        return assistant_chat(client, text, conversation, also=(409,))

    def open_one(point: str) -> str:
        # Its first turn ends on the unarmed worker; the armed turn is the conversation's
        # second.
        return open_assistant_conversation(settings, client, f"{point}, opening", also=(409,))

    def send(point: str, conversation: str) -> None:
        r = chat(point, conversation)
        assert r.status_code == 202, r.text

    try:
        conversations = opened(start_worker, open_one)
        kill_at_each_point(
            start_worker, held_model, conversations, send,
            lambda c: assistant_turns_ended(settings, c, 2),
            lambda c: f"{ASSISTANT.name}: [{what_is_logged(settings, ASSISTANT, c)}]")
        for point, conversation in conversations.items():
            log = no_duplicate_seqs(wait_for(lambda c=conversation: assistant_turns_ended(
                                                 settings, c, 2),
                                             timeout=120,
                                             what=f"the assistant turn killed at {point}"))
            ends = [r for e in log if isinstance(r := e.record, AssistantTurnEnded)]
            assert len(ends) == 2 and ends[0].turn != ends[1].turn, (point, ends)
            armed = ends[1].turn
            replies = [r for e in log if isinstance(r := e.record, AssistantReplyRecorded)
                       and r.turn == armed]
            if point == "before_turn_over":
                assert ends[-1].state == "Failed" and replies == [], point
                assert ends[-1].reason_code == "step_failed", ends[-1]
                assert workflow_failures(settings, armed) == ["DEADLINE_EXCEEDED"]
            else:
                assert ends[-1].state == "Replied", (point, ends[-1])
                assert len(replies) == 1, f"{point}: {len(replies)} replies"
            # Not left busy: the next message is taken, not answered 409 busy.
            again = chat(f"{point}, again", conversation)
            assert again.status_code == 202, (point, again.status_code, again.text)
    finally:
        client.close()


@pytest.mark.parametrize("point", ["before_follow_ups", "before_state_write"])
def test_a_writer_killed_around_what_a_command_starts_leaves_it_to_the_next(
        point: str, settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str]) -> None:
    # Decision 0016: the writer produces what a command's records start (a started
    # conversation's index entry, decision 0015; an opened turn's workflow) after the records
    # and before its table write. A worker lost before the follow-ups or before the table
    # leaves the command to the next owner, which decides it again against the old state: the
    # same records (deduped by seq) and the same follow-ups under the same ids.
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    client = httpx.Client(base_url=url, headers=auth, timeout=30)
    mine = owner_key("default", "alice")
    forged = new_conversation_id()
    try:
        # 1. A worker killed at the point of a started conversation (forged: its id known).
        worker = start_worker(loglevel="info", VOICE_TEST_CRASH_AT=f"{point}@{forged}")
        cnv = str(accepted(lambda: client.post(
            "/me/conversations", headers={"Idempotency-Key": "open"})).json()["conversation"])
        # The next worker's crash point names ``cnv``, for its turn's start. Were ``cnv``'s
        # state lost with this worker (a kill can lose a table write not yet sent), the next
        # one would decide its start again, and die there before writing ``forged``'s entry.
        wait_for(lambda: table_holds(settings, "conversations", cnv), timeout=60,
                 what="the conversation's state in its table's changelog")
        forge_command(settings, Envelope(
            record=StartConversation(conversation=forged, owner="alice"), key=forged,
            source="/test", subject=forged, id=f"open-{forged}", correlation=f"open-{forged}",
            tenant="default"))
        worker.wait(timeout=120)
        assert worker.returncode == KILLED
        assert [e.record for e in log_of(settings, CONVERSATIONS, forged)] == [
            ConversationStarted(conversation=forged, owner="alice")]
        entries = [e for e in log_of(settings, OWNERS, mine) if e.subject == forged]
        assert len(entries) == (0 if point == "before_follow_ups" else 1), entries

        # 2. The next one writes its entry, and is killed at the point of a turn's start. Its
        # acknowledgement of the message goes just before (its delivery not awaited), so the
        # kill may lose it: the client retries with the same key until a worker answers.
        worker = start_worker(loglevel="info", VOICE_TEST_CRASH_AT=f"{point}@{cnv}")

        def entry_written() -> bool:
            assert worker.poll() is None, (
                f"the next worker exited ({worker.returncode}) before writing the entry")
            return any(e.subject == forged for e in log_of(settings, OWNERS, mine))

        wait_for(entry_written, timeout=120, what="the entry written by the next worker")
        poster = httpx.Client(base_url=url, headers=auth, timeout=30)
        posting = ThreadPoolExecutor(1).submit(
            send_message, poster, cnv, "k-1", "The streetlight on Elm Road is broken.")
        worker.wait(timeout=120)
        assert worker.returncode == KILLED
        turn = f"{cnv}:turn-2"
        # (Its own runtime may have taken the start before the kill: a StepStarted after it.)
        starts = [e.id for e in log_of(settings, WORKFLOWS, turn)
                  if isinstance(e.record, WorkflowStarted)]
        assert starts == ([] if point == "before_follow_ups" else [f"{turn}:1"]), starts

        # 3. The next one starts it (or starts it again, the same start), and it replies once.
        start_worker(loglevel="info")
        posting.result(timeout=120)  # answered 202 (a lost answer given again)
        poster.close()
        log = no_duplicate_seqs(wait_for(lambda: turn_ended(settings, cnv), timeout=120,
                                         what="the turn to end"))
        records = [e.record for e in log]
        assert sum(isinstance(r, MessageRecorded) for r in records) == 1
        assert sum(isinstance(r, ReplyRecorded) for r in records) == 1
        assert [r.state for r in records if isinstance(r, TurnStateChanged)] == [
            "Thinking", "Replied"]
        lifecycle = log_of(settings, WORKFLOWS, turn)
        assert {e.id for e in lifecycle if isinstance(e.record, WorkflowStarted)} == {
            f"{turn}:1"}
        assert len({e.id for e in lifecycle if isinstance(e.record, WorkflowCompleted)}) == 1
        # Every entry of the index at least once, and each under one id: never another.
        indexed = log_of(settings, OWNERS, mine)
        assert {e.record for e in indexed} == {
            ConversationIndexed(conversation=c, owner="alice") for c in (cnv, forged)}
        assert len({e.id for e in indexed}) == 2
        view = client.get(f"/me/conversations/{cnv}").json()
        assert [t["state"] for t in view["turns"]] == ["Replied"], view["turns"]
    finally:
        client.close()


@pytest.mark.parametrize("point", ["before_follow_ups", "before_state_write"])
def test_an_assistant_writer_killed_around_what_a_chat_starts_leaves_it_to_the_next(
        point: str, settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str]) -> None:
    # Decision 0016, for the assistant: its writer indexes a chat's records and starts its
    # turn (told each record, ``ctx.on_recorded``) after the records and before its table
    # write. A worker lost before either leaves the chat to the next owner, which decides it
    # again: the same records (deduped by seq), the turn started once under its id, one reply.
    url = start_edge()
    auth = {"Authorization": f"Bearer {mint_token(settings, 'alice', 'participant')}"}
    client = httpx.Client(base_url=f"{url}{ASSISTANT_BASE}", headers=auth, timeout=30)

    try:
        # 1. An opening chat on an unarmed worker (the edge names the conversation), its turn
        # and its pattern extraction ended (a pattern is a command of the same writer).
        plain = start_worker()
        conversation = open_assistant_conversation(settings, client, "open")
        stop(plain)

        # 2. A worker killed at the point of the second chat; the client posts across the
        # kill with its key (the acknowledgement, sent just before, may be lost with it).
        worker = start_worker(loglevel="info", VOICE_TEST_CRASH_AT=f"{point}@{conversation}")
        posting = ThreadPoolExecutor(1).submit(assistant_chat, client, "second", conversation)
        worker.wait(timeout=120)
        assert worker.returncode == KILLED

        # 3. The next one starts the turn (again: the same start), and it replies once.
        start_worker(loglevel="info")
        turn = str(posting.result(timeout=120).json()["turn"])
        log = no_duplicate_seqs(wait_for(lambda: assistant_turns_ended(settings, conversation, 2),
                                         timeout=120,
                                         what="the chat's turn to end"))
        ends = [r for e in log if isinstance(r := e.record, AssistantTurnEnded)
                and r.turn == turn]
        assert [e.state for e in ends] == ["Replied"], ends
        assert sum(isinstance(r := e.record, AssistantReplyRecorded) and r.turn == turn
                   for e in log) == 1
        lifecycle = log_of(settings, WORKFLOWS, turn)
        assert {e.id for e in lifecycle if isinstance(e.record, WorkflowStarted)} == {
            f"{turn}:1"}
        assert len({e.id for e in lifecycle if isinstance(e.record, WorkflowCompleted)}) == 1
        # Not left busy: the next chat is taken.
        again = client.post("/chat", json={"message": "And another thing?", "stream": False,
                                           "conversation_id": conversation})
        assert again.status_code == 202, again.text
    finally:
        client.close()


@pytest.mark.parametrize("point", ["before_follow_ups", "before_state_write"])
def test_an_issue_writer_killed_around_a_development_leaves_its_delivery_to_the_next(
        point: str, settings: VoiceSettings, start_worker: Callable[..., Any],
        start_edge: Callable[..., str]) -> None:
    # Decision 0016, for the issues: the issue's writer starts a development's delivery (told
    # each record) before its table write. A worker lost before it leaves the development to
    # the next owner: recorded once, delivered once, each follower notified once.
    api = Api(start_edge(), settings)
    plain = start_worker()
    issue = api.open_issue("Streetlights on Elm Road are broken")
    followers = ["ann", "bob"]
    follow(api, issue, *followers)
    stop(plain)

    worker = start_worker(loglevel="info", VOICE_TEST_CRASH_AT=f"{point}@{issue}")
    # No idempotency key on this route: posted once; its acknowledgement, sent just before
    # the kill, may be lost with the worker (then 503), and the command is decided again.
    r = api.post(f"/staff/issues/{issue}/developments", "sam", "staff",
                 {"title": "Repairs approved", "body": "The council approved repairs."})
    assert r.status_code in (202, 503), r.text
    worker.wait(timeout=120)
    assert worker.returncode == KILLED
    start_worker(loglevel="info")
    dev = f"{issue}:dev-1"
    for sub in followers:
        assert [n["notification"] for n in inbox(api, sub, 1, timeout=120)["notifications"]] \
            == [f"{dev}:{sub}"]
    wait_for(lambda: any(isinstance(e.record, WorkflowCompleted)
                         for e in log_of(settings, WORKFLOWS, dev)), timeout=60,
             what="the delivery to complete")
    assert [r.development for e in no_duplicate_seqs(log_of(settings, ISSUES, issue))
            if isinstance(r := e.record, DevelopmentRecorded)] == [dev]
    # On the raw logs a record put again by a replayed command or step (same id, same seq) is
    # the at-least-once duplicate readers dedupe: counted by id and seq, never two of either.
    lifecycle = log_of(settings, WORKFLOWS, dev)
    assert {e.id for e in lifecycle if isinstance(e.record, WorkflowStarted)} == {f"{dev}:1"}
    assert len({e.id for e in lifecycle if isinstance(e.record, WorkflowCompleted)}) == 1
    for sub in followers:
        notified = no_duplicate_seqs(log_of(settings, INBOX, inbox_key("default", sub)))
        assert [e.id for e in notified] == [f"{dev}:{sub}"], notified
