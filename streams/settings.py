"""Settings for every Voice process, read from ``VOICE_*`` environment variables.

Built in a factory (``load_settings``), never at import, so tests can set the environment first.
The built-in dev secrets are public (they are in this repository): ``VOICE_ENV=prod`` refuses them
and any secret under 32 bytes, and ``check_bind`` refuses them, whatever ``VOICE_ENV`` says, in
a process about to listen on a non-loopback address.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import json
import os
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlparse

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from streams.ids import TENANT_PATTERN

DEV_JWT_SECRET = "voice-dev-secret-not-for-production-use!"
"""The JWT secret when ``VOICE_JWT_SECRET`` is unset; public, so never for prod or a public bind."""

DEV_MASTER_KEY = b"voice-dev-master-key-NOT-SECRET!"
"""The master key of ``VOICE_ENV=dev``/``test`` when none is set; public, so never for prod or a
public bind (``streams.sealing`` uses it)."""
assert len(DEV_MASTER_KEY) == 32

MIN_SECRET_BYTES = 32
"""The shortest ``VOICE_JWT_SECRET`` and ``VOICE_MASTER_KEY`` ``VOICE_ENV=prod`` accepts."""

HS_ALGORITHMS = {"HS256": 32, "HS384": 48, "HS512": 64}
"""Verified with ``VOICE_JWT_SECRET`` (the ones ``voice token`` can mint with) → the secret's
least size in prod: its hash's output size (RFC 7518 §3.2)."""

JWKS_ALGORITHMS = ("RS256", "ES256")
"""Verified with a public key of the identity provider, fetched from ``VOICE_JWT_JWKS_URL``."""

JwtAlgorithm = Literal["HS256", "HS384", "HS512", "RS256", "ES256"]
"""Every algorithm a deployment may pin; ``none`` is not one and can never be."""

HOW_TO_GENERATE_JWT_SECRET = "python -c 'import secrets; print(secrets.token_urlsafe(48))'"
HOW_TO_GENERATE_MASTER_KEY = ("python -c 'import base64, os; "
                              "print(base64.b64encode(os.urandom(32)).decode())'")


