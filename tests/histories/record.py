"""Re-record the histories in this folder: ``.venv/bin/python tests/histories/record.py
[conversations] [products] [named]`` (the first two when none is named).

Starts a local broker, the simulator, a worker and an edge. ``conversations`` plays three test
conversations (``01``–``03``); ``products`` plays, through the edge, an assistant chat turn over
an uploaded CSV (three tool calls: describe, query, map), a research run, a disclosure review
of a flagged contribution (two reviewers) and an update delivery to a follower (``04``–``07``).
``named`` plays a second turn whose input names the record that opened it, which names the
positions the turn reads (``09``; earlier recordings carry the positions in the input).
Each workflow is exported with ``deploy.histories.export_history``. The keys in these files
open only these test aggregates.
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
from streams.envelope import Envelope, decode, unfolded  # noqa: E402
from streams.producer import RecordProducer  # noqa: E402
from streams.reading import read_topic  # noqa: E402
from streams.sealing import sealer_for  # noqa: E402
from streams.settings import VoiceSettings  # noqa: E402
from streams.topics import COMMANDS, CONVERSATIONS, create_topics, topic_name  # noqa: E402

OUT = Path(__file__).resolve().parent


def main(parts: set[str]) -> None:
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
        edge_port = free_port()
        procs.append(spawn_voice(s, "edge", "--port", str(edge_port), log=tmp / "edge.log"))
        wait_group_stable(s, worker_group(s))
        edge = f"http://127.0.0.1:{edge_port}"
        wait_http_ready(f"{edge}/readyz", proc=procs[-1])
        if parts & {"conversations", "named"}:
            play(s, parts)
        if "products" in parts:
            play_products(s, edge)
    finally:
        for p in procs:
            stop(p)
        broker.stop()


def play(s: VoiceSettings, parts: set[str]) -> None:
    sealer = sealer_for(s)

    def send(*envs: Envelope) -> None:
        async def go() -> None:
            producer = RecordProducer(s)
            for env in envs:
                await producer.send(topic_name(s, COMMANDS), env)
            producer.close()

        asyncio.run(go())

    def log(cnv: str) -> list[Envelope]:
        return [part for m in read_topic(s, topic_name(s, CONVERSATIONS), key=cnv.encode())
                for part in unfolded(decode(m.key(), m.value(), m.headers()))]

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

    if "named" in parts:
        c = "cnv-c3c3c3c3c3c3c3c3"
        send(start(c, "carol"), message(c, "m1", "The bus shelter on Elm Street has no roof."))
        wait_turn(f"{c}:turn-2")
        turn = next_turn(c)
        send(message(c, "m2", "And the bench there is broken too. Please repair both."))
        wait_turn(turn)
        export_history(s, turn, OUT / "09_second_turn_named_by_its_opening.json")
    if "conversations" not in parts:
        return
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


def wait_ended(s: VoiceSettings, workflow: str) -> None:
    """Until the workflow's lifecycle on the log has ended (what a history must hold)."""
    from tests.integration.test_staff_helpers import workflow_log
    from tests.support import wait_for

    wait_for(lambda: any(e.type in ("voice.workflow.completed.v1", "voice.workflow.failed.v1")
                         for e in workflow_log(s, workflow)), timeout=90, what=f"{workflow} ended")


def play_products(s: VoiceSettings, edge: str) -> None:
    """An assistant turn, a research run, a review and a delivery, through the edge."""
    import httpx

    from tests.integration.test_staff_helpers import Api

    api = Api(edge, s)
    csv = b"state,lights_out\nCA,3\nNY,5\n"
    upload = httpx.post(f"{edge}/api/v1/assistant/files", files={
        "file": ("lights.csv", csv, "text/csv")}, headers=api.headers("ann", "participant"),
        timeout=30)
    dataset = api.ok(upload, 201)["dataset_id"]
    chat = api.ok(api.post("/api/v1/assistant/chat", "ann", "participant", {
        "message": "Show the lights out in California on a map.", "data_refs": [dataset],
        "stream": False}), 202)
    api.until(f"/api/v1/assistant/conversations/{chat['conversation_id']}/turns/{chat['turn']}",
              "ann", "participant", lambda j: j["state"] != "Thinking", what="the chat turn")
    wait_ended(s, chat["turn"])
    export_history(s, chat["turn"], OUT / "04_assistant_chat_turn.json")

    issue = api.open_issue("Streetlights on Elm Road are broken", "Crime rose at night.", [
        "Three streetlights on Elm Road are broken since March.",
        "The streetlights on Elm Road are not broken; they were repaired in April."])
    run = api.ok(api.post(f"/staff/issues/{issue}/research", "sam", "staff"), 202)["run"]
    api.until(f"/staff/research/{run}", "sam", "staff", lambda j: j["state"] != "Running",
              what="the research run")
    wait_ended(s, run)
    export_history(s, run, OUT / "05_research_run.json")

    text = "I met Jane Porter at jane@example.org; the lights on Elm Road are broken."
    contribution = api.ok(api.post(f"/me/issues/{issue}/contributions", "ann", "participant",
                                   {"text": text}), 202)["contribution"]

    def waiting(step: str) -> None:
        api.until("/staff/reviews", "rev1", "reviewer", lambda items: any(
            i["contribution"] == contribution and i["waiting_for"] == step for i in items),
            what=f"the review to wait for {step}", state="waiting")

    def review(by: str, decision: str) -> None:
        api.ok(api.post(f"/staff/contributions/{contribution}/review", by, "reviewer",
                        {"decision": decision}), 202)

    waiting("review")
    review("rev1", "approve")
    waiting("second_review")
    review("rev2", "redact")
    wait_ended(s, contribution)
    export_history(s, contribution, OUT / "06_disclosure_review.json")

    api.ok(api.post(f"/me/issues/{issue}/follow", "bob", "participant"))
    api.ok(api.post(f"/staff/issues/{issue}/developments", "sam", "staff",
                    {"title": "Repairs ordered", "body": "The council ordered repairs."}), 202)
    development = f"{issue}:dev-1"
    wait_ended(s, development)
    export_history(s, development, OUT / "07_update_delivery.json")


if __name__ == "__main__":
    main(set(sys.argv[1:]) or {"conversations", "products"})
