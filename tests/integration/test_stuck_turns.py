"""The fault suite's diagnosis of turns that never ended (``tests.faults.traffic.stuck_turns``):
what a failing run prints must name where each turn's records are, how far the worker group
has committed there, and what the processes warned about — read from the real broker."""

from __future__ import annotations

from pathlib import Path

import pytest

from schemas.base import Sealed
from schemas.conversation import SendMessage
from streams.envelope import Envelope
from streams.settings import VoiceSettings
from streams.topics import COMMANDS, WORKFLOWS, topic_name
from tests.faults.traffic import stuck_turns
from tests.support import forge_command

pytestmark = pytest.mark.integration


def test_a_stuck_turn_is_reported_with_its_records_commit_and_the_logs_warnings(
        settings: VoiceSettings, tmp_path: Path) -> None:
    turn = "turn-never-ended-7f3a"
    cnv = "cnv-stuck"
    forge_command(settings, Envelope(
        record=SendMessage(conversation=cnv, message_id=turn,
                           text=Sealed(key_version=1, nonce="bm9uY2U=", ciphertext="eA==")),
        key=cnv, source="/test", subject=cnv, id="cmd-stuck", tenant="t1",
        correlation="cmd-stuck"))
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "worker0.log").write_text(
        "[2026-12-03 10:00:00,000] [1] [INFO] all is well\n"
        "[2026-12-03 10:00:01,000] [1] [WARNING] commands[0]: offset 5 came before 3..4\n")

    report = stuck_turns(settings, {turn}, logs)

    commands = topic_name(settings, COMMANDS)
    assert f"1 turns not ended: ['{turn}']" in report
    assert f"{turn}: {commands}[" in report and "send_message" in report
    assert f"committed {commands}[" in report  # no commit yet: the group never read it
    assert "offset 5 came before 3..4" in report
    assert "all is well" not in report


def test_a_running_step_is_told_from_a_record_nobody_handled_by_the_workers_state(
        settings: VoiceSettings, start_worker, held_model: str, tmp_path: Path) -> None:  # noqa: ANN001
    """A turn whose model never answers stops on the log like a lost record would; the dump
    its worker logs on ``SIGUSR1`` (``consumers.frame.state_dump``) says it is a step running
    for so long, holding its ``WorkflowStarted`` as the lease the commit waits behind."""
    import json
    import re

    from tests.integration.test_turn_worker import start_and_send
    from tests.support import wait_for

    worker = start_worker(ANTHROPIC_BASE_URL=held_model)
    cnv = "cnv-7dead0000000001"
    turn = f"{cnv}:turn-2"
    start_and_send(settings, cnv, "The bridge on Mill Lane has a loose railing.")
    workflows = topic_name(settings, WORKFLOWS)
    started = re.compile(rf"{re.escape(turn)}: {re.escape(workflows)}\[(\d+)\]@(\d+) "
                         r"voice\.workflow\.started\.v1")

    def running() -> re.Match[str] | None:
        return started.search(stuck_turns(settings, {turn}, None))

    at = wait_for(running, timeout=60, what="the turn's workflow started")
    report = stuck_turns(settings, {turn}, tmp_path, [worker])

    dumps = [json.loads(line.split("worker state: ", 1)[1]) for line in report.splitlines()
             if "worker state: " in line]
    assert len(dumps) == 1, report
    runtime = dumps[0]["runtime"]
    assert len(runtime["steps"]) == 1 and not next(iter(runtime["steps"].values()))["finished"]
    assert list(runtime["leases"].values()) == [f"{workflows}[{at[1]}]@{at[2]}"], runtime
    partition = dumps[0]["consumer"]["partitions"][f"{workflows}[{at[1]}]"]
    assert partition["not_acknowledged"][0] == int(at[2]), partition
    assert any("_run_step" in where for where in dumps[0]["tasks"]["worker"]), dumps[0]["tasks"]
    assert worker.poll() is None  # the signal dumps, it does not stop
