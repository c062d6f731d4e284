"""Settings every package shares: where the database and Redis are (KVGATE_* environment variables).

GatewaySettings extends these; billing reads them directly. The engine's settings
live in inference.settings, billing's own in billing.settings.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_DATABASE_URL = "sqlite:///./kvgate.db"


class KvgateSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_", extra="ignore")

    database_url: str = Field(DEFAULT_DATABASE_URL, description="sqlite:///path or postgresql://...")
    redis_url: str | None = Field(None, description="Share rate-limit buckets across processes via Redis.")
