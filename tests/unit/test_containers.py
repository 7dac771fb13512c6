"""Structural checks of docker-compose.yml and deploy/Dockerfile.

No Docker engine runs where the suite runs, so the stack is never started here; these tests
catch the mistakes that would only show at ``docker compose up`` (a service dropped, a wrong
image, a dependency that starts too early, a subcommand the CLI does not have).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import typer
import yaml

from deploy import cli

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "deploy" / "Dockerfile"
README = ROOT / "README.md"

VOICE_SERVICES = {"topics", "simulator", "worker", "edge", "telemetry"}
ALL_SERVICES = VOICE_SERVICES | {"kafka", "clickhouse"}


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict) -> dict:
    return compose["services"]


def env_of(service: dict) -> dict[str, str | None]:
    """The environment as a mapping, whichever of compose's two spellings is used."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) if "=" in item else (item, None) for item in env)
        env = dict(pairs)
    return {k: (None if v is None else str(v)) for k, v in env.items()}


def interpolated_default(value: str) -> str:
    """``${VAR:-default}`` as compose resolves it when VAR is unset on the host."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:?-([^}]*)\}", r"\1", value)


def argv_of(service: dict) -> list[str]:
    command = service.get("command")
    if command is None:
        return []
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def cli_tree() -> dict:
    """The ``voice`` command tree, from the Typer app itself (leaf commands map to None)."""
    assert isinstance(cli.app, typer.Typer), "deploy.cli.app must be the voice Typer app"

    def walk(command) -> dict | None:  # noqa: ANN001
        subcommands = getattr(command, "commands", None)
        if subcommands is None:
            return None
        return {name: walk(sub) for name, sub in subcommands.items()}

    tree = walk(typer.main.get_command(cli.app))
    assert isinstance(tree, dict), "deploy.cli.app must be a command group (voice <command>)"
    return tree


def resolves(tree: dict, argv: list[str]) -> bool:
    """Whether argv names a runnable command: every group on the way, ending at a leaf."""
    node: dict | None = tree
    for token in argv:
        if token.startswith("-"):
            break
        if node is None:
            return True  # a leaf command's positional arguments
        if token not in node:
            return False
        node = node[token]
    return node is None


# docker-compose.yml


def test_every_service_is_defined(services: dict) -> None:
    assert set(services) == ALL_SERVICES


def test_kafka_is_single_node_kraft(services: dict) -> None:
    kafka = services["kafka"]
    assert re.fullmatch(r"apache/kafka:4(\.\d+)*", kafka["image"]), kafka["image"]
    assert "build" not in kafka
    env = env_of(kafka)
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"{node_id}@kafka:9093"
    assert set(env["KAFKA_LISTENERS"].split(",")) == {"PLAINTEXT://:9092", "CONTROLLER://:9093"}
    assert env["KAFKA_ADVERTISED_LISTENERS"] == "PLAINTEXT://kafka:9092"
    assert env["KAFKA_CONTROLLER_LISTENER_NAMES"] == "CONTROLLER"
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == "1", key
    assert "kafka-broker-api-versions.sh" in " ".join(kafka["healthcheck"]["test"])


def test_data_lives_in_named_volumes(compose: dict, services: dict) -> None:
    named = set(compose.get("volumes") or {})
    kafka_env = env_of(services["kafka"])
    for name, data_dir in (
        ("kafka", kafka_env["KAFKA_LOG_DIRS"]),
        ("clickhouse", "/var/lib/clickhouse"),
    ):
        mounts = dict(v.split(":", 1) for v in services[name]["volumes"])
        assert data_dir in mounts.values(), f"{name} data dir {data_dir} is not a volume"
        source = next(s for s, target in mounts.items() if target == data_dir)
        assert source in named, f"{name} mounts {source!r}, not a named volume"


def test_clickhouse_is_the_official_server_image(services: dict) -> None:
    clickhouse = services["clickhouse"]
    assert re.fullmatch(r"clickhouse/clickhouse-server(:[\w.-]+)?", clickhouse["image"])
    assert clickhouse["healthcheck"]["test"]


@pytest.mark.parametrize("name", sorted(VOICE_SERVICES))
def test_voice_service_builds_the_image_and_reaches_the_stack(services: dict, name: str) -> None:
    service = services[name]
    assert service["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
    assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    env = env_of(service)
    advertised = env_of(services["kafka"])["KAFKA_ADVERTISED_LISTENERS"]
    assert env["VOICE_KAFKA_BOOTSTRAP"] == advertised.removeprefix("PLAINTEXT://")
    assert env["VOICE_ENV"] == "prod"
    assert env["VOICE_CLICKHOUSE_URL"] == "http://clickhouse:8123"
    sim_port = env_of(services["simulator"])["VOICE_SIMULATOR_PORT"]
    base_url = interpolated_default(env["ANTHROPIC_BASE_URL"])
    assert base_url == f"http://simulator:{sim_port}"
    assert "ANTHROPIC_API_KEY" in env


@pytest.mark.parametrize("name", sorted(VOICE_SERVICES))
def test_voice_service_command_is_a_real_subcommand(services: dict, name: str) -> None:
    argv = argv_of(services[name])
    assert argv, f"{name} has no command; the image's default only prints help"
    assert resolves(cli_tree(), argv), f"`voice {' '.join(argv)}` is not a command of deploy.cli"


def test_every_service_using_the_voice_image_runs_a_real_subcommand(services: dict) -> None:
    # Found from the compose file, so a service added later is checked too.
    voice_image = {name for name, s in services.items() if "build" in s}
    assert voice_image == VOICE_SERVICES
    tree = cli_tree()
    wrong = [name for name in voice_image if not resolves(tree, argv_of(services[name]))]
    assert not wrong, f"not commands of deploy.cli: {[argv_of(services[n]) for n in wrong]}"


def readme_commands() -> list[list[str]]:
    """The argv of each ``voice …`` in the README's table of the ``voice`` command."""
    section = README.read_text().split("## The `voice` command", 1)[1].split("\n## ", 1)[0]
    rows = [re.split(r"(?<!\\)\|", line)[1] for line in section.splitlines()
            if line.startswith("| `voice")]
    spans = [span for row in rows for span in re.findall(r"`voice ([^`]+)`", row)]
    return [shlex.split(span.replace("\\|", "|")) for span in spans]


