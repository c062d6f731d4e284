"""Gateway settings, read from KVGATE_* environment variables (the engine's live in inference.settings)."""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./kvgate.db"


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_", extra="ignore")

    database_url: str = Field(DEFAULT_DATABASE_URL, description="sqlite:///path or postgresql://...")
    host: str = Field("127.0.0.1", description="Address `kvgate serve` listens on.")
    port: int = Field(8080, ge=0, le=65535, description="Port `kvgate serve` listens on.")
    admin_token: SecretStr | None = Field(
        None, description="Bearer token for /admin/v1; generated once and stored hashed when unset."
    )
    secret: SecretStr | None = Field(
        None, description="Server secret for cache salts; generated once and stored when unset."
    )
    min_cacheable_tokens: int = Field(
        1024, ge=0, description="A cache breakpoint ending before this many prompt tokens has no effect."
    )
    redis_url: str | None = Field(None, description="Share rate-limit buckets across processes via Redis.")
    default_requests_per_minute: int | None = Field(None, gt=0, description="For keys without their own.")
    default_input_tokens_per_minute: int | None = Field(None, gt=0, description="For keys without their own.")
    auth_cache_ttl_s: float = Field(
        2.0, ge=0, description="How long an authenticated key is trusted without a database read; 0 disables."
    )
    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Larger bodies get 413.")
    request_workers: int | None = Field(
        None,
        gt=0,
        description="Worker processes that parse, render and tokenize large request bodies off the event loop; "
        "defaults to half the cores, 1 to 4.",
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


@lru_cache
def get_settings() -> GatewaySettings:
    return GatewaySettings()
