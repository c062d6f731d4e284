"""Gateway settings, read from KVGATE_* environment variables.

The database and Redis URLs are inherited from kvgate.settings; the engine's settings live in inference.settings.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field, SecretStr

from kvgate.settings import KvgateSettings


class GatewaySettings(KvgateSettings):
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
    default_requests_per_minute: int | None = Field(None, gt=0, description="For keys without their own.")
    default_input_tokens_per_minute: int | None = Field(None, gt=0, description="For keys without their own.")
    auth_cache_ttl_s: float = Field(
        2.0, ge=0, description="How long an authenticated key is trusted without a database read; 0 disables."
    )
    max_request_bytes: int = Field(32 * 1024 * 1024, gt=0, description="Larger bodies get 413.")
    log_level: str = Field("INFO", description="Log level; logs are JSON lines when stderr is not a terminal.")


@lru_cache
def get_settings() -> GatewaySettings:
    return GatewaySettings()
