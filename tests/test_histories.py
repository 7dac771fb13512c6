"""Recorded workflows under ``tests/histories/`` re-run on today's code: a change that breaks an
old conversation turn, assistant chat turn, research run, disclosure review or update delivery
fails here. Add one with ``voice replay workflow ID --export FILE`` (or re-record them with
``tests/histories/record.py``). Each kind also has a tampered copy that must diverge, so the
check is shown to fail when it should."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from deploy.histories import Recorded, load_history, load_recorded
from deploy.replay import rerun_recorded, rerun_turn, turn_history
from schemas.agent import ModelCallRecorded
from schemas.base import Sealed
from schemas.conversation import TranscriptRef, TurnOpened, TurnRepliedWithProposal
from schemas.staff import DevelopmentRecorded
from schemas.workflow import WorkflowStarted
from streams.envelope import Envelope
from streams.settings import VoiceSettings
from streams.topics import AGENT, CONVERSATIONS, WORKFLOWS

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))
HISTORIES_BY_STEM = {p.stem: p for p in HISTORIES}
KINDS = {"conversation-turn", "assistant-turn", "research", "disclosure-review",
         "update-delivery"}


def of_kind(kind: str) -> Recorded:
    return next(r for r in map(load_recorded, HISTORIES) if r.kind == kind)


def rerun(rec: Recorded) -> list[str]:
    return asyncio.run(rerun_recorded(VoiceSettings(), rec))


def test_there_are_recorded_histories_of_every_kind() -> None:
    assert {load_recorded(p).kind for p in HISTORIES} == KINDS


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
def test_recorded_workflow_reruns_without_divergence(path: Path) -> None:
    rec = load_recorded(path)
    assert rec.of(AGENT) or rec.kind == "update-delivery", "a history holds its agent records"
    assert rerun(rec) == []


def test_a_history_holds_a_conversation_log_of_folded_records() -> None:
    """Turns recorded before messages opened their turn in one record (01–03) and after (08:
    folded records, the turn's history named by its ``TurnOpened``) both re-run above."""
    logs = [load_recorded(p).of(CONVERSATIONS) for p in HISTORIES]
    folded = [log for log in logs if any(isinstance(e.record, TurnOpened) for e in log)]
    assert folded and all(e.record.history is not None for log in folded for e in log
                          if isinstance(e.record, TurnOpened))
    assert any(isinstance(e.record, TurnRepliedWithProposal) for log in folded for e in log)


def test_a_turn_named_by_its_opening_record_reads_what_that_record_names() -> None:
    """A turn whose input names the record that opened it (09) reads the positions that record
    names: drop the record and the re-run says so; empty its positions and the history read
    holds the message alone."""
    rec = load_recorded(HISTORIES_BY_STEM["09_second_turn_named_by_its_opening"])
    [started] = [e.record for e in rec.of(WORKFLOWS) if isinstance(e.record, WorkflowStarted)]
    assert set(started.input["history"]) == {"partition", "opened"}
    seq = started.input["history"]["opened"][0]
    log = rec.of(CONVERSATIONS)
    [opened] = [e for e in log if e.seq == seq and isinstance(e.record, TurnOpened)]
    assert opened.record.history is not None and opened.record.history.entries, \
        "the second turn's opening record names the first message and its reply"
    dropped = [e for e in log if e is not opened]
    assert rerun(dataclasses.replace(rec, envs={**rec.envs, CONVERSATIONS.name: dropped})) == [
        f"records [{seq}] of conversation {started.input['conversation']!r} are not on its log"]
    read = turn_history(rec.sealer, started.input, log)
    assert [m["role"] for m in read] == ["user", "assistant", "user"]
    assert read[-1]["content"].startswith("And the bench there is broken")
    emptied = opened.record.model_copy(update={"history": TranscriptRef()})
    tampered = [dataclasses.replace(e, record=emptied) if e is opened else e for e in log]
    assert turn_history(rec.sealer, started.input, tampered) == read[-1:]


def test_a_tampered_conversation_turn_diverges() -> None:
    """The check can fail: drop a recorded tool result and the re-run no longer matches."""
    workflow, sealer, envs = load_history(HISTORIES[0])
    agent = [e for e in envs["voice.agent"] if e.type != "voice.agent.tool_call.v1"]
    assert len(agent) < len(envs["voice.agent"]), "the history has a tool call to drop"
    divergences = asyncio.run(rerun_turn(VoiceSettings(), workflow, envs["voice.workflows"],
                                         agent, sealer))
    assert divergences


def _without_tool_calls(rec: Recorded) -> Recorded:
    agent = [e for e in rec.of(AGENT) if e.type != "voice.agent.tool_call.v1"]
    assert len(agent) < len(rec.of(AGENT)), f"the {rec.kind} history has a tool call to drop"
    return dataclasses.replace(rec, envs={**rec.envs, AGENT.name: agent})


def test_a_tampered_assistant_turn_diverges() -> None:
    divergences = rerun(_without_tool_calls(of_kind("assistant-turn")))
    assert any("was never recorded" in d for d in divergences), divergences


def _answer_edited(rec: Recorded, edit: Any) -> Recorded:
    """The history with its agent's last answer text changed by ``edit`` (resealed when the
    answer was sealed): the model calls replay as recorded, the step's output cannot."""
    agent = list(rec.of(AGENT))
    i = max(n for n, e in enumerate(agent) if isinstance(e.record, ModelCallRecorded)
            and e.record.response is not None)
    env = agent[i]
    call = env.record
    assert isinstance(call, ModelCallRecorded)
    sealed = isinstance(call.response, Sealed)
    content_id = f"{env.id}/response"
    response = (rec.sealer.open_json(call.conversation_id or "", content_id, call.response)
                if isinstance(call.response, Sealed) else dict(call.response or {}))
    blocks = [dict(b) for b in response["content"]]
    texts = [b for b in blocks if b.get("type") == "text"]
    assert texts, "the last answer has text to edit"
    texts[-1]["text"] = edit(texts[-1]["text"])
    response = {**response, "content": blocks}
    new = (rec.sealer.seal_json(call.conversation_id or "", content_id, response) if sealed
           else response)
    agent[i] = dataclasses.replace(env, record=call.model_copy(update={"response": new}))
    return dataclasses.replace(rec, envs={**rec.envs, AGENT.name: agent})


def test_a_tampered_research_run_diverges() -> None:
    """An answer that suggests other things than the run recorded: the step's output differs."""
    def retitle(text: str) -> str:
        doc = json.loads(text[text.rindex("```json") + 7:text.rindex("```")])
        for item in doc["sources"]:
            item["title"] = "A source nobody suggested"
        return text[:text.rindex("```json")] + "```json\n" + json.dumps(doc) + "\n```"

    divergences = rerun(_answer_edited(of_kind("research"), retitle))
    assert any("step 'research': output differs at .suggestions.sources" in d
               for d in divergences), divergences


def test_a_tampered_disclosure_review_diverges() -> None:
    """The privacy agent's flags dropped from its (sealed) answer: the flag step's output —
    compared opened, not as ciphertext — differs."""
    divergences = rerun(_answer_edited(of_kind("disclosure-review"),
                                       lambda _text: '```json\n{"flags": []}\n```'))
    assert any(d.startswith("step 'flag': output differs") for d in divergences), divergences


def test_a_tampered_update_delivery_diverges() -> None:
    """A development record that says something else than when it was delivered."""
    rec = of_kind("update-delivery")
    at = rec.log.at
    [where] = [k for k, e in at.items() if isinstance(e.record, DevelopmentRecorded)]
    env: Envelope = at[where]
    at[where] = dataclasses.replace(env, record=env.record.model_copy(
        update={"title": "Repairs cancelled"}))
    divergences = rerun(rec)
    assert any(d.startswith("step 'render': output differs") for d in divergences), divergences


def test_a_recorded_chat_replays_opened_and_once_erased_shows_nothing() -> None:
    """``voice replay assistant``: what the owner's clients saw, content opened with the
    chat's key; with the key erased, the same records show as erased and nothing opens."""
    from deploy.rerun_assistant import replay_assistant, turns_of_chat

    rec = of_kind("assistant-turn")
    chat = rec.workflow.split(":turn-")[0]
    log = rec.envs["voice.assistant"]
    shown = "\n".join(replay_assistant(log, chat, rec.sealer))
    assert "California on a map" in shown and "event: display" in shown
    ids = [int(line[4:]) for line in shown.splitlines() if line.startswith("id: ")]
    assert ids == sorted(ids) and len(ids) == len(set(ids)) and ids[0] == 1
    assert turns_of_chat(log) == [rec.workflow]

    rec.sealer.erase(chat)
    erased = "\n".join(replay_assistant(log, chat, rec.sealer))
    assert "California" not in erased and "event: erased" in erased and "<erased>" in erased
