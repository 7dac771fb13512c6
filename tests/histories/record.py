"""Re-record the histories in this folder: ``.venv/bin/python tests/histories/record.py``.

Starts a local broker, the simulator and a worker, plays three test conversations, and exports
each turn with ``deploy.histories.export_history``. The keys in these files open only these
test conversations.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.histories import export_history  # noqa: E402
from deploy.kafka_local import LocalKafka, free_port  # noqa: E402
from deploy.processes import (  # noqa: E402
    spawn_voice,
    stop,
    wait_group_stable,
    wait_http_ready,
    worker_group,
)
from schemas.conversation import SendMessage, StartConversation  # noqa: E402
from streams.envelope import Envelope, decode  # noqa: E402
from streams.producer import RecordProducer  # noqa: E402
from streams.reading import read_topic  # noqa: E402
from streams.sealing import sealer_for  # noqa: E402
from streams.settings import VoiceSettings  # noqa: E402
from streams.topics import COMMANDS, CONVERSATIONS, create_topics, topic_name  # noqa: E402

OUT = Path(__file__).resolve().parent


def main() -> None:
    tmp = Path(tempfile.mkdtemp())
    broker = LocalKafka(data_dir=tmp / "kafka", port=free_port())
    broker.start()
    s = VoiceSettings(kafka_bootstrap=broker.bootstrap, topic_prefix="h.", group_prefix="h",
                      state_dir=tmp, env="test", topic_partitions=3)
    procs = []
    try:
        create_topics(s)
        port = free_port()
        procs.append(spawn_voice(s, "simulator", "--port", str(port), log=tmp / "sim.log"))
        wait_http_ready(f"http://127.0.0.1:{port}/health", proc=procs[0])
        procs.append(spawn_voice(s, "worker", log=tmp / "worker.log",
                                 ANTHROPIC_API_KEY="simulator",
                                 ANTHROPIC_BASE_URL=f"http://127.0.0.1:{port}"))
        wait_group_stable(s, worker_group(s))
        play(s)
    finally:
        for p in procs:
            stop(p)
        broker.stop()


def play(s: VoiceSettings) -> None:
    sealer = sealer_for(s)

    def send(*envs: Envelope) -> None:
        async def go() -> None:
            producer = RecordProducer(s)
            for env in envs:
                await producer.send(topic_name(s, COMMANDS), env)
            producer.close()

        asyncio.run(go())

    def log(cnv: str) -> list[Envelope]:
        return [decode(m.key(), m.value(), m.headers())
                for m in read_topic(s, topic_name(s, CONVERSATIONS), key=cnv.encode())]

    def start(cnv: str, owner: str) -> Envelope:
        return Envelope(record=StartConversation(conversation=cnv, owner=owner), key=cnv,
                        source="/history")

    def message(cnv: str, mid: str, text: str) -> Envelope:
        return Envelope(record=SendMessage(conversation=cnv, message_id=mid,
                                           text=sealer.seal(cnv, mid, text)),
                        key=cnv, source="/history")

    def wait_turn(turn: str) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if any(e.type == "voice.conversation.turn_state_changed.v1"
                   and e.record.turn == turn and e.record.state != "Thinking"  # type: ignore[attr-defined]
                   for e in log(turn.split(":")[0])):
                return
            time.sleep(0.2)
        raise TimeoutError(f"turn {turn} did not end")

    def next_turn(cnv: str) -> str:
        return f"{cnv}:turn-{max((e.seq or 0) for e in log(cnv)) + 1}"

    a, b = "cnv-a1a1a1a1a1a1a1a1", "cnv-b2b2b2b2b2b2b2b2"
    send(start(a, "alice"), message(a, "m1", "I am worried the crossing by the school is "
                                             "unsafe. Please add a traffic light."))
    wait_turn(f"{a}:turn-2")
    export_history(s, f"{a}:turn-2", OUT / "01_concern_with_proposal.json")
    turn = next_turn(a)
    send(message(a, "m2", "Also the pavement is broken and dangerous for wheelchairs. "
                          "We need it fixed."))
    wait_turn(turn)
    export_history(s, turn, OUT / "02_second_turn_with_history.json")
    send(start(b, "bob"), message(b, "m1", "asdf"))
    wait_turn(f"{b}:turn-2")
    export_history(s, f"{b}:turn-2", OUT / "03_could_not_interpret.json")


if __name__ == "__main__":
    main()
