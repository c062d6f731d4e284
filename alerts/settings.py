"""The alert evaluator's settings, read from KVGATE_* environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvgate.settings import ENV_FILE


class AlertSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_", env_file=ENV_FILE, extra="ignore")

    alerts: bool = Field(True, description="Evaluate and deliver tenants' alerts (budgets, refusals, cache, spend).")
    alerts_interval_s: float = Field(
        60.0, gt=0, description="How often the alert evaluator reads the ledger and sends what is due."
    )
    alerts_webhook_timeout_s: float = Field(
        5.0, gt=0, le=30, description="A webhook receiver must answer within this long, or the attempt failed."
    )
    alerts_allow_private_webhooks: bool = Field(
        False,
        description="Let webhooks reach loopback and private addresses (an operator's own receivers); off, a tenant's "
        "webhook cannot reach the operator's network.",
    )
    alerts_concurrency: int = Field(
        8, ge=1, le=100, description="Alert deliveries (webhooks, mail) in flight at once, across all tenants."
    )
