"""Cache diagnostics in each API's own shape (anthropic 2.14's Diagnostics, openai 3.57's PromptCacheDiagnostics).

Anthropic: the request's `diagnostics: {"previous_message_id": "msg_..." | null}` (null, or no
`diagnostics`: nothing to compare); the response's `diagnostics` is null when there is nothing to
report (no comparison asked, or none found a divergence) and otherwise holds `cache_miss_reason`:
`model_changed`, `tools_changed`, `system_changed`, `messages_changed` (each with
`cache_missed_input_tokens`), `unavailable` (model, tools and system match but the `cache_salt`
partition differs) or `previous_message_not_found`. kvgate diagnoses before it generates, so the
reason is never the "still pending" null.

OpenAI Responses: `prompt_cache_options.comparison_response_id: "resp_..."` names the baseline,
and `prompt_cache_diagnostics` is `cache_hit` (nothing diverged), `cache_miss` with a `reason`
(`model_changed`, `tools_changed`, `input_changed` for instructions and input, with
`cache_missed_tokens` and `comparison_reusable_tokens`), `unavailable` (another `cache_salt`) or
`comparison_response_not_found`. `prompt_cache_options` is echoed as applied (mode and ttl with
their defaults), null when the request had none.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from gateway.cache_diagnosis import Comparison, Section
from gateway.protocols.common import Strict
from gateway.protocols.openai_caching import PromptCacheOptions

# Ids as kvgate makes them (msg_/resp_ and hex), and as others make them (base62 and more): a
# well-formed id kvgate does not know is "not found", a malformed one a 400 naming the field.
_ID_BODY = r"[A-Za-z0-9_-]{1,128}"


class DiagnosticsParam(Strict):
    previous_message_id: str | None = Field(None, pattern=rf"^msg_{_ID_BODY}$")


class ResponsesPromptCacheOptions(PromptCacheOptions):
    """prompt_cache_options on /v1/responses: the Chat Completions options, and the diagnostics baseline."""

    comparison_response_id: str | None = Field(None, pattern=rf"^resp_{_ID_BODY}$")


# --- Anthropic -----------------------------------------------------------------------------------

_ANTHROPIC_CHANGED: dict[Section, str] = {
    "model": "model_changed",
    "tools": "tools_changed",
    "system": "system_changed",
    "messages": "messages_changed",
}


class CacheMissChanged(BaseModel):
    type: Literal["model_changed", "tools_changed", "system_changed", "messages_changed"]
    cache_missed_input_tokens: int


class CacheMissOther(BaseModel):
    type: Literal["previous_message_not_found", "unavailable"]


class Diagnostics(BaseModel):
    cache_miss_reason: CacheMissChanged | CacheMissOther | None


def anthropic_diagnostics(comparison: Comparison | None) -> Diagnostics | None:
    if comparison is None:
        return None
    if not comparison.found:
        return Diagnostics(cache_miss_reason=CacheMissOther(type="previous_message_not_found"))
    divergence = comparison.divergence
    if divergence is None:
        return None
    changed = _ANTHROPIC_CHANGED.get(divergence.section)
    if changed is None:
        return Diagnostics(cache_miss_reason=CacheMissOther(type="unavailable"))
    return Diagnostics(
        cache_miss_reason=CacheMissChanged.model_validate(
            {"type": changed, "cache_missed_input_tokens": divergence.missed_tokens}
        )
    )


# --- OpenAI Responses ----------------------------------------------------------------------------

_OPENAI_REASONS: dict[Section, str] = {
    "model": "model_changed",
    "tools": "tools_changed",
    "system": "input_changed",
    "messages": "input_changed",
}


def echoed_options(options: PromptCacheOptions | None) -> dict[str, Any] | None:
    """prompt_cache_options as the response object shows them: as applied, defaults filled in."""
    if options is None:
        return None
    shown: dict[str, Any] = {"mode": options.mode, "ttl": options.ttl}
    shown["comparison_response_id"] = getattr(options, "comparison_response_id", None)
    return shown


def openai_diagnostics(comparison: Comparison | None) -> dict[str, Any] | None:
    if comparison is None:
        return None
    if not comparison.found:
        return {"type": "comparison_response_not_found"}
    divergence = comparison.divergence
    if divergence is None:
        return {"type": "cache_hit"}
    reason = _OPENAI_REASONS.get(divergence.section)
    if reason is None:
        return {"type": "unavailable"}
    return {
        "type": "cache_miss",
        "reason": reason,
        "cache_missed_tokens": divergence.missed_tokens,
        "comparison_reusable_tokens": divergence.reusable_tokens,
    }