def default_state_dir() -> Path:
    """``$XDG_STATE_HOME/voice``, else ``~/.local/state/voice`` (the XDG base-directory
    default): one place per user, whatever folder a ``voice`` command runs in."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base).expanduser().absolute() / "voice"


class VoiceSettings(BaseSettings):
    """What every process kind (edge, worker, telemetry sink, CLI) reads from its environment."""

    model_config = SettingsConfigDict(env_prefix="VOICE_", extra="ignore")

    env: Literal["dev", "test", "prod"] = "dev"
    """``dev`` allows built-in default secrets; ``prod`` refuses them."""

    kafka_bootstrap: str | None = None
    """``host:port[,host:port]`` of an existing cluster; unset means the local broker."""

    topic_prefix: str = ""
    """Prepended to every topic name; tests use it to give each test its own topics."""

    topic_partitions: int = Field(default=6, ge=1)
    """Partitions of each topic when ``voice topics create`` makes it."""

    replication_factor: int = Field(default=1, ge=1)

    group_prefix: str = "voice"
    """Prefix of consumer group ids (and of the Faust application id)."""

    state_dir: Path = Field(default_factory=lambda: default_state_dir())
    """Folder of what ``voice up`` runs locally: the local broker's data and address, the
    embedded ClickHouse. Always absolute (a relative one is taken from the folder the process
    starts in), so every ``voice`` command finds the running stack from any folder. Nothing
    any process needs for correctness lives here: each process may have its own, or none."""

    gateway_bound_s: float = Field(default=15.0, gt=0)
    """Every response, streams included, ends before this bound."""

    jwt_secret: SecretStr = SecretStr(DEV_JWT_SECRET)
    """HMAC secret of HS* tokens (``voice token`` mints with it); at least 32 bytes in prod."""

    jwt_algorithms: list[JwtAlgorithm] = Field(default=["HS256"], min_length=1)
    """The pinned allow-list (RFC 8725 §3.1, JSON list): a token whose header names any other
    algorithm is refused before its signature is looked at. HS* verify with the secret only,
    RS256/ES256 with the JWKS only, so neither key can stand in for the other."""

    jwt_jwks_url: str | None = None
    """The identity provider's JWKS (``https://…/jwks.json``), for RS256/ES256 tokens."""

    jwt_jwks_cache_s: float = Field(default=300.0, gt=0)
    """How long fetched JWKS keys are reused before the set is fetched again."""

    jwt_jwks_timeout_s: float = Field(default=5.0, gt=0, le=30)
    """Longest wait for the JWKS endpoint; a failure answers 503 at the edge, never 500."""

    jwt_audience: str = Field(default="voice", min_length=1)
    """The ``aud`` every token must carry (``voice token`` mints it)."""

    jwt_issuer: str = Field(default="voice", min_length=1)
    """The ``iss`` every token must carry (``voice token`` mints it)."""

    jwt_max_lifetime_s: int = Field(default=86_400, ge=1)
    """Longest ``exp - iat`` accepted; a token meant to live longer is refused."""

    jwt_leeway_s: float = Field(default=5.0, ge=0, le=30)
    """Clock skew allowed on ``exp``, ``iat`` and ``nbf``; never more than 30 s."""

    default_tenant: str = Field(default="default", pattern=TENANT_PATTERN)
    """The tenant of a token that names neither a tenant nor memberships."""

    edge_host: str = "127.0.0.1"
    edge_port: int = 8000

    edge_http: Literal["httptools", "h11"] = "httptools"
    """The edge's HTTP/1.1 implementation under uvicorn: ``httptools`` (C, less CPU per
    request and per stream write; falls back to h11 when not installed) or ``h11``."""

    edge_loop: Literal["uvloop", "asyncio"] = "uvloop"
    """The edge's event loop: ``uvloop`` (libuv; falls back to asyncio when not installed)
    or ``asyncio``'s own."""

    edge_keep_alive_s: float = Field(default=75.0, ge=1, le=3600)
    """How long the edge keeps an idle HTTP/1.1 connection open for its client's next request.
    It must be longer than the idle timeout of whatever reuses connections to the edge (a
    gateway's or load balancer's upstream pool; httpx's and many clients' 5 s), or the edge
    closes a connection just as a request is sent on it and the client gets a reset (a 502 at
    a gateway). uvicorn's own default, 5 s, raced httpx's 5 s."""

    master_key: SecretStr | None = None
    """Wraps the per-conversation data keys of the local key store: base64 of 32 bytes, or a
    passphrase; required (and at least 32 bytes) in prod. Unset in dev/test: the public dev key."""

    master_keys: SecretStr | None = None
    """``N=secret[,N=secret…]``: KEK versions with a master secret of their own (others derive
    from ``VOICE_MASTER_KEY``) — how ``voice keys rotate`` moves to a new secret so the old one
    can be destroyed (docs/keys.md, "Making an erasure final")."""

    max_message_bytes: int = Field(default=16 * 1024, ge=1, le=64 * 1024)
    """Largest participant message accepted (UTF-8 bytes); larger answers 422. At most 64 KiB,
    the edge's bound on any one string of a request."""

    max_body_bytes: int = Field(default=1024 * 1024, ge=16 * 1024)
    """Largest request body the edge reads, on every route but the CSV upload (which has
    ``VOICE_MAX_UPLOAD_BYTES``); larger answers 413 while reading, before the body is parsed or
    the caller authenticated."""

    max_record_bytes: int = Field(default=900_000, ge=16 * 1024, le=1_000_000)
    """Largest record (key, value and headers) the edge produces; larger answers 413 and is
    never sent. At most 1,000,000, the client's ``message.max.bytes``, itself below the
    broker's default topic ``max.message.bytes`` (1,048,588); the default leaves room for the
    writer's records, which carry a command's payload and a little more. Lower it if the
    cluster's topics take less."""

    history_read_bytes: int = Field(default=512 * 1024, ge=16 * 1024)
    """Sealed content a conversation turn reads at most past the conversation's last summary
    (its most recent messages and replies). A history over the engine's token budget is
    summarised well before this; only when summarising failed are older records left out
    of a turn, and the turn is told so."""

    history_token_budget: int = Field(default=60_000, ge=500)
    """Tokens of history (estimated, about four characters a token) an agent's turn sends as
    is; over it, the older part is summarised (stored on the conversation's log and reused
    by later turns) and the recent part stays raw — docs/engine.md, "History"."""

    edge_events_kept: int = Field(default=10_000, ge=10)
    """Events an edge keeps per conversation for SSE resume; older cursors answer 409."""

    edge_turn_workflows_kept: int = Field(default=1000, ge=1)
    """Ended workflows of turns an edge keeps for ``/staff/workflows`` (the most recently
    ended, ``VOICE_EDGE_TURN_WORKFLOWS_KEPT``): each turn makes one, and its story is its
    conversation's, so an edge does not keep them all (~9 KB each). Running and paused ones,
    and every workflow not a turn's (research, reviews, deliveries), are always kept."""

    edge_history_s: float | None = Field(default=None, gt=0)
    """How far back an edge reads the conversation log at start (``VOICE_EDGE_HISTORY_S``):
    unset, from the beginning (every conversation in memory); set, only records of the last
    this many seconds, and a conversation started earlier is read from the log when first
    asked for (decision 0011), so start time and memory do not grow with history."""

    step_attempts: int = Field(default=3, ge=1)
    """Immediate attempts of a failing workflow step before the workflow fails."""

    step_deadline_s: float = Field(default=300.0, gt=0)
    """How long one attempt of a workflow step may run: past it the step is stopped and fails
    with ``DEADLINE_EXCEEDED`` (not retried), so its workflow fails and ends its turn."""

    turn_deadline_s: float = Field(default=900.0, gt=0)
    """How long a participant's turn may stay open after its message: past it the worker
    owning the conversation ends it ``CouldNotInterpret`` with reason ``DEADLINE_EXCEEDED``,
    whatever became of its workflow (the backstop of every other path to a terminal state)."""

    assistant_turn_deadline_s: float = Field(default=900.0, gt=0)
    """The same for an assistant turn: past it the turn ends ``Failed`` (``DEADLINE_EXCEEDED``)
    and the conversation takes the next message."""

    workflow_retain_s: float = Field(default=8 * 24 * 3600.0, gt=0)
    """How long a worker keeps an ended workflow's state once its ``on_end`` has run (8 days
    by default). Past it the owner forgets it (``WorkflowsForgotten``), so its table holds what
    ran lately, not all that ever ran. A ``WorkflowStarted`` of a forgotten workflow would start
    it again: keep this above the longest any such record can be redelivered — above the
    brokers' ``offsets.retention.minutes`` (7 days by default), after which a consumer group
    down that long reads its topics from the start."""

    janitor_interval_s: float = Field(default=5.0, gt=0)
    """How often a worker looks for turns past their deadline on the partitions it owns."""

    worker_max_poll_interval_s: float = Field(default=1000.0, gt=0)
    """The worker's consumer ``max.poll.interval.ms`` (in seconds). Steps run as tasks, so a
    model call never holds the poll loop; the faults suite sets it low to prove it."""

    test_crash_at: str = ""
    """Tests only: ``point[@match],…``; the worker SIGKILLs itself at the first named point it
    reaches (a turn's ``before_step``, ``model_call``, ``after_reply``, ``before_turn_over``;
    a writer's ``before_follow_ups``, ``before_state_write``) in a workflow (or aggregate)
    whose id contains ``match`` (``streams.crashpoints``). Unset in every deployment."""

    consumer_retry_attempts: int = Field(default=3, ge=1, le=20)
    """Attempts a consumer (a worker's agent, the telemetry sink) makes at one record before
    it dead-letters it (``streams.retry``); a failure that says it is not retryable gets one."""

    consumer_retry_initial_ms: int = Field(default=200, ge=0)
    """Wait after a record's first failed attempt; it doubles after each further one …"""

    consumer_retry_max_ms: int = Field(default=2_000, ge=0)
    """… up to this. The consumer waits in line meanwhile, so keep the sum short."""

    model: str = "claude-sonnet-4-5"
    """The model agents call (through the simulator unless ANTHROPIC_API_KEY is set)."""

    fallback_models: list[str] = ["claude-haiku-4-5"]
    """Tried in order when the model is rate limited or overloaded."""

    compaction_model: str = "claude-haiku-4-5"

    models: Annotated[list[str], NoDecode] = []
    """``VOICE_MODELS``: the models this deployment allows (comma-separated or a JSON list); a
    ``model_override`` outside it answers 422 ``MODEL_NOT_FOUND``. Unset: the configured models
    (``allowed_models``). Every configured model must be in it, or the settings are refused."""

    simulator_url: str = "http://127.0.0.1:8100"
    """Where the model simulator listens when ANTHROPIC_API_KEY is unset."""

    model_client: Literal["lean", "sdk"] = "lean"
    """``VOICE_MODEL_CLIENT``: how a worker talks to the model API — ``lean`` reads the
    Messages API's stream over httpx (``consumers.engine.lean``: the same requests and results,
    a fraction of the CPU), ``sdk`` through the ``anthropic`` SDK."""

    model_http: Literal["aiohttp", "httpx"] = "aiohttp"
    """``VOICE_MODEL_HTTP``: what carries the ``lean`` client's requests — ``aiohttp``'s
    connection pool under httpx's interface (``httpx-aiohttp``), or httpx's own pool, which
    cost ~5× the CPU per streamed call with many calls at once (decision 0013)."""

    worker_concurrency: int = Field(default=64, ge=1)
    """Workflow steps (turns) one worker runs at once."""

    worker_step_thread: bool = True
    """``VOICE_WORKER_STEP_THREAD``: a worker runs its workflow steps on an event loop of
    their own (``consumers.workflows.steploop``), so a step never delays the writer's
    acknowledgements on the worker's loop. Off: steps share the worker's loop."""

    worker_pin_python: str = Field(default="off", pattern=r"^\s*(?i:off|auto|\d+)\s*$")
    """``VOICE_WORKER_PIN_PYTHON``: ``off`` (the default), a core number, or ``auto``. Pinned, a
    worker's Python threads run on that one core and librdkafka's threads on the others
    (``streams.affinity``, decision 0017): only one thread runs Python at a time anyway, and
    spread over every core each hand-over of the GIL crossed cores. ``auto`` takes a core by
    the process id among those the worker may use. Nothing is pinned where only one core is
    allowed. For a worker with cores of its own (a host or VM each, a CPU set); ``voice up``
    gives its worker the first core it may use."""

    worker_changelog_linger_s: float = Field(default=2.0, ge=0, le=60)
    """``VOICE_WORKER_CHANGELOG_LINGER_S``: how long at most a write of the workflows table
    has its changelog record held back, so that a later write of the same key replaces it
    (``consumers.frame.write_behind``). A held write is sent before any offset commit covers
    the record that made it, and before a handover or a stop; this bounds how far a standby
    lags behind a running step. 0: every write is sent at once."""

    worker_fetch_wait_ms: int = Field(default=1500, ge=1, le=60_000)
    """``VOICE_WORKER_FETCH_WAIT_MS``: how long at most the broker holds a worker's fetch that
    finds nothing new; by default Faust's own, 1,500 ms. The worker asks for a partition
    whose fetched records it was still taking only once the fetch in flight returns, so
    under a full load this bounds how long all of a worker's turns can stall together
    (``consumers.frame.fetch_wait``); otherwise any record ends the wait at once. Shorter:
    an idle worker fetches that much more often. 200 ms is not the default while a fault it
    may cause is open: with it, the worker-kill fault tests failed twice in five runs of the
    fault suite, a record after a takeover never handled (docs/benchmarks.md, thirty-ninth
    pass)."""

    worker_standby_replicas: int = Field(default=1, ge=0)
    """``VOICE_WORKER_STANDBY_REPLICAS``: how many other workers keep a warm copy of each
    table partition (Faust's ``table_standby_replicas``). A standby applies every changelog
    record of its partitions as they come, so a takeover need not read the changelog first;
    0 saves that work on every worker and makes a takeover recover from the changelog."""

    worker_ready_file: Path | None = None
    """``VOICE_WORKER_READY_FILE``: a file the worker keeps while it handles records (its tables
    recovered, no rebalance under way) and removes otherwise — a container's readiness probe
    (``test -f``); ``voice up`` waits for it before its ready line. Unset: no file."""

    worker_uvloop: bool = False
    """``VOICE_WORKER_UVLOOP``: a worker's event loops (Faust's, its consumer thread's, the
    steps') are uvloop's rather than asyncio's own. Off: in two same-load pairs it did not
    measure better (docs/benchmarks.md, issue 14, third pass)."""

    up_restarts: int = Field(default=5, ge=0)
    """``voice up``: how many times a child that exits is started again within
    ``up_restart_window_s`` before the whole stack stops."""

    up_restart_window_s: float = Field(default=300.0, gt=0)

    quota_messages_per_minute: int = Field(default=60, ge=0)
    """Messages (conversation messages and assistant chat turns) a principal may send per
    minute, per edge; more answer 429 with ``Retry-After``. 0: unlimited."""

    quota_conversations_per_day: int = Field(default=500, ge=0)
    """Conversations (participant and assistant) a principal may open per day, per edge."""

    quota_uploads_per_day: int = Field(default=200, ge=0)
    """Dataset uploads a principal may make per day, per edge."""

    quota_streams: int = Field(default=10, ge=0)
    """SSE streams a principal may hold open at once on one edge."""

    quota_tenant_tokens_per_day: int = Field(default=10_000_000, ge=0)
    """Model tokens (input, cached input and output) a tenant's turns may use per day, counted
    by each worker; a turn that starts over it ends with ``TOKEN_QUOTA_EXCEEDED``."""

    quota_tracked_keys: int = Field(default=100_000, ge=1)
    """Principals (or tenants) each quota counter remembers at most (bounded memory)."""

    staff_step_delay_ms: str = ""
    """Tests only: ``step=ms,step=ms``; the named staff workflow steps sleep that long at their
    midpoint, so a test can kill a worker in the middle of them. Unset in every deployment."""

    @field_validator("worker_ready_file", mode="before")
    @classmethod
    def _ready_file_unset_when_empty(cls, value: object) -> object:
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("worker_ready_file", mode="after")
    @classmethod
    def _ready_file_is_a_file(cls, value: Path | None) -> Path | None:
        if value is not None and (value.name in ("", ".", "..") or value.is_dir()):
            raise ValueError(f"VOICE_WORKER_READY_FILE must name a file, not the folder "
                             f"{value}")
        return value

    @field_validator("state_dir", mode="after")
    @classmethod
    def _absolute_state_dir(cls, value: Path) -> Path:
        return value.expanduser().absolute()

    @model_validator(mode="after")
    def _check_tokens(self) -> VoiceSettings:
        jwks = [a for a in self.jwt_algorithms if a in JWKS_ALGORITHMS]
        if jwks and not self.jwt_jwks_url:
            raise ValueError(f"VOICE_JWT_ALGORITHMS allows {', '.join(jwks)}, whose keys come "
                             "from the identity provider: set VOICE_JWT_JWKS_URL")
        if self.jwt_jwks_url:
            if not jwks:
                raise ValueError("VOICE_JWT_JWKS_URL is set but VOICE_JWT_ALGORITHMS allows "
                                 f"none of {', '.join(JWKS_ALGORITHMS)}")
            url = urlparse(self.jwt_jwks_url)
            if url.scheme not in ("http", "https") or not url.hostname:
                raise ValueError(f"VOICE_JWT_JWKS_URL {self.jwt_jwks_url!r} is not an http(s) URL")
            if self.env == "prod" and url.scheme != "https" and not is_loopback(url.hostname):
                raise ValueError("VOICE_JWT_JWKS_URL must be https when VOICE_ENV='prod'")
        return self

    @model_validator(mode="after")
    def _refuse_weak_secrets(self) -> VoiceSettings:
        if self.env != "prod":
            return self
        if self.verifies_with_secret:
            secret = self.jwt_secret.get_secret_value()
            if secret == DEV_JWT_SECRET:
                raise ValueError("VOICE_JWT_SECRET must be set when VOICE_ENV='prod' (the "
                                 "built-in one is public); generate one: "
                                 f"{HOW_TO_GENERATE_JWT_SECRET}")
            hs = [a for a in self.jwt_algorithms if a in HS_ALGORITHMS]
            least, size = max(HS_ALGORITHMS[a] for a in hs), len(secret.encode("utf-8"))
            if size < least:
                raise ValueError(f"VOICE_JWT_SECRET is {size} bytes; VOICE_ENV='prod' needs at "
                                 f"least {least} for {', '.join(hs)}: {HOW_TO_GENERATE_JWT_SECRET}")
        key = self.master_key.get_secret_value().strip() if self.master_key else ""
        if not key:
            raise ValueError("VOICE_MASTER_KEY must be set when VOICE_ENV='prod'; generate one: "
                             f"{HOW_TO_GENERATE_MASTER_KEY}")
        if self.uses_dev_master_key:
            raise ValueError("VOICE_MASTER_KEY is the public dev key, refused when "
                             f"VOICE_ENV='prod'; generate one: {HOW_TO_GENERATE_MASTER_KEY}")
        if len(key.encode("utf-8")) < MIN_SECRET_BYTES:
            raise ValueError(f"VOICE_MASTER_KEY is {len(key.encode('utf-8'))} bytes; "
                             f"VOICE_ENV='prod' needs at least {MIN_SECRET_BYTES}: "
                             f"{HOW_TO_GENERATE_MASTER_KEY}")
        return self

    @property
    def verifies_with_secret(self) -> bool:
        """Whether tokens signed with ``VOICE_JWT_SECRET`` (HS*) are accepted at all."""
        return any(a in HS_ALGORITHMS for a in self.jwt_algorithms)

    @property
    def uses_dev_jwt_secret(self) -> bool:
        """Whether HS* tokens are verified with the public built-in secret."""
        return self.verifies_with_secret and self.jwt_secret.get_secret_value() == DEV_JWT_SECRET

    @property
    def uses_dev_master_key(self) -> bool:
        """Whether the key store would be wrapped by the public dev master key: unset (dev and
        test fall back to it), or set to it (as base64 or as its literal text)."""
        value = self.master_key.get_secret_value().strip() if self.master_key else ""
        if not value or value == DEV_MASTER_KEY.decode("ascii"):
            return True
        try:
            return base64.b64decode(value, validate=True) == DEV_MASTER_KEY
        except binascii.Error:
            return False

    @field_validator("models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        """``a,b`` or ``["a", "b"]`` from the environment; a list as it is."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return [m.strip() for m in text.split(",") if m.strip()]
        return value

    def configured_models(self) -> list[tuple[str, str]]:
        """(setting, model) of every model this process is configured to call."""
        return [("VOICE_MODEL", self.model),
                *(("VOICE_FALLBACK_MODELS", m) for m in self.fallback_models),
                ("VOICE_COMPACTION_MODEL", self.compaction_model)]

    @property
    def allowed_models(self) -> tuple[str, ...]:
        """The model registry: ``VOICE_MODELS``, else every configured model (in order)."""
        names = self.models or [m for _, m in self.configured_models()]
        return tuple(dict.fromkeys(names))

    @model_validator(mode="after")
    def _configured_models_are_allowed(self) -> VoiceSettings:
        if self.models:
            outside = [f"{name}={m!r}" for name, m in self.configured_models()
                       if m not in self.models]
            if outside:
                raise ValueError(f"{', '.join(outside)} not in VOICE_MODELS {self.models!r}: "
                                 "a configured model must be one the deployment allows")
        return self

    @property
    def bootstrap(self) -> str:
        """The bootstrap servers to use; the local broker's address must be set by then."""
        if not self.kafka_bootstrap:
            raise RuntimeError(
                "VOICE_KAFKA_BOOTSTRAP is not set: start the local broker with `voice up` "
                "or point it at a cluster (host:port)"
            )
        return self.kafka_bootstrap


class InsecureBind(ValueError):
    """A process was about to listen on a non-loopback address with a public dev secret."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address to bind or reach) is loopback only; a name other than
    ``localhost`` may resolve anywhere, so it is not."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(settings: VoiceSettings, host: str, process: str) -> None:
    """Refuse (``InsecureBind``, saying what to set) to let ``process`` listen on ``host`` when
    it is not loopback and a built-in dev secret is in use, whatever ``VOICE_ENV`` says: anyone
    who reaches the port could mint tokens, and the dev master key unwraps every data key.

    Call it before connecting to anything, so a misconfigured process fails at once.
    """
    if is_loopback(host):
        return
    fixes = []
    if settings.uses_dev_jwt_secret:
        fixes.append(f"VOICE_JWT_SECRET (at least {MIN_SECRET_BYTES} bytes: "
                     f"{HOW_TO_GENERATE_JWT_SECRET})")
    if settings.uses_dev_master_key:
        fixes.append(f"VOICE_MASTER_KEY (base64 of 32 random bytes: {HOW_TO_GENERATE_MASTER_KEY})")
    if fixes:
        raise InsecureBind(
            f"{process} refuses to listen on {host!r}, which is not loopback, with the built-in "
            f"dev secrets (public, in the repository): set {' and '.join(fixes)}, "
            "or listen on 127.0.0.1")


def load_settings(**overrides: object) -> VoiceSettings:
    """Read the settings from the environment, with explicit overrides winning."""
    return VoiceSettings(**overrides)  # type: ignore[arg-type]
