"""Settings every package shares: where the database and Redis are (KVGATE_* environment variables or .env).

GatewaySettings extends these; billing reads them directly. The engine's settings
live in inference.settings, billing's own in billing.settings.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./kvgate.db"
# Every settings class also reads KVGATE_* lines from this file in the working directory, if there is
# one; a variable set in the environment wins over the same line in it.
ENV_FILE = ".env"


class KvgateSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_", env_file=ENV_FILE, extra="ignore")

    database_url: str = Field(DEFAULT_DATABASE_URL, description="sqlite:///path or postgresql://...")
    usage_write_timeout_s: float = Field(
        3.0,
        gt=0,
        le=600,
        description="A request's usage record or ledger settlement that the database has not taken within this "
        "many seconds goes to the local spool instead (replayed later, exactly once), so a stalled database holds "
        "a finished response this long at most; it also marks the database unavailable, as a failed write does.",
    )
    redis_url: str | None = Field(
        None,
        description="Redis shared by the gateways: rate-limit buckets, and auth-cache evictions on revoke or "
        "suspend (every gateway drops the key at once; docs/deployment.md).",
    )