def test_the_readme_table_and_the_cli_name_the_same_commands() -> None:
    tree, documented = cli_tree(), readme_commands()
    assert documented, "README.md has no table of `voice` commands"
    unknown = [argv for argv in documented if not resolves(tree, argv)]
    assert not unknown, f"in README.md but not in deploy.cli: {unknown}"
    undocumented = set(tree) - {argv[0] for argv in documented}
    assert not undocumented, f"in deploy.cli but not in README.md: {sorted(undocumented)}"


def test_topics_runs_once_after_kafka_is_healthy(services: dict) -> None:
    topics = services["topics"]
    assert argv_of(topics)[:2] == ["topics", "create"]
    assert topics["depends_on"]["kafka"]["condition"] == "service_healthy"
    assert str(topics.get("restart", "no")) == "no"


@pytest.mark.parametrize("name", ["worker", "edge", "telemetry"])
def test_consumers_wait_for_topics_to_exist(services: dict, name: str) -> None:
    depends = services[name]["depends_on"]
    assert depends["topics"]["condition"] == "service_completed_successfully"


def test_telemetry_waits_for_clickhouse(services: dict) -> None:
    assert services["telemetry"]["depends_on"]["clickhouse"]["condition"] == "service_healthy"


def test_edge_publishes_8000_on_loopback_only(services: dict) -> None:
    edge = services["edge"]
    assert [str(p) for p in edge["ports"]] == ["127.0.0.1:8000:8000"]
    env = env_of(edge)
    assert env["VOICE_EDGE_HOST"] == "0.0.0.0"  # inside the container, for the published port
    assert env["VOICE_EDGE_PORT"] == "8000"


def published_host_ips(service: dict) -> list[str]:
    """The host address of each published port, in either of compose's syntaxes ("" = all)."""
    ips = []
    for port in service.get("ports") or []:
        if isinstance(port, dict):
            ips.append(str(port.get("host_ip", "")))
        else:
            parts = str(port).rsplit(":", 2)
            ips.append(parts[0] if len(parts) == 3 else "")
    return ips


def test_no_service_publishes_a_port_beyond_loopback(services: dict) -> None:
    wide = {name: ips for name, s in services.items()
            if (ips := published_host_ips(s)) and any(ip != "127.0.0.1" for ip in ips)}
    assert not wide, f"published on more than 127.0.0.1: {wide}"


SECRETS = {"VOICE_JWT_SECRET": "openssl rand -base64 48",
           "VOICE_MASTER_KEY": "openssl rand -base64 32"}


