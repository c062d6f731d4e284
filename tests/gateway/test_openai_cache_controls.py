"""OpenAI's current caching controls through the official SDK: prompt_cache_options,
prompt_cache_breakpoint on a content part, and the deprecated prompt_cache_retention.

Each test uses a tenant of its own, so nothing another test cached is read. The engine
commits whole 16-token blocks and never the last prompt token; the minimum cacheable
length is 64 tokens (the harness's).
"""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest

from gateway.prompt import Breakpoint
from gateway.protocols.openai_caching import CachePlan, PromptCacheOptions
from inference.types import CacheRegion
from kvgate.usage import TTL_BY_NAME
from tests.gateway.harness import GatewayServer

SYSTEM = "You are a careful assistant who answers briefly and never guesses. " * 20  # ~260 tokens
WRITE_COLUMNS = ("5m", "30m", "1h", "12h", "24h")


def system_part(**breakpoint: Any) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "text", "text": SYSTEM}
    if breakpoint:
        part["prompt_cache_breakpoint"] = breakpoint
    return part


def ask(client: openai.OpenAI, system: Any, user: str, **extra: Any) -> tuple[Any, str]:
    """A completion and its request id (from the x-request-id header)."""
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL[0],
        messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
        max_tokens=2,
        temperature=0,
        **extra,
    )
    completion = raw.parse()
    return completion, raw.headers["x-request-id"]


def writes_of(record: dict[str, Any]) -> dict[str, int]:
    return {ttl: record[f"cache_write_{ttl}_tokens"] for ttl in WRITE_COLUMNS}


def check_sums(completion: Any, record: dict[str, Any]) -> None:
    """input + reads + writes is the prompt, in the response and in the usage record alike."""
    usage = completion.usage
    details = usage.prompt_tokens_details
    by_ttl = details.model_extra["cache_write_tokens_details"] if details.model_extra else None
    assert by_ttl == {f"ttl_{ttl}_tokens": n for ttl, n in writes_of(record).items()}
    assert sum(writes_of(record).values()) == details.cache_write_tokens
    assert record["cache_read_tokens"] == details.cached_tokens
    assert record["input_tokens"] + details.cached_tokens + details.cache_write_tokens == usage.prompt_tokens


MODEL: list[str] = []


@pytest.fixture
def client(gateway: GatewayServer) -> openai.OpenAI:
    MODEL[:] = [gateway.model]
    return gateway.openai(gateway.new_key())


def test_a_12h_breakpoint_makes_its_prefix_a_12h_region(gateway: GatewayServer, client: openai.OpenAI) -> None:
    system = [system_part(mode="explicit", ttl="12h")]
    options = {"prompt_cache_options": {"mode": "explicit"}}
    first, first_id = ask(client, system, "Hello " + uuid.uuid4().hex, **options)
    record = gateway.usage_record(first_id)
    assert record is not None
    check_sums(first, record)
    writes = writes_of(record)
    # Only the system prefix, in the 12h class: the user turn after it is plain input.
    assert writes["12h"] >= 240 and writes["12h"] % 16 == 0
    assert writes == {**dict.fromkeys(WRITE_COLUMNS, 0), "12h": writes["12h"]}
    assert record["input_tokens"] >= 10
    # The next turn with another question reads exactly that prefix and writes nothing.
    second, second_id = ask(client, system, "Goodbye " + uuid.uuid4().hex, **options)
    again = gateway.usage_record(second_id)
    assert again is not None
    check_sums(second, again)
    assert second.usage.prompt_tokens_details.cached_tokens == writes["12h"]
    assert sum(writes_of(again).values()) == 0


def test_without_a_ttl_a_breakpoint_inherits_the_request_ttl(gateway: GatewayServer, client: openai.OpenAI) -> None:
    completion, request_id = ask(
        client, [system_part(mode="explicit")], "Hi " + uuid.uuid4().hex, prompt_cache_options={"mode": "explicit"}
    )
    record = gateway.usage_record(request_id)
    assert record is not None
    check_sums(completion, record)
    assert writes_of(record)["30m"] >= 240 and record["input_tokens"] >= 10


