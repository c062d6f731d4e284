"""The effective settings, as `kvgate config` prints them: every KVGATE_* setting, its value (secrets
masked) and where it came from (default, .env, environment).

It takes the settings classes as an argument (the composition root passes them all), so it imports
no package above kvgate's core.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from dotenv import dotenv_values
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from kvgate.settings import ENV_FILE

MASK = "***"


class SettingValue(BaseModel):
    setting: str
    part: str
    value: str | None
    source: str  # "default", ".env" or "environment"


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The variables a field is read from, in the order pydantic-settings tries them."""
    choices = getattr(field.validation_alias, "choices", None)
    if choices:
        return [str(choice) for choice in choices]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def mask_url_password(text: str) -> str:
    """A URL with its password (if any) replaced by ***; anything else unchanged."""
    if "://" not in text:
        return text
    try:
        parts = urlsplit(text)
        if parts.password is None:
            return text
        user = parts.username or ""
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}{port}"))
    except ValueError:  # not a URL after all
        return text


def shown(value: Any) -> str | None:
    """A setting's value as it may be shown: secrets masked, URL passwords masked."""
    if value is None:
        return None
    if isinstance(value, SecretStr):
        return MASK if value.get_secret_value() else ""
    return mask_url_password(str(value))


def effective_settings(
    classes: Iterable[tuple[type[BaseSettings], str]], *, env_file: Path = Path(ENV_FILE)
) -> list[SettingValue]:
    """One row per setting of `classes` ((class, part) pairs), as the settings classes read them now."""
    environment = {key.upper() for key in os.environ}
    dotenv = {key.upper() for key, value in dotenv_values(env_file).items() if value is not None}
    rows: list[SettingValue] = []
    for cls, part in classes:
        settings = cls()
        # A setting inherited from another listed class (GatewaySettings' database URL) has its row there.
        inherited = {name for base in cls.__mro__[1:] for name in getattr(base, "model_fields", {})}
        for name, field in cls.model_fields.items():
            if name in inherited:
                continue
            names = env_names(cls, name, field)
            source = next(
                (where for where, keys in (("environment", environment), (".env", dotenv)) if set(names) & keys),
                "default",
            )
            rows.append(SettingValue(setting=names[0], part=part, value=shown(getattr(settings, name)), source=source))
    return rows
