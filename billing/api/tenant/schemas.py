"""The usage API's bodies: OpenAI's bucket pages (usage/completions, costs) and OpenRouter's key info.

OpenAI's fields keep OpenAI's meaning: input_tokens counts the whole prompt (uncached input, cache
writes and cache reads), input_cached_tokens the reads. kvgate adds what it knows exactly: the writes
per TTL class and the cost as an exact decimal string (`cost_usd`, from the ledger's pico-dollars).
The float amounts OpenAI and OpenRouter clients expect (`amount.value`, `usage`...) are that value
rounded to a float; sum the `*_usd` strings when the cents matter.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from billing.money import format_usd_exact, pico_to_usd
from billing.usage_buckets import Bucket, BucketResult


def usd(pico: int) -> str:
    return format_usd_exact(pico)


def usd_float(pico: int) -> float:
    return float(pico_to_usd(pico))


class CompletionsResult(BaseModel):
    object: Literal["organization.usage.completions.result"] = "organization.usage.completions.result"
    input_tokens: int = Field(description="The whole prompt: uncached input + cache writes + cache reads.")
    output_tokens: int
    input_cached_tokens: int = Field(description="Prompt tokens read from the cache.")
    input_uncached_tokens: int = Field(description="Prompt tokens neither read from nor written to the cache.")
    input_cache_write_tokens: int = Field(description="Prompt tokens written to the cache, all TTL classes.")
    input_audio_tokens: int = 0
    output_audio_tokens: int = 0
    num_model_requests: int
    project_id: None = None
    user_id: None = None
    api_key_id: str | None = None
    model: str | None = None
    batch: None = None
    service_tier: None = None
    api_source: None = None
    cache_write_5m_tokens: int
    cache_write_1h_tokens: int
    cache_write_24h_tokens: int
    cache_write_30m_tokens: int
    cache_write_12h_tokens: int
    cost_usd: str = Field(description="Exact cost in USD, as on the invoice (a decimal string).")
    uncached_cost_usd: str = Field(description="What the same requests would have cost without caching.")

    @classmethod
    def of(cls, result: BucketResult) -> CompletionsResult:
        counts = result.counts
        return cls(
            input_tokens=counts.prompt_tokens,
            output_tokens=counts.output,
            input_cached_tokens=counts.cache_read,
            input_uncached_tokens=counts.input,
            input_cache_write_tokens=counts.cache_writes,
            num_model_requests=result.requests,
            api_key_id=result.api_key_id,
            model=result.model,
            cache_write_5m_tokens=counts.cache_write_5m,
            cache_write_1h_tokens=counts.cache_write_1h,
            cache_write_24h_tokens=counts.cache_write_24h,
            cache_write_30m_tokens=counts.cache_write_30m,
            cache_write_12h_tokens=counts.cache_write_12h,
            cost_usd=usd(result.cost_pico),
            uncached_cost_usd=usd(result.uncached_cost_pico),
        )


class Amount(BaseModel):
    value: float = Field(description="The cost as a float (OpenAI's field); cost_usd is exact.")
    currency: Literal["usd"] = "usd"


class CostsResult(BaseModel):
    object: Literal["organization.costs.result"] = "organization.costs.result"
    amount: Amount
    line_item: None = None
    project_id: None = None
    api_key_id: str | None = None
    model: str | None = None
    cost_usd: str = Field(description="Exact cost in USD, as on the invoice (a decimal string).")

    @classmethod
    def of(cls, result: BucketResult) -> CostsResult:
        return cls(
            amount=Amount(value=usd_float(result.cost_pico)),
            api_key_id=result.api_key_id,
            model=result.model,
            cost_usd=usd(result.cost_pico),
        )


class CompletionsBucket(BaseModel):
    object: Literal["bucket"] = "bucket"
    start_time: int
    end_time: int
    results: list[CompletionsResult]


class CostsBucket(BaseModel):
    object: Literal["bucket"] = "bucket"
    start_time: int
    end_time: int
    results: list[CostsResult]


class CompletionsPageOut(BaseModel):
    object: Literal["page"] = "page"
    data: list[CompletionsBucket]
    has_more: bool
    next_page: str | None


class CostsPageOut(BaseModel):
    object: Literal["page"] = "page"
    data: list[CostsBucket]
    has_more: bool
    next_page: str | None


def unix(moment: datetime) -> int:
    return int(moment.timestamp())


def completions_bucket(bucket: Bucket) -> CompletionsBucket:
    return CompletionsBucket(
        start_time=unix(bucket.start),
        end_time=unix(bucket.end),
        results=[CompletionsResult.of(r) for r in bucket.results],
    )


def costs_bucket(bucket: Bucket) -> CostsBucket:
    return CostsBucket(
        start_time=unix(bucket.start), end_time=unix(bucket.end), results=[CostsResult.of(r) for r in bucket.results]
    )


class RateLimit(BaseModel):
    requests: int | None = Field(description="Requests per interval (None: unlimited).")
    input_tokens: int | None = Field(description="Input tokens per interval (None: unlimited).")
    interval: Literal["1m"] = "1m"


class KeyUsd(BaseModel):
    """The same amounts, exact."""

    usage: str
    usage_daily: str
    usage_weekly: str
    usage_monthly: str
    limit: str | None
    limit_remaining: str | None


class KeyInfo(BaseModel):
    id: str
    label: str = Field(description="The key's display prefix, e.g. 'kvg-AbCd...'.")
    name: str
    scopes: list[str]
    usage: float = Field(description="USD spent with this key since it was made.")
    usage_daily: float = Field(description="USD spent with this key in the current UTC day.")
    usage_weekly: float = Field(description="... in the current UTC week (Monday to Sunday).")
    usage_monthly: float = Field(description="... in the current UTC month.")
    limit: float | None = Field(description="The tightest spending limit the key is held to (None: none).")
    limit_remaining: float | None
    limit_reset: Literal["monthly"] | None = Field(description="When the limit resets (None: prepaid credit).")
    limit_scope: Literal["tenant_month", "key_month", "tenant_credit"] | None = Field(
        description="Which limit: the tenant's monthly budget, the key's own, or the prepaid credit."
    )
    is_free_tier: bool = False
    expires_at: datetime | None
    rate_limit: RateLimit
    usd: KeyUsd


class KeyInfoOut(BaseModel):
    data: KeyInfo
