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
from streams.topics import COMMANDS, topic_name
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