@pytest.mark.parametrize("name", sorted(VOICE_SERVICES))
def test_voice_services_require_real_secrets(services: dict, name: str) -> None:
    # `${VAR:?message}`: compose refuses to start while VAR is unset or empty on the host,
    # and says how to generate one; no default could be a secret.
    env = env_of(services[name])
    for var, how in SECRETS.items():
        match = re.fullmatch(r"\$\{(\w+):\?([^}]+)\}", env.get(var) or "")
        assert match and match[1] == var, f"{name}: {var} is {env.get(var)!r}"
        assert how in match[2], match[2]


def test_the_compose_environment_starts_an_edge_that_passes_the_bind_check(
        services: dict, monkeypatch: pytest.MonkeyPatch) -> None:
    from streams.settings import check_bind, load_settings

    for var in [v for v in os.environ if v.startswith("VOICE_")]:
        monkeypatch.delenv(var)
    env = env_of(services["edge"])
    filled = {"VOICE_JWT_SECRET": "j" * 64, "VOICE_MASTER_KEY": "a2V5" * 11}
    for var, value in env.items():
        if var.startswith("VOICE_"):
            monkeypatch.setenv(var, filled.get(var, value or ""))
    settings = load_settings()
    check_bind(settings, settings.edge_host, "voice edge")  # raises on a dev secret


def test_no_voice_service_needs_a_shared_volume(compose: dict, services: dict) -> None:
    # The keys live on the cluster (voice.keys): edge, worker and sink share nothing on disk,
    # so each can run N times, on any host.
    for name in ("edge", "worker", "telemetry", "topics"):
        assert not services[name].get("volumes"), (name, services[name].get("volumes"))
    assert set(compose.get("volumes") or {}) == {"kafka-data", "clickhouse-data"}


# deploy/Dockerfile


@pytest.fixture(scope="module")
def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    result = []
    for line in lines:
        instruction, _, args = line.partition(" ")
        result.append((instruction.upper(), args.strip()))
    return result


def args_of(instructions: list[tuple[str, str]], name: str) -> list[str]:
    return [args for instruction, args in instructions if instruction == name]


def test_dockerfile_is_based_on_python_311_or_newer(instructions) -> None:
    froms = args_of(instructions, "FROM")
    assert froms, "no FROM line"
    final = froms[-1].split()[0]
    match = re.fullmatch(r"(?:docker\.io/(?:library/)?)?python:3\.(\d+)(?:[.-][\w.-]*)?", final)
    assert match and int(match.group(1)) >= 11, final


def test_dockerfile_copies_what_pyproject_packages(instructions) -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    includes = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = {pattern.rstrip("*") for pattern in includes}
    copied = set()
    for args in args_of(instructions, "COPY"):
        parts = [p for p in args.split() if not p.startswith("--")]
        copied.update(p.rstrip("/").removeprefix("./") for p in parts[:-1])
    assert {"pyproject.toml", pyproject["project"]["readme"]} <= copied
    assert packages <= copied, f"not copied into the image: {sorted(packages - copied)}"


def test_dockerfile_installs_the_project(instructions) -> None:
    runs = " && ".join(args_of(instructions, "RUN"))
    assert re.search(r"pip install(?: -\S+)* \.(?:\s|$)", runs), runs


def test_dockerfile_installs_the_lock_make_installs(instructions) -> None:
    # The image runs the versions the tests ran with: the lock the Makefile installs from.
    lock = re.search(r"^LOCK := (\S+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert lock and (ROOT / lock[1]).is_file(), "the Makefile names no lock file"
    copied = [p for args in args_of(instructions, "COPY") for p in args.split()[:-1]]
    assert lock[1] in copied, f"{lock[1]} is not copied into the image"
    runs = " && ".join(args_of(instructions, "RUN"))
    assert f"pip install --require-hashes -r {lock[1]}" in runs, runs
    assert re.search(r"pip install --no-deps \.(?:\s|$)", runs), "the project resolves again"


def test_dockerfile_gives_the_state_folder_to_voice(instructions) -> None:
    runs = " && ".join(args_of(instructions, "RUN"))
    assert re.search(r"install -d -m 700 -o voice -g voice [^&]*/var/lib/voice/state", runs)
    assert "state/keys" not in runs  # no key folder: the keys live on the cluster
    env = " ".join(args_of(instructions, "ENV"))
    assert "VOICE_STATE_DIR=/var/lib/voice/state" in env


def test_dockerfile_runs_voice_as_non_root(instructions) -> None:
    entrypoints = args_of(instructions, "ENTRYPOINT")
    assert entrypoints and json.loads(entrypoints[-1]) == ["voice"]
    users = args_of(instructions, "USER")
    assert users and users[-1].split(":")[0] not in {"root", "0"}
