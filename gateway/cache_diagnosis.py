"""Why a prompt could not reuse an earlier one's prefix: two fingerprints compared, section by section.

The checks go in the order the prompt is cached (Anthropic's: tools, system, messages), after
the model, which decides everything: the first section that differs is the reason. A request whose
model, tools and system match but whose cache partition (`cache_salt`) differs shares nothing
either; Anthropic calls that case `unavailable` ("other prompt-affecting parameters differ"), and
it is checked before the messages, as the SDK's type describes it. A request that only appended
messages to the earlier ones diverges nowhere: nothing to report (the cache can still have
expired, which is a question of the engine, not of the request's structure).

The token counts are the earlier prompt's (that is what could have been read): `reusable_tokens`
are those before the divergence, the start of the first differing section found in the current
prompt (gateway.prompt_sections, exact), and `missed_tokens` the rest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gateway.cache_fingerprints import Fingerprint
from gateway.prompt_sections import SectionStarts

Section = Literal["model", "tools", "system", "partition", "messages"]


@dataclass(frozen=True)
class Divergence:
    section: Section
    reusable_tokens: int
    missed_tokens: int


@dataclass(frozen=True)
class Comparison:
    """What comparing a request with the one it names found: whether that one is known, and where they part."""

    found: bool
    divergence: Divergence | None = None


def _first_difference(earlier: tuple[bytes, ...], current: tuple[bytes, ...]) -> int | None:
    """The first index where the chains differ; None when `current` only extends `earlier`."""
    for i, digest in enumerate(earlier):
        if i >= len(current) or current[i] != digest:
            return i
    return None


def _divergence(earlier: Fingerprint, section: Section, start: int) -> Divergence:
    reusable = min(start, earlier.prompt_tokens)
    return Divergence(section, reusable_tokens=reusable, missed_tokens=earlier.prompt_tokens - reusable)


def compare(earlier: Fingerprint, current: Fingerprint, starts: SectionStarts) -> Divergence | None:
    """Where `current` parts from `earlier`, or None when it begins with all of it."""
    if earlier.model != current.model:
        return _divergence(earlier, "model", 0)
    # Tools: a removed tool at the end is a change too, which a prefix test alone would miss.
    changed_tool = _first_difference(earlier.tools, current.tools)
    if changed_tool is None and len(current.tools) != len(earlier.tools):
        changed_tool = len(earlier.tools)
    if changed_tool is not None:
        return _divergence(earlier, "tools", starts.tool(changed_tool))
    if earlier.system != current.system:
        start = starts.system if starts.system is not None else starts.message(0)
        return _divergence(earlier, "system", start)
    if earlier.partition != current.partition:
        return _divergence(earlier, "partition", 0)
    changed_message = _first_difference(earlier.messages, current.messages)
    if changed_message is not None:
        return _divergence(earlier, "messages", starts.message(changed_message))
    return None


def first_changed_section(earlier: Fingerprint, current: Fingerprint) -> tuple[Section, int | None] | None:
    """The first section (and its index, for tools and messages) where `current` differs from `earlier`.

    None when `current` begins with all of `earlier`. A prompt that only appended messages changes
    first at the message after the earlier's last one.
    """
    if earlier.model != current.model:
        return "model", None
    changed_tool = _first_difference(earlier.tools, current.tools)
    if changed_tool is None and len(current.tools) != len(earlier.tools):
        changed_tool = min(len(earlier.tools), len(current.tools))
    if changed_tool is not None:
        return "tools", changed_tool
    if earlier.system != current.system:
        return "system", None
    if earlier.partition != current.partition:
        return "partition", None
    changed_message = _first_difference(earlier.messages, current.messages)
    if changed_message is not None:
        return "messages", changed_message
    if len(current.messages) > len(earlier.messages):
        return "messages", len(earlier.messages)
    return None
