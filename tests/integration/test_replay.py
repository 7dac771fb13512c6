"""``voice replay`` on a real broker: what SSE clients saw, and re-running a turn from the log."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from deploy.histories import load_history
from deploy.replay import rerun_turn
from schemas.conversation import EraseConversation, TurnStateChanged
from streams.envelope import Envelope
from streams.sealing import sealer_for
from streams.settings import VoiceSettings
from streams.topics import CONVERSATIONS
from tests.integration.test_turn_worker import (
    log_of,
    replied_log,
    send_commands,
    start_and_send,
)
from tests.support import env_for, wait_for

pytestmark = pytest.mark.integration


def voice(settings: VoiceSettings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deploy.cli", *args], env=env_for(settings),
                          capture_output=True, text=True, timeout=120, cwd=settings.state_dir)


def test_replay_shows_what_clients_saw_and_a_rerun_matches(settings: VoiceSettings,
                                                           start_worker) -> None:  # noqa: ANN001
    start_worker()
    cnv = "cnv-5e5e5e5e5e5e5e5e"
    start_and_send(settings, cnv, "The library closes too early. Please open it on Sundays.")
    wait_for(lambda: replied_log(settings, cnv), timeout=60, what="the reply")

    shown = voice(settings, "replay", "conversation", cnv, "--rerun")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    out = shown.stdout
    assert "event: message" in out and "The library closes too early" in out
    assert "event: proposal" in out and '"state": "Replied"' in out
    ids = [int(line[4:]) for line in out.splitlines() if line.startswith("id: ")]
    assert ids == sorted(ids) and len(ids) == len(set(ids))
    assert "re-ran 1 turn(s): 0 diverged" in out

    exported = settings.state_dir / "history.json"
    wf = voice(settings, "replay", "workflow", f"{cnv}:turn-2", "--rerun", "--export",
               str(exported))
    assert wf.returncode == 0, wf.stderr
    workflow, sealer, envs = load_history(exported)
    assert workflow == f"{cnv}:turn-2"
    # The turn's input refers to the conversation's records: the history holds them too.
    assert envs["voice.conversations"]
    assert asyncio.run(rerun_turn(settings, workflow, envs["voice.workflows"],
                                  envs["voice.agent"], sealer,
                                  envs["voice.conversations"])) == []
    missing = asyncio.run(rerun_turn(settings, workflow, envs["voice.workflows"],
                                     envs["voice.agent"], sealer))
    assert missing == [f"records [2] of conversation {cnv!r} are not on its log"]
    assert "voice.workflow.started.v1" in wf.stdout and "voice.agent.model_call.v1" in wf.stdout
    assert "0 diverged" in wf.stdout


def test_replay_of_an_erased_conversation_shows_it_erased(settings: VoiceSettings,
                                                          start_worker) -> None:  # noqa: ANN001
    start_worker()
    cnv = "cnv-6e6e6e6e6e6e6e6e"
    start_and_send(settings, cnv, "Too many cars speed through our street at night.")
    wait_for(lambda: replied_log(settings, cnv), timeout=60, what="the reply")
    sealer = sealer_for(settings)
    sealer.erase(cnv)
    sealer.close()
    send_commands(settings, Envelope(record=EraseConversation(conversation=cnv), key=cnv,
                                     source="/test"))
    wait_for(lambda: any(e.type == "voice.conversation.erased.v1"
                         for e in log_of(settings, CONVERSATIONS, cnv)), what="the erasure")
    shown = voice(settings, "replay", "conversation", cnv)
    assert shown.returncode == 0, shown.stderr
    assert "event: erased" in shown.stdout and "conversation erased" in shown.stdout
    assert "speed" not in shown.stdout
    assert not any(isinstance(e.record, TurnStateChanged) and e.record.state == "Thinking"
                   and "speed" in str(e.record) for e in log_of(settings, CONVERSATIONS, cnv))
    # Its turns cannot be re-run (their key is gone): said plainly, no traceback, exit 1.
    rerun = voice(settings, "replay", "conversation", cnv, "--rerun")
    assert rerun.returncode == 1, rerun.stdout + rerun.stderr
    assert "Traceback" not in rerun.stdout + rerun.stderr
    assert (f"cannot re-run {cnv}:turn-2: its conversation was erased (its key is gone)"
            in rerun.stdout)
    assert "re-ran 0 turn(s): 0 diverged; 1 not re-run (erased)" in rerun.stdout


def test_an_assistant_turn_and_a_research_run_rerun_without_divergence(
        settings: VoiceSettings, start_worker, start_edge) -> None:  # noqa: ANN001
    """Issue 13 (5): replay covers the assistant and the staff workflows too: a chat turn that
    called three tools and a research run re-run from the log with no divergence."""
    import httpx

    from tests.integration.test_staff_helpers import Api, workflow_log

    start_worker()
    api = Api(start_edge(), settings)
    upload = httpx.post(f"{api.url}/api/v1/assistant/files", files={
        "file": ("lights.csv", b"state,lights_out\nCA,3\nNY,5\n", "text/csv")},
        headers=api.headers("ann", "participant"), timeout=30)
    dataset = api.ok(upload, 201)["dataset_id"]
    chat = api.ok(api.post("/api/v1/assistant/chat", "ann", "participant", {
        "message": "Show the lights out in California on a map.", "data_refs": [dataset],
        "stream": False}), 202)
    chat_id, turn = chat["conversation_id"], chat["turn"]
    ended = api.until(f"/api/v1/assistant/conversations/{chat_id}/turns/{turn}", "ann",
                      "participant", lambda j: j["state"] != "Thinking", timeout=90,
                      what="the chat turn")
    assert ended["state"] == "Replied", ended

    shown = voice(settings, "replay", "assistant", chat_id, "--rerun")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    out = shown.stdout
    assert "voice.assistant.turn_requested.v1" in out and "California on a map" in out
    assert "event: display" in out and '"type": "done"' in out
    assert "re-ran 1 turn(s): 0 diverged" in out
    ran = voice(settings, "replay", "workflow", turn)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("voice.agent.tool_call.v1") == 3, ran.stdout

    issue = api.open_issue("Streetlights on Elm Road are broken", "Crime rose at night.", [
        "Three streetlights on Elm Road are broken since March.",
        "The streetlights on Elm Road are not broken; they were repaired in April."])
    run = api.ok(api.post(f"/staff/issues/{issue}/research", "sam", "staff"), 202)["run"]
    done = api.until(f"/staff/research/{run}", "sam", "staff",
                     lambda j: j["state"] != "Running", timeout=90, what="the research run")
    assert done["state"] == "Done", done
    wait_for(lambda: any(e.type == "voice.workflow.completed.v2"
                         for e in workflow_log(settings, run)), timeout=60,
             what="the run's completion on the log")
    rerun = voice(settings, "replay", "workflow", run, "--rerun")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert "voice.workflow.completed.v2" in rerun.stdout  # its one step's success, the end
    assert "re-ran 1 turn(s): 0 diverged" in rerun.stdout
