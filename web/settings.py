"""Dashboard settings, read from KVGATE_* environment variables."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from kvgate.settings import ENV_FILE


class WebSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_", env_file=ENV_FILE, extra="ignore")

    public_url: str | None = Field(
        None,
        description="The dashboard's address as browsers reach it, for login links (https: cookies are Secure); "
        "unset: http://<host>:<port>.",
    )
    session_ttl_hours: float = Field(12.0, gt=0, description="A dashboard login lasts this long.")
    login_link_ttl_minutes: float = Field(15.0, gt=0, description="A login link must be opened within this long.")
    smtp_url: SecretStr | None = Field(
        None,
        description="Mail login links: smtp://[user:password@]host[:port] (smtps:// for TLS, "
        "smtp+starttls:// to upgrade); unset: links are only printed or returned.",
    )
    smtp_from: str = Field("kvgate@localhost", description="The From address of login-link mail.")


def public_url(settings: WebSettings, *, host: str, port: int) -> str:
    """Where login links point: KVGATE_PUBLIC_URL, else the address the server listens on."""
    if settings.public_url:
        return settings.public_url.rstrip("/")
    shown = "127.0.0.1" if host in ("0.0.0.0", "::", "") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"
