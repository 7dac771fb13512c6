"""Helpers the staff integration tests share (no tests here): an HTTP client that speaks as a
role, and readers of the raw topics."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from schemas.base import Record
from streams.envelope import Envelope, decode
from streams.producer import RecordProducer
from streams.settings import VoiceSettings
from streams.tokens import mint_token
from streams.topics import COMMANDS, WORKFLOWS, TopicSpec, topic_name
from tests.support import read_all, stop, wait_for, wait_http_ready


class Api:
    """Calls the edge as a given subject and role."""

    def __init__(self, url: str, settings: VoiceSettings) -> None:
        self.url = url
        self.settings = settings

    def headers(self, sub: str, role: str, **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {mint_token(self.settings, sub, role)}", **extra}

    def post(self, path: str, sub: str, role: str, json: Any = None, **headers: str
             ) -> httpx.Response:
        return httpx.post(f"{self.url}{path}", json=json, headers=self.headers(sub, role,
                                                                               **headers),
                          timeout=15)

    def get(self, path: str, sub: str, role: str, **params: Any) -> httpx.Response:
        return httpx.get(f"{self.url}{path}", params=params, headers=self.headers(sub, role),
                         timeout=15)

    def delete(self, path: str, sub: str, role: str) -> httpx.Response:
        return httpx.delete(f"{self.url}{path}", headers=self.headers(sub, role), timeout=15)

    def ok(self, response: httpx.Response, status: int = 200) -> Any:
        assert response.status_code == status, (response.status_code, response.text)
        return response.json()

    def open_issue(self, title: str, summary: str = "", evidence: list[str] = ()) -> str:  # type: ignore[assignment]
        issue = self.ok(self.post("/staff/issues", "sam", "staff",
                                  {"title": title, "summary": summary}), 201)["issue"]
        for n, body in enumerate(evidence, start=1):
            self.ok(self.post(f"/staff/issues/{issue}/evidence", "sam", "staff",
                              {"title": f"Source {n}", "body": body}), 201)
        return issue

    def until(self, path: str, sub: str, role: str, check: Callable[[Any], bool],
              timeout: float = 60, what: str | None = None, **params: Any) -> Any:
        """GET ``path`` until ``check(json)`` holds; returns that json."""
        def probe() -> Any:
            r = self.get(path, sub, role, **params)
            return r.json() if r.status_code == 200 and check(r.json()) else None
        return wait_for(probe, timeout=timeout, interval=0.2, what=what or path)


def envelopes(settings: VoiceSettings, spec: TopicSpec, key: str | None = None
              ) -> list[Envelope]:
    """Every decodable record of a topic (only ``key``'s when given), in offset order."""
    out = []
    for m in read_all(settings, topic_name(settings, spec)):
        if key is None or m.key() == key.encode():
            out.append(decode(m.key(), m.value(), m.headers()))
    return out


def workflow_log(settings: VoiceSettings, workflow: str) -> list[Envelope]:
    return envelopes(settings, WORKFLOWS, workflow)


def kinds(log: list[Envelope]) -> list[str]:
    return [type(e.record).__name__ for e in log]


def produce(settings: VoiceSettings, spec: TopicSpec, *envs: Envelope) -> None:
    async def go() -> None:
        p = RecordProducer(settings)
        for env in envs:
            await p.send(topic_name(settings, spec), env)
        p.close()

    asyncio.run(go())


def command(settings: VoiceSettings, record: Record, key: str, id_: str) -> None:
    produce(settings, COMMANDS, Envelope(record=record, key=key, source="/test", id=id_,
                                         tenant="default"))  # the edge's default tenant


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)


@contextmanager
def slow_simulator(tmp: Path, latency_ms: int = 4000) -> Iterator[str]:
    """A model simulator that answers every call after ``latency_ms``."""
    from deploy.kafka_local import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "deploy.cli", "simulator", "--port", str(port)],
        env={**os.environ, "VOICE_SIMULATOR_LATENCY_MS": str(latency_ms)},
        stdout=open(tmp / "slow-sim.log", "ab"), stderr=subprocess.STDOUT)
    try:
        wait_http_ready(f"http://127.0.0.1:{port}/health", proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop(proc)
