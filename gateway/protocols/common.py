"""Pieces both wire formats share."""

from __future__ import annotations

from collections.abc import Callable, Collection
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from kvgate.errors import InvalidRequestError

# Bounds on the numbers both APIs take, so that no value can reach the engine that it cannot
# hold: out of range is a 400 naming the field, as at the providers.
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
# Above any model's context: a bound on the number, not a promise of that many tokens (the
# gateway clips max_tokens to the context the prompt leaves).
MAX_OUTPUT_TOKENS = 1_000_000

# OpenAI documents seed as a signed 64-bit integer; torch's generators take no more.
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
MaxOutputTokens = Annotated[int, Field(ge=1, le=MAX_OUTPUT_TOKENS)]
TopK = Annotated[int, Field(ge=0, le=INT32_MAX)]


def cost_number(cost_usd: Decimal | None) -> float | None:
    """usage.cost, OpenRouter's number in USD, beside kvgate's exact cost_usd string."""
    return None if cost_usd is None else float(cost_usd)


def refuse(param: str, message: str) -> InvalidRequestError:
    """A 400 naming the field, as both providers word them."""
    return InvalidRequestError(f"{param}: {message}", param=param)


def check_penalties(frequency_penalty: float | None, presence_penalty: float | None) -> None:
    """A non-zero penalty is a 400 naming the field that has it (kvgate samples without penalties)."""
    for param, value in (("frequency_penalty", frequency_penalty), ("presence_penalty", presence_penalty)):
        if value:
            raise refuse(param, "frequency and presence penalties are not supported")


def stop_tuple(stop: str | list[str] | None) -> tuple[str, ...]:
    """`stop` as OpenAI takes it (a string, a list, or nothing), as a tuple."""
    if stop is None:
        return ()
    return (stop,) if isinstance(stop, str) else tuple(stop)


class Strict(BaseModel):
    """Unknown fields are a 400, as at both providers."""

    model_config = ConfigDict(extra="forbid")


class OtherType(BaseModel):
    """A block, part or tool of a type not supported yet: parsed so it can be refused clearly."""

    model_config = ConfigDict(extra="allow")
    type: str


# The discriminator tags type_tag gives out: pydantic puts them in error locations, where
# gateway.api.errors leaves them out of the `param` it reports.
DISCRIMINATOR_TAGS: set[str] = {"other"}


def type_tag(known: Collection[str | None], *, tag: str) -> Callable[[Any], str]:
    """A pydantic discriminator: `tag` for the supported `type` values, "other" for the rest."""
    DISCRIMINATOR_TAGS.add(tag)

    def kind(value: Any) -> str:
        found = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
        # Any JSON can arrive here (a list is unhashable): only a string or null can match.
        return tag if (found is None or isinstance(found, str)) and found in known else "other"

    return kind
