"""Pieces both wire formats share."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    """Unknown fields are a 400, as at both providers."""

    model_config = ConfigDict(extra="forbid")


class OtherType(BaseModel):
    """A block, part or tool of a type not supported yet: parsed so it can be refused clearly."""

    model_config = ConfigDict(extra="allow")
    type: str


def type_tag(known: Collection[str | None], *, tag: str) -> Callable[[Any], str]:
    """A pydantic discriminator: `tag` for the supported `type` values, "other" for the rest."""

    def kind(value: Any) -> str:
        found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        # Any JSON can arrive here (a list is unhashable): only a string or null can match.
        return tag if (found is None or isinstance(found, str)) and found in known else "other"

    return kind
