"""Topic registry, schema export, settings and dev tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from schemas import registry
from streams.settings import VoiceSettings
from streams.tokens import AuthError, decode_claims, mint_token
from streams.topics import TOPICS, all_specs, topic_name


def test_every_topic_has_a_dlq_and_prefix_applies() -> None:
    names = [s.name for s in all_specs()]
    for spec in TOPICS:
        assert f"{spec.name}.dlq" in names
    s = VoiceSettings(topic_prefix="x.")
    assert topic_name(s, TOPICS[0]) == f"x.{TOPICS[0].name}"
    assert {s.name for s in TOPICS if s.read_by_workers} >= {"voice.commands", "voice.workflows"}
    # Their writers tell the worker what they put there (decision 0016): no worker reads them.
    assert {s.name for s in TOPICS if s.read_by_workers}.isdisjoint(
        {"voice.conversations", "voice.assistant", "voice.issues"})


def test_partitions_configurable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOICE_TOPIC_PARTITIONS", "12")
    assert VoiceSettings().topic_partitions == 12
    assert VoiceSettings().model_copy().topic_partitions == 12
    monkeypatch.delenv("VOICE_TOPIC_PARTITIONS")
    assert VoiceSettings().topic_partitions == 6


def test_schema_export_writes_every_type(tmp_path: Path) -> None:
    from deploy.cli import app

    result = CliRunner().invoke(app, ["schemas", "export", str(tmp_path)])
    assert result.exit_code == 0, result.output
    files = {p.stem for p in tmp_path.glob("*.json")}
    assert files == set(registry())
    schema = json.loads((tmp_path / "voice.conversation.send_message.v1.json").read_text())
    assert schema["x-ce-type"] == "voice.conversation.send_message.v1"
    assert "text" in schema["properties"]


def test_prod_refuses_the_dev_secret() -> None:
    with pytest.raises(ValueError, match="VOICE_JWT_SECRET"):
        VoiceSettings(env="prod")
    assert VoiceSettings(env="prod", jwt_secret="s3cret-for-prod-only-0123456789abcdef",
                         master_key="a-master-passphrase-for-prod-only-0123")


def test_token_round_trip_and_refusals() -> None:
    s = VoiceSettings()
    p = decode_claims(s, mint_token(s, "alice", "staff", "acme"))
    assert (p.sub, p.role, p.tenant) == ("alice", "staff", "acme")
    with pytest.raises(ValueError, match="role 'king'"):
        mint_token(s, "alice", "king")
    other = VoiceSettings(jwt_secret="another-secret-another-secret-0123")
    with pytest.raises(AuthError):
        decode_claims(other, mint_token(s, "alice", "participant"))
    with pytest.raises(AuthError):
        decode_claims(s, mint_token(s, "alice", "participant", ttl_s=-10))


def test_cli_token_command() -> None:
    from deploy.cli import app

    result = CliRunner().invoke(app, ["token", "--sub", "bob", "--role", "reviewer"])
    assert result.exit_code == 0, result.output
    assert decode_claims(VoiceSettings(), result.output.strip()).role == "reviewer"


def test_cli_token_with_memberships() -> None:
    from deploy.cli import app

    result = CliRunner().invoke(app, ["token", "--sub", "sam", "--role", "staff", "--tenant",
                                      "t1", "--member", "t2=participant"])
    assert result.exit_code == 0, result.output
    claims = decode_claims(VoiceSettings(), result.output.strip())
    assert claims.member_roles("default") == {"t1": "staff", "t2": "participant"}
    bad = CliRunner().invoke(app, ["token", "--sub", "sam", "--member", "t2"])
    assert bad.exit_code != 0 and "TENANT=ROLE" in bad.output
