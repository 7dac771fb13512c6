"""The spine on a real broker: topics, the edge → sequencer → log path, DLQ, readiness, tail."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import httpx
import pytest

from schemas.conversation import StartConversation
from streams.envelope import Envelope, decode, encode
from streams.producer import RecordProducer
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, CONVERSATIONS, TOPICS, all_specs, create_topics, topic_name
from tests.support import env_for, read_all, wait_for

pytestmark = pytest.mark.integration


def auth(settings: VoiceSettings, sub: str = "alice") -> dict[str, str]:
    return {"Authorization": f"Bearer {mint_token(settings, sub, 'participant')}"}


def test_topics_create_is_idempotent_and_uses_configured_partitions(settings: VoiceSettings
                                                                     ) -> None:
    again = create_topics(settings)
    assert set(again.values()) == {"exists"}
    assert set(again) == {topic_name(settings, s) for s in all_specs()}
    from streams.topics import describe_topics

    rows = describe_topics(settings)
    assert all(r["partitions"] == settings.topic_partitions for r in rows)


def test_cli_topics_create_and_list(settings: VoiceSettings) -> None:
    env = env_for(settings, VOICE_TOPIC_PREFIX=settings.topic_prefix + "cli.")
    run = lambda *a: subprocess.run([sys.executable, "-m", "deploy.cli", *a], env=env,  # noqa: E731
                                    capture_output=True, text=True, timeout=60)
    first = run("topics", "create")
    assert first.returncode == 0, first.stderr
    assert first.stdout.count("created") == len(all_specs())
    second = run("topics", "create")
    assert second.stdout.count("exists") == len(all_specs()) and "created" not in second.stdout
    listed = run("topics", "list")
    assert "MISSING" not in listed.stdout and "voice.commands.dlq" in listed.stdout


def test_edge_request_flows_as_cloudevents_records(settings: VoiceSettings, start_worker,
                                                   start_edge) -> None:  # noqa: ANN001
    start_worker()
    url = start_edge()
    r = httpx.post(f"{url}/me/conversations", headers=auth(settings), timeout=10)
    assert r.status_code == 201, r.text
    cnv = r.json()["conversation"]
    listed = httpx.get(f"{url}/me/conversations", headers=auth(settings), timeout=5).json()
    assert cnv in [c["conversation"] for c in listed]
    assert httpx.get(f"{url}/me/conversations", headers=auth(settings, "bob")).json() == []

    cmds = [m for m in read_all(settings, topic_name(settings, COMMANDS))
            if m.key() == cnv.encode()]
    log = [m for m in read_all(settings, topic_name(settings, CONVERSATIONS))
           if m.key() == cnv.encode()]
    assert len(cmds) == 1 and len(log) == 1
    h = dict(log[0].headers())
    assert h["ce_specversion"] == b"1.0" and h["ce_type"] == b"voice.conversation.started.v1"
    assert h["voice_seq"] == b"1" and h["voice_causation"] == dict(cmds[0].headers())["ce_id"]
    assert h["ce_source"] == b"/voice/sequencer" and h["voice_tenant"] == b"default"


def test_unauthenticated_requests_are_refused(settings: VoiceSettings, start_edge) -> None:  # noqa: ANN001
    url = start_edge()
    assert httpx.post(f"{url}/me/conversations").status_code == 401
    bad = httpx.post(f"{url}/me/conversations", headers={"Authorization": "Bearer nope"})
    assert bad.status_code == 401 and "invalid token" in bad.json()["detail"]


def test_garbage_on_every_worker_topic_goes_to_its_dlq_and_the_worker_goes_on(
    settings: VoiceSettings, start_worker, start_edge  # noqa: ANN001
) -> None:
    worker = start_worker()
    url = start_edge()
    read = [s for s in TOPICS if s.read_by_workers]
    garbage = [
        (b"k1", b"\x00\xff not json", [("ce_specversion", b"1.0"), ("ce_type", b"voice.x.v1")]),
        (b"k2", b"{}", []),
        (None, b"\x89PNG", None),
    ]

    async def produce() -> None:
        p = RecordProducer(settings)
        for spec in read:
            for key, value, headers in garbage:
                await p.produce_raw(topic_name(settings, spec), key, value, headers)
        p.close()

    asyncio.run(produce())
    for spec in read:
        dlq = topic_name(settings, spec) + ".dlq"
        msgs = wait_for(lambda dlq=dlq: (m := read_all(settings, dlq)) and len(m) >= 3 and m,
                        timeout=30, what=f"3 records on {dlq}")
        assert len(msgs) == 3
        for m in msgs:
            h = dict(m.headers())
            assert h["voice_dlq_topic"] == topic_name(settings, spec).encode()
            assert h["voice_dlq_reason"] and int(h["voice_dlq_offset"]) >= 0
        assert {m.value() for m in msgs} == {g[1] for g in garbage}
    assert worker.poll() is None
    # ...and the same worker still serves good commands afterwards.
    r = httpx.post(f"{url}/me/conversations", headers=auth(settings), timeout=10)
    assert r.status_code == 201, r.text


def test_readyz_reports_topics_and_consumers(settings: VoiceSettings, start_edge,  # noqa: ANN001
                                             kafka_bootstrap: str, tmp_path) -> None:  # noqa: ANN001
    url = start_edge()
    body = httpx.get(f"{url}/readyz").json()
    assert body["ready"] is True and body["checks"]["consumers"] == "assigned"
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{url}/openapi.json").json()["info"]["title"] == "Voice edge"
    assert httpx.get(f"{url}/docs").status_code == 200


def test_readyz_names_missing_topics(kafka_bootstrap: str, tmp_path) -> None:  # noqa: ANN001
    """An edge whose topics do not exist answers 503 and names them."""
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tests.support import unique_settings

    s = unique_settings(kafka_bootstrap, tmp_path)
    with TestClient(create_app(s)) as client:
        r = client.get("/readyz")
        assert r.status_code == 503
        assert topic_name(s, COMMANDS) in r.json()["checks"]["topics"]["missing"]


def test_voice_tail_decodes_records_live(settings: VoiceSettings) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "tail", "voice.conversations", "--max", "1"],
        env=env_for(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)  # let it assign at the end of the topic

    async def produce() -> None:
        p = RecordProducer(settings)
        env = Envelope(record=StartConversation(conversation="cnv-00aa11bb22cc33dd",
                                                owner="alice"),
                       key="cnv-00aa11bb22cc33dd", source="/test", seq=1)
        await p.send(topic_name(settings, CONVERSATIONS), env)
        await p.produce_raw(topic_name(settings, CONVERSATIONS), b"k", b"junk", None)
        p.close()

    asyncio.run(produce())
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "cnv-00aa11bb22cc33dd voice.conversation.start.v1 seq=1" in out
    assert '"owner":"alice"' in out


def test_decode_of_what_the_stack_produced(settings: VoiceSettings) -> None:
    """Records produced through the shared producer decode back to the same envelope."""
    env = Envelope(record=StartConversation(conversation="cnv-0011223344556677", owner="a"),
                   key="cnv-0011223344556677", source="/test", seq=3, tenant="t")

    async def produce() -> None:
        p = RecordProducer(settings)
        await p.send(topic_name(settings, CONVERSATIONS), env)
        p.close()

    asyncio.run(produce())
    (m,) = read_all(settings, topic_name(settings, CONVERSATIONS))
    back = decode(m.key(), m.value(), m.headers())
    assert back.record == env.record and back.id == env.id and back.seq == 3
    assert encode(back)[1] == encode(env)[1]
