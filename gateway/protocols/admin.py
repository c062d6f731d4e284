"""The admin API's request and response bodies."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from gateway.protocols.common import Strict
from kvgate.tenancy import KEY_SCOPES, SCOPE_INFERENCE

ScopeList = list[str]
MAX_SCHEDULING_WEIGHT = 100


class TenantCreate(Strict):
    name: str = Field(min_length=1, max_length=200)
    scheduling_weight: int = Field(
        1, ge=1, le=MAX_SCHEDULING_WEIGHT, description="Its share of the engine when tenants contend."
    )


class TenantUpdate(Strict):
    scheduling_weight: int = Field(ge=1, le=MAX_SCHEDULING_WEIGHT)


class TenantOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    name: str
    status: Literal["active", "suspended"]
    created_at: datetime
    scheduling_weight: int = 1


class TenantList(BaseModel):
    data: list[TenantOut]


class KeyCreate(Strict):
    name: str = Field("default", min_length=1, max_length=200)
    expires_at: AwareDatetime | None = None
    requests_per_minute: int | None = Field(None, gt=0, le=10_000_000)
    input_tokens_per_minute: int | None = Field(None, gt=0, le=2_000_000_000)
    scopes: ScopeList = Field(
        default_factory=lambda: [SCOPE_INFERENCE],
        max_length=len(KEY_SCOPES),
        description=f"What the key may do: any of {', '.join(KEY_SCOPES)}.",
    )


class KeyScopesUpdate(Strict):
    scopes: ScopeList = Field(max_length=len(KEY_SCOPES), description="The key's new scopes (replacing its old ones).")


class KeyOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: str
    tenant_id: str
    name: str
    prefix: str
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None
    expires_at: datetime | None
    requests_per_minute: int | None
    input_tokens_per_minute: int | None
    scopes: ScopeList

    @field_validator("scopes", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        return value.split() if isinstance(value, str) else value  # stored space-separated


class KeyCreated(KeyOut):
    key: str = Field(description="The API key. Shown only once: store it now.")


class KeyList(BaseModel):
    data: list[KeyOut]