def test_prompt_cache_options_ttl_sets_the_ttl_of_automatic_caching(
    gateway: GatewayServer, client: openai.OpenAI
) -> None:
    completion, request_id = ask(client, SYSTEM, "Hi " + uuid.uuid4().hex, prompt_cache_options={"ttl": "30m"})
    record = gateway.usage_record(request_id)
    assert record is not None
    check_sums(completion, record)
    writes = writes_of(record)
    # The implicit breakpoint is the whole prompt: all but the last partial block is written, in 30m.
    assert writes == {**dict.fromkeys(WRITE_COLUMNS, 0), "30m": writes["30m"]}
    assert 0 < completion.usage.prompt_tokens - writes["30m"] <= 16


def test_implicit_mode_writes_explicit_breakpoints_and_the_implicit_one(
    gateway: GatewayServer, client: openai.OpenAI
) -> None:
    completion, request_id = ask(
        client, [system_part(mode="explicit", ttl="12h")], "Hi " + uuid.uuid4().hex, prompt_cache_options={}
    )
    record = gateway.usage_record(request_id)
    assert record is not None
    check_sums(completion, record)
    writes = writes_of(record)
    # The system prefix for 12h, the rest of the prompt (the implicit breakpoint) for 30m.
    assert writes["12h"] >= 240 and 0 < writes["30m"] < writes["12h"]
    assert completion.usage.prompt_tokens - writes["12h"] - writes["30m"] <= 16


def test_explicit_mode_without_breakpoints_writes_nothing(gateway: GatewayServer, client: openai.OpenAI) -> None:
    completion, request_id = ask(client, SYSTEM, "Hi " + uuid.uuid4().hex, prompt_cache_options={"mode": "explicit"})
    record = gateway.usage_record(request_id)
    assert record is not None
    check_sums(completion, record)
    assert completion.usage.prompt_tokens_details.cache_write_tokens == 0
    assert record["input_tokens"] == completion.usage.prompt_tokens


def test_a_breakpoint_below_the_minimum_has_no_effect(gateway: GatewayServer, client: openai.OpenAI) -> None:
    short = [{"type": "text", "text": "Be brief.", "prompt_cache_breakpoint": {"mode": "explicit", "ttl": "12h"}}]
    completion, request_id = ask(client, short, "Hi", prompt_cache_options={"mode": "explicit"})
    record = gateway.usage_record(request_id)
    assert record is not None
    check_sums(completion, record)
    assert completion.usage.prompt_tokens_details.cache_write_tokens == 0


