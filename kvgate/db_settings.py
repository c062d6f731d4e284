"""How long kvgate waits on its database, read from KVGATE_DB_* environment variables.

Every engine kvgate creates (kvgate.db.create_engine / create_sync_engine) applies these,
so a database that stops answering costs a request at most these waits instead of
hanging it; migrations are exempt (a long ALTER is not an outage).
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvgate.settings import ENV_FILE


class DatabaseSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_DB_", env_file=ENV_FILE, extra="ignore")

    connect_timeout_s: float = Field(
        5.0, gt=0, le=600, description="Give up opening a database connection after this long."
    )
    statement_timeout_s: float = Field(
        15.0,
        gt=0,
        le=86400,
        description="Give up on one statement after this long: client-side (asyncpg), server-side "
        "(PostgreSQL statement_timeout) and as SQLite's busy timeout.",
    )
    pool_timeout_s: float = Field(
        10.0, gt=0, le=600, description="Give up waiting for a free pooled connection after this long."
    )

    @property
    def request_timeout_s(self) -> float:
        """The longest one database round trip may take: a new connection, then a statement."""
        return self.connect_timeout_s + self.statement_timeout_s
