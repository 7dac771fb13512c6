"""A single-node Apache Kafka broker in KRaft mode, from jars Maven fetches once into a cache.

Used by ``voice up`` (data under the state folder, port 9092 by default) and by the test
fixture (a temporary folder and free ports). Needs Java 17+ and Maven; when either is missing
it says exactly what to install instead of failing somewhere deeper.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

HERE = Path(__file__).resolve().parent
POM = HERE / "kafka-pom.xml"
LOG4J = HERE / "log4j2.yaml"
KAFKA_VERSION = "4.1.1"


class LocalKafkaError(RuntimeError):
    """The local broker cannot be fetched or started; the message says what to do."""


class LocalKafkaSettings(BaseSettings):
    """``VOICE_*`` variables of the local broker (``voice up``, ``voice kafka fetch``, tests)."""

    model_config = SettingsConfigDict(env_prefix="VOICE_", extra="ignore", env_ignore_empty=True)

    kafka_cache: Path | None = None
    """Folder of the Kafka jars; unset is ``~/.cache/voice/kafka-<version>``."""

    local_kafka_port: int = Field(default=9092, ge=1, le=65535)
    """Port of the broker ``voice up`` starts."""


def default_cache_dir(settings: LocalKafkaSettings | None = None) -> Path:
    """Where the Kafka jars live: ``VOICE_KAFKA_CACHE`` or ``~/.cache/voice/kafka-<version>``."""
    settings = settings or LocalKafkaSettings()
    if settings.kafka_cache is not None:
        return settings.kafka_cache
    return Path.home() / ".cache" / "voice" / f"kafka-{KAFKA_VERSION}"


def _require(tool: str, hint: str) -> str:
    path = shutil.which(tool)
    if not path:
        raise LocalKafkaError(
            f"{tool!r} is not installed, and the local Kafka broker needs it. {hint} "
            "Or set VOICE_KAFKA_BOOTSTRAP=host:port to use an existing cluster."
        )
    return path


def check_java() -> str:
    """The java binary, or a clear error when Java 17+ is missing."""
    java = _require("java", "Install Java 17 or newer: `apt-get install openjdk-17-jre-headless`.")
    out = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    try:
        major = int(out.split('"')[1].split(".")[0])
    except (IndexError, ValueError):
        major = 0
    if major and major < 17:
        raise LocalKafkaError(
            f"Java {major} found, Kafka {KAFKA_VERSION} needs 17+: "
            "`apt-get install openjdk-17-jre-headless`."
        )
    return java


def ensure_jars(cache_dir: Path | None = None) -> Path:
    """Fetch Kafka and its dependencies into the cache once; return the folder of jars."""
    cache = cache_dir or default_cache_dir()
    marker = cache / ".complete"
    if marker.exists():
        return cache
    check_java()
    mvn = _require("mvn", "Install Maven: `apt-get install maven`.")
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [
        mvn, "-q", "-B", "-f", str(POM), "dependency:copy-dependencies",
        f"-DoutputDirectory={cache}", "-DincludeScope=runtime",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LocalKafkaError(
            f"fetching Kafka {KAFKA_VERSION} from Maven Central failed "
            f"(exit {proc.returncode}):\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
        )
    if not list(cache.glob(f"kafka_2.13-{KAFKA_VERSION}.jar")):
        raise LocalKafkaError(f"Maven ran but no kafka_2.13-{KAFKA_VERSION}.jar is in {cache}")
    marker.write_text(KAFKA_VERSION + "\n")
    return cache


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.3)
        return s.connect_ex((host, port)) == 0


@dataclass
class LocalKafka:
    """One broker+controller process whose data lives in ``data_dir``."""

    data_dir: Path
    port: int = 9092
    controller_port: int | None = None
    cache_dir: Path | None = None
    heap: str = "768m"
    jmx_port: int | None = None
    """A JMX port on 127.0.0.1, without authentication, for a benchmark to read the broker's
    request counts (``bench/broker_requests.py``); None: no JMX port."""
    process: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "broker.log"

    def _properties(self) -> Path:
        cport = self.controller_port or free_port()
        self.controller_port = cport
        props = self.data_dir / "server.properties"
        props.write_text(
            "\n".join(
                [
                    "process.roles=broker,controller",
                    "node.id=1",
                    f"controller.quorum.voters=1@127.0.0.1:{cport}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{cport}",
                    f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    "controller.listener.names=CONTROLLER",
                    "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                    "inter.broker.listener.name=PLAINTEXT",
                    f"log.dirs={self.data_dir / 'logs'}",
                    "offsets.topic.replication.factor=1",
                    "offsets.topic.num.partitions=6",
                    "transaction.state.log.replication.factor=1",
                    "transaction.state.log.min.isr=1",
                    "share.coordinator.state.topic.replication.factor=1",
                    "share.coordinator.state.topic.min.isr=1",
                    "group.initial.rebalance.delay.ms=0",
                    "auto.create.topics.enable=false",
                    "num.partitions=1",
                    # Each partition's offset and time index is a sparse file of this size,
                    # mapped in memory. The first writes to a new partition's index faulted in
                    # (and zeroed) large readahead windows of the 10 MB default: the broker
                    # spent seconds of kernel time a stack of new topics (docs/benchmarks.md,
                    # issue 14, thirteenth pass). 1 MB still indexes ~340 MB a segment.
                    "log.index.size.max.bytes=1048576",
                    "",
                ]
            )
        )
        return props

    def start(self, timeout: float = 60.0) -> str:
        """Fetch if needed, format on first start, start, and wait until it answers."""
        if port_open("127.0.0.1", self.port):
            raise LocalKafkaError(
                f"port {self.port} is taken; stop what listens there, or set "
                "VOICE_KAFKA_BOOTSTRAP to use it as an existing cluster"
            )
        java = check_java()
        jars = ensure_jars(self.cache_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        props = self._properties()
        cp = f"{jars}/*"
        base = [java, f"-Dlog4j2.configurationFile={LOG4J}", "-cp", cp]
        if not (self.data_dir / "logs" / "meta.properties").exists():
            fmt = subprocess.run(
                [*base, "kafka.tools.StorageTool", "format", "--ignore-formatted",
                 "-t", str(uuid.uuid4()).replace("-", "")[:22], "-c", str(props)],
                capture_output=True, text=True,
            )
            if fmt.returncode != 0:
                raise LocalKafkaError(f"formatting KRaft storage failed:\n{fmt.stdout}{fmt.stderr}")
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            [java, "-Xms256m", f"-Xmx{self.heap}", "-XX:+UseG1GC",
             *self._jmx_flags(),
             # Kafka's own variable for extra JVM flags (a profiler, say), as its scripts read it.
             *shlex.split(os.environ.get("KAFKA_OPTS", "")),
             f"-Dlog4j2.configurationFile={LOG4J}", "-cp", cp, "kafka.Kafka", str(props)],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        self._wait_ready(timeout)
        return self.bootstrap

    def _jmx_flags(self) -> list[str]:
        if self.jmx_port is None:
            return []
        jmx = "-Dcom.sun.management.jmxremote"
        return [f"{jmx}.port={self.jmx_port}", f"{jmx}.rmi.port={self.jmx_port}",
                f"{jmx}.host=127.0.0.1", "-Djava.rmi.server.hostname=127.0.0.1",
                f"{jmx}.authenticate=false", f"{jmx}.ssl=false"]

    def _wait_ready(self, timeout: float) -> None:
        from confluent_kafka.admin import AdminClient

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process and self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-3000:]
                raise LocalKafkaError(f"broker exited with {self.process.returncode}:\n{tail}")
            if port_open("127.0.0.1", self.port):
                try:
                    md = AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
                    if md.brokers:
                        return
                except Exception:
                    pass
            time.sleep(0.2)
        self.stop()
        raise LocalKafkaError(f"broker did not answer on {self.bootstrap} within {timeout:.0f}s")

    def stop(self, timeout: float = 20.0) -> None:
        """Stop the broker cleanly (SIGTERM), killing it if it does not go in time."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