def test_deprecated_prompt_cache_retention_still_works(gateway: GatewayServer, client: openai.OpenAI) -> None:
    for spelling in ("in_memory", "in-memory"):
        system = uuid.uuid4().hex + SYSTEM  # nothing of it cached yet
        completion, request_id = ask(client, system, "Hi", prompt_cache_retention=spelling)
        record = gateway.usage_record(request_id)
        assert record is not None
        check_sums(completion, record)
        assert writes_of(record)["5m"] >= 240 and writes_of(record)["30m"] == 0
    # Without any control it is the same automatic 5m caching as before.
    completion, request_id = ask(client, uuid.uuid4().hex + SYSTEM, "Hi")
    assert writes_of(gateway.usage_record(request_id) or {})["5m"] >= 240
    # 24h needs billing to price that class (the harness's billing prices the standard ones only).
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, SYSTEM, "Hi", prompt_cache_retention="24h")
    assert refused.value.body["param"] == "prompt_cache_retention"


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"prompt_cache_options": {"ttl": "5m"}}, "prompt_cache_options.ttl"),
        ({"prompt_cache_options": {"ttl": "24h"}}, "prompt_cache_options.ttl"),
        ({"prompt_cache_options": {"mode": "sometimes"}}, "prompt_cache_options.mode"),
        ({"prompt_cache_options": {"prewarm": True}}, "prompt_cache_options.prewarm"),
        ({"prompt_cache_retention": "1h"}, "prompt_cache_retention"),
    ],
)
def test_bad_request_controls_are_a_400_naming_the_field(
    client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, SYSTEM, "Hi", **extra)
    assert refused.value.status_code == 400
    assert refused.value.body["param"] == param and refused.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("breakpoint", "field"),
    [({"mode": "explicit", "ttl": "1h"}, "ttl"), ({"mode": "implicit"}, "mode"), ({"ttl": "30m", "x": 1}, "x")],
)
def test_bad_breakpoints_are_a_400_naming_the_field(
    client: openai.OpenAI, breakpoint: dict[str, Any], field: str
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        ask(client, [system_part(**breakpoint)], "Hi")
    assert refused.value.body["param"] == f"messages.0.content.0.prompt_cache_breakpoint.{field}"


def test_only_the_latest_explicit_breakpoints_are_written() -> None:
    # OpenAI writes the latest four explicit breakpoints (three beside the implicit one); earlier ones are
    # not an error, they are just not written.
    def bp(end: int, ttl: str) -> Breakpoint:
        return Breakpoint(token_end=end, ttl_s=TTL_BY_NAME[ttl].seconds)

    four = [bp(100, "12h"), bp(200, "30m"), bp(300, "30m"), bp(400, "30m")]
    explicit = CachePlan(options=PromptCacheOptions(mode="explicit"), retention=None)
    assert explicit.regions(four, prompt_tokens=600, min_tokens=64) == (
        CacheRegion(end=100, ttl_s=43200),
        CacheRegion(end=400, ttl_s=1800),
    )
    assert explicit.regions([*four, bp(500, "30m")], prompt_tokens=600, min_tokens=64) == (
        CacheRegion(end=500, ttl_s=1800),
    )
    implicit = CachePlan(options=PromptCacheOptions(), retention=None)
    assert implicit.regions(four, prompt_tokens=600, min_tokens=64) == (CacheRegion(end=600, ttl_s=1800),)
    assert implicit.regions(four[:3], prompt_tokens=600, min_tokens=64) == (
        CacheRegion(end=100, ttl_s=43200),
        CacheRegion(end=600, ttl_s=1800),
    )
    # Without prompt_cache_options or breakpoints: the deprecated retention's automatic caching.
    legacy = CachePlan(options=None, retention=None)
    assert legacy.regions([], prompt_tokens=600, min_tokens=64) == (CacheRegion(end=600, ttl_s=300),)
    assert legacy.regions([], prompt_tokens=60, min_tokens=64) == ()
    # A breakpoint without prompt_cache_options: implicit mode, the request TTL 30m.
    assert legacy.regions(four[:1], prompt_tokens=600, min_tokens=64) == (
        CacheRegion(end=100, ttl_s=43200),
        CacheRegion(end=600, ttl_s=1800),
    )
    # Below the minimum, nothing; a 12h request TTL applies to the implicit breakpoint.
    assert explicit.regions([bp(50, "12h")], prompt_tokens=600, min_tokens=64) == ()
    long = CachePlan(options=PromptCacheOptions(ttl="12h"), retention="in_memory")
    assert long.regions([], prompt_tokens=600, min_tokens=64) == (CacheRegion(end=600, ttl_s=43200),)


def test_admission_carries_the_ttls_the_request_may_write(gateway: GatewayServer, client: openai.OpenAI) -> None:
    # Billing reserves each request at the dearest rate its prompt can be billed at: the write
    # rates of its own regions' TTLs (billing.service.BillingService.estimate_pico), not every class.
    def admitted_ttls(request_id: str) -> tuple[int, ...] | None:
        (admission,) = [a for a in gateway.billing.admitted if a.request_id == request_id]
        return admission.write_ttls_s

    _, twelve_hours = ask(client, [system_part(mode="explicit", ttl="12h")], "A " + uuid.uuid4().hex)
    assert admitted_ttls(twelve_hours) == (1800, 43200)  # the breakpoint's 12h, and the implicit 30m
    _, explicit = ask(client, [system_part()], "B " + uuid.uuid4().hex, prompt_cache_options={"mode": "explicit"})
    assert admitted_ttls(explicit) == ()  # writes nothing: reserved at the input rate
    _, plain = ask(client, [system_part()], "C " + uuid.uuid4().hex)
    assert admitted_ttls(plain) == (300,)  # automatic caching, as before prompt_cache_options
