"""Every KVGATE_* setting as a Markdown table, from the settings classes themselves (README.md embeds it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from alerts.settings import AlertSettings
from billing.settings import BillingSettings
from gateway.settings import GatewaySettings
from inference.settings import EngineSettings
from kvgate import REPO_ROOT
from kvgate.db_settings import DatabaseSettings
from kvgate.settings import KvgateSettings
from web.settings import WebSettings

# Like kvgate.app and kvgate.cli, this module sits above every package: it lists all their settings.
SETTINGS_CLASSES: tuple[tuple[type[BaseSettings], str], ...] = (
    (EngineSettings, "engine"),
    (KvgateSettings, "shared"),
    (GatewaySettings, "gateway"),
    (DatabaseSettings, "database"),
    (BillingSettings, "billing"),
    (WebSettings, "dashboard"),
    (AlertSettings, "alerts"),
)
START, END = "<!-- settings:start -->", "<!-- settings:end -->"


def _env_name(name: str, field: FieldInfo, prefix: str) -> str:
    alias = field.validation_alias
    choices = getattr(alias, "choices", None)
    if choices:
        return " / ".join(f"`{c}`" for c in choices)
    return f"`{prefix}{name.upper()}`"


def _default(field: FieldInfo) -> str:
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if hasattr(value, "get_secret_value"):
        return "unset"
    text = str(value)
    return f"`{text}`" if text else '`""`'


def settings_table() -> str:
    rows = ["| setting | part | default | what it does |", "|---|---|---|---|"]
    for cls, part in SETTINGS_CLASSES:
        prefix = cls.model_config.get("env_prefix", "")
        # A setting inherited from another listed class (GatewaySettings' database URL) has its row there.
        inherited = {name for base in cls.__mro__[1:] for name in getattr(base, "model_fields", {})}
        for name, field in cls.model_fields.items():
            if name in inherited:
                continue
            default = _default(field)
            default = default.replace(str(REPO_ROOT) + "/", "").replace(str(Path.home()), "~")
            description = (field.description or "").replace("|", "\\|")
            rows.append(f"| {_env_name(name, field, prefix)} | {part} | {default} | {description} |")
    return "\n".join(rows)


def readme_block() -> str:
    return f"{START}\n{settings_table()}\n{END}"


if __name__ == "__main__":
    print(readme_block())
