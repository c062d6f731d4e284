"""Gateway settings, read from KVGATE_* environment variables.

The database and Redis URLs are inherited from kvgate.settings; the engine's settings live in inference.settings.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field, SecretStr, field_validator

from gateway.backends.engine_list import EngineSpec, parse_engines
from kvgate.settings import KvgateSettings

MIN_ADMIN_TOKEN_CHARS = 16


class GatewaySettings(KvgateSettings):
    host: str = Field("127.0.0.1", description="Address `kvgate serve` listens on.")
    port: int = Field(8080, ge=0, le=65535, description="Port `kvgate serve` listens on.")
    admin_token: SecretStr | None = Field(
        None,
        description="Bearer token for /admin/v1 and the operator's /login, at least 16 characters; generated "
        "once and stored hashed when unset.",
    )
    secret: SecretStr | None = Field(
        None, description="Server secret for cache salts; generated once and stored when unset."
    )
    min_cacheable_tokens: int = Field(
        1024, ge=0, description="A cache breakpoint ending before this many prompt tokens has no effect."
    )
    cache_diagnostics_ttl_s: float = Field(
        3600.0,
        gt=0,
        description="How long a response's prompt fingerprint (hashes only) is kept for cache diagnostics "
        "(Anthropic's `diagnostics.previous_message_id`, OpenAI's `prompt_cache_options.comparison_response_id`).",
    )
    cache_diagnostics_per_tenant: int = Field(
        10_000, ge=1, description="Fingerprints kept per tenant (least recently used out first)."
    )
    cache_explanation_blocks_per_tenant: int = Field(
        8192,
        ge=1,
        description="Prompt blocks (hashes, in this process's memory) kept per tenant to explain cache misses "
        "(least recently used out first).",
    )
    cache_explanation_tenants: int = Field(
        512, ge=1, description="Tenants whose prompt blocks are kept to explain cache misses (least recent out)."
    )
    default_requests_per_minute: int | None = Field(None, gt=0, description="For keys without their own.")
    default_input_tokens_per_minute: int | None = Field(None, gt=0, description="For keys without their own.")
    auth_cache_ttl_s: float = Field(
        2.0, ge=0, description="How long an authenticated key is trusted without a database read; 0 disables."
    )
    auth_stale_ttl_s: float = Field(
        600.0,
        ge=0,
        description="While the database cannot be reached, keys it accepted within this many seconds keep "
        "working from the last-known-good cache (unknown keys get 503/529 with retry-after); 0 disables.",
    )
    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Larger bodies get 413.")
    request_workers: int | None = Field(
        None,
        gt=0,
        description="Worker processes that parse, render and tokenize large request bodies off the event loop; "
        "defaults to half the cores, 1 to 4.",
    )
    batch_concurrency: int = Field(
        2,
        ge=0,
        description="Batch items (/v1/messages/batches, /v1/batches) this gateway runs at once, at low priority "
        "beside interactive requests; 0 runs none (batches wait for another gateway).",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="A connection must send a request's complete headers within this many seconds."
    )
    body_timeout_s: float = Field(
        60.0, gt=0, description="A request's whole body must arrive within this many seconds of its headers (408)."
    )
    keep_alive_timeout_s: float = Field(
        5.0, gt=0, description="An idle keep-alive connection is closed after this many seconds."
    )
    log_level: str = Field("INFO", description="Log level; logs are JSON lines when stderr is not a terminal.")
    expose_docs: bool = Field(
        False,
        description="Serve the API docs and schema at /docs, /redoc and /openapi.json, with self-hosted "
        "assets (off: 404).",
    )
    inflight_journal: bool = Field(
        True,
        description="Journal each admitted request on local disk (fdatasync, group commit) before the engine starts "
        "it, so that after a crash it gets an `interrupted` usage record and its budget reservation is released.",
    )
    inflight_journal_dir: Path | None = Field(
        None,
        description="Where the in-flight journal lives; unset: beside a SQLite database (`<file>.inflight/`), "
        "else `.kvgate/inflight-<hash of the URL>/`.",
    )
    admin_token_file: Path | None = Field(
        None,
        description="When stderr is not a terminal, where `kvgate serve` writes the admin token it generates on "
        "first start (mode 0600; the log names the path, never the token). Unset: beside a SQLite database "
        "(`<file>.admin-token`), else `.kvgate/admin-token-<hash of the URL>`.",
    )
    shutdown_grace_s: float = Field(
        30.0,
        gt=0,
        description="After SIGTERM, `kvgate serve` exits within this many seconds: requests in flight get two "
        "thirds of it, then are cancelled (and recorded); the rest bounds the shutdown (engine stop, KV write-out).",
    )
    nats_url: str | None = Field(
        None,
        description="NATS (JetStream) server the engines publish KV events to, e.g. nats://127.0.0.1:4222; the router "
        "follows them. Unset: no events, the router remembers where it sent each prefix instead.",
    )
    route_alpha: float = Field(
        0.8, ge=0, le=1, description="Router: credit per leading prompt block in an engine's host or disk tier."
    )
    route_beta: float = Field(
        0.6, ge=0, le=1, description="Router: credit per leading prompt block in the shared (Redis) tier."
    )
    route_w_load: float = Field(
        8.0,
        ge=0,
        description="Router: cost, in blocks, of each request in flight on an engine (bench/route_sim.py --tune).",
    )
    route_w_queue: float = Field(
        0.0,
        ge=0,
        description="Router: cost, in blocks, of each prompt token queued for prefill on an engine (0: in-flight "
        "requests alone price load, as bench/route_sim.py --tune chose).",
    )
    route_min_match_blocks: int = Field(
        2, ge=1, description="Router: a cached prefix shorter than this many blocks does not attract a request."
    )
    route_imbalance_abs: int = Field(
        16,
        ge=0,
        description="Router: when the busiest engine has more than this many requests in flight above the least busy "
        "(and KVGATE_ROUTE_IMBALANCE_REL times as many), requests go to the least busy.",
    )
    route_imbalance_rel: float = Field(
        1.5, ge=1, description="Router: the ratio half of the imbalance rule (see KVGATE_ROUTE_IMBALANCE_ABS)."
    )
    route_popular_requests: float = Field(
        8.0,
        gt=0,
        description="Router: a prefix where this many recent requests' matches ended (a shared system prompt) counts "
        "as popular: see KVGATE_ROUTE_POPULAR_SPREAD_LOAD.",
    )
    route_popular_spread_load: float = Field(
        4.0,
        ge=0,
        description="Router: a popular prefix attracts requests only while its holders are at most this many requests "
        "in flight busier than another engine; beyond, it spreads to that engine (0: popular prefixes go by load).",
    )
    route_popular_half_life_s: float = Field(
        30.0, gt=0, description="Router: how fast the popular-prefix count forgets a request."
    )
    route_index_max_entries: int = Field(
        1_000_000,
        gt=0,
        description="Router: the block index's size bound, in (block, engine) entries (about 115-400 bytes each); past "
        "it the blocks stored longest ago are forgotten.",
    )
    route_pending_s: float = Field(
        10.0,
        ge=0,
        description="Router: with KV events, how long a prefix just sent to an engine counts as held there before "
        "the engine's own events confirm it (keeps a burst of one new prefix together); 0 disables.",
    )

    engines: str = Field(
        "embedded",
        description="`embedded` (the engine runs in the gateway process), or a comma-separated list of engine base "
        "URLs (`kvgate engine serve` or vLLM's OpenAI server), each optionally `=WEIGHT`: "
        "`http://10.0.0.5:8001=2,http://10.0.0.6:8001`. With URLs the gateway loads only KVGATE_MODEL's tokenizer "
        "and routes each request by its prefix (the cache-aware router; fed by KV events with KVGATE_NATS_URL).",
    )
    engines_start_wait_s: float = Field(
        60.0, ge=0, description="With engine URLs: how long start-up waits for the first engine to answer."
    )
    engine_read_timeout_s: float = Field(
        600.0, gt=0, description="With engine URLs: the longest silence on a request's stream (a long prefill)."
    )
    vllm_block_size: int | None = Field(
        None,
        gt=0,
        description="With vLLM engines: their --block-size, the unit in which their cache writes are billed. Unset: "
        "the block size each engine publishes in its /metrics (vllm:cache_config_info), else 16; set, an engine "
        "publishing another refuses to start.",
    )

    @field_validator("admin_token")
    @classmethod
    def _admin_token_length(cls, token: SecretStr | None) -> SecretStr | None:
        # A short admin token falls to guessing even at the lock-out's pace (gateway/admin_attempts.py).
        if token is not None and len(token.get_secret_value()) < MIN_ADMIN_TOKEN_CHARS:
            raise ValueError(f"KVGATE_ADMIN_TOKEN must be at least {MIN_ADMIN_TOKEN_CHARS} characters")
        return token

    @field_validator("engines")
    @classmethod
    def _engines_parse(cls, value: str) -> str:
        parse_engines(value)  # a ValueError here is the setting's one-line error
        return value.strip()

    @property
    def engine_specs(self) -> tuple[EngineSpec, ...] | None:
        """The remote engines, or None for the embedded one."""
        return parse_engines(self.engines)


@lru_cache
def get_settings() -> GatewaySettings:
    return GatewaySettings()
