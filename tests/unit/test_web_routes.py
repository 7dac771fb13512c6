"""The web pages' routes on the real app (no broker: none of them reads a view): the pages and
their files are served with a strict content policy; the dev sign-in exists only in ``dev`` on a
loopback bind, mints a token the edge verifies, and names the field it refuses."""

from __future__ import annotations

import base64
import re
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.web import dev_signin_allowed
from api.web.pages import STATIC
from streams.settings import VoiceSettings
from streams.tokens import decode_claims

REAL_SECRETS = {"jwt_secret": "s" * 48, "master_key": base64.b64encode(b"k" * 32).decode()}
"""What prod requires instead of the built-in dev secrets."""


def settings(tmp_path: Path, env: str = "dev") -> VoiceSettings:
    extra = REAL_SECRETS if env == "prod" else {}
    return VoiceSettings(env=env, kafka_bootstrap="127.0.0.1:1",  # type: ignore[arg-type]
                         state_dir=tmp_path, **extra)


def client(tmp_path: Path, env: str = "dev", bind: str | None = "127.0.0.1") -> TestClient:
    """The app without its lifespan: the web routes need no producer, tail or view."""
    return TestClient(create_app(settings(tmp_path, env), bind_host=bind),
                      raise_server_exceptions=False)


@pytest.mark.parametrize(("env", "bind", "allowed"), [
    ("dev", "127.0.0.1", True), ("dev", "::1", True), ("dev", "localhost", True),
    ("dev", "0.0.0.0", False), ("dev", "10.1.2.3", False), ("dev", None, False),
    ("test", "127.0.0.1", False), ("prod", "127.0.0.1", False),
])
def test_dev_signin_only_in_dev_on_loopback(tmp_path: Path, env: str, bind: str | None,
                                             allowed: bool) -> None:
    assert dev_signin_allowed(settings(tmp_path, env), bind) is allowed
    c = client(tmp_path, env, bind)
    assert c.get("/web/config").json() == {"dev_signin": allowed}
    r = c.post("/dev/token", json={"sub": "alice"})
    assert r.status_code == (200 if allowed else 404)


def test_dev_token_verifies_as_asked(tmp_path: Path) -> None:
    r = client(tmp_path).post("/dev/token", json={"sub": "rev-1", "role": "reviewer",
                                                  "tenant": "t1"})
    assert r.status_code == 200
    claims = decode_claims(settings(tmp_path), r.json()["token"])
    assert (claims.sub, claims.role, claims.tenant) == ("rev-1", "reviewer", "t1")


@pytest.mark.parametrize(("body", "field"), [
    ({"sub": "alice", "role": "admin"}, "role"),
    ({"sub": "a b"}, "sub"),
    ({"sub": ""}, "sub"),
    ({"sub": "alice", "tenant": "../x"}, "tenant"),
    ({"sub": "alice", "extra": 1}, "extra"),
])
def test_dev_token_refusal_names_the_field(tmp_path: Path, body: dict, field: str) -> None:
    r = client(tmp_path).post("/dev/token", json=body)
    assert r.status_code == 422
    assert [d["loc"][-1] for d in r.json()["detail"]] == [field]


@pytest.mark.parametrize(("path", "hooks"), [
    ("/", ["message-input", "send-button", "transcript", "turn-state"]),
    ("/assistant", ["upload-input", "message-input", "send-button", "transcript"]),
    ("/staff", ["review-queue"]),
])
def test_pages_are_served_with_their_hooks(tmp_path: Path, path: str, hooks: list[str]) -> None:
    r = client(tmp_path, env="test").get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/html")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["referrer-policy"] == "no-referrer"
    for hook in hooks:
        assert f'data-testid="{hook}"' in r.text, hook


def test_every_script_module_is_served(tmp_path: Path) -> None:
    c = client(tmp_path, env="test")
    for path in sorted((STATIC / "js").glob("*.js")):
        r = c.get(f"/static/js/{path.name}")
        assert r.status_code == 200
        assert "javascript" in r.headers["content-type"]


def test_no_script_puts_the_token_in_a_url() -> None:
    """The bearer travels only in the Authorization header (a URL lands in logs and proxies)."""
    for path in (STATIC / "js").glob("*.js"):
        text = path.read_text()
        assert not re.search(r"[?&](access_)?token=", text), path.name
        assert "EventSource" not in text.replace("EventSource cannot", ""), path.name
