"""Prompt fingerprints: hashes of a request's prompt, section by section, never its text (cache diagnostics).

A fingerprint says what a prompt was made of, in the order Anthropic caches it (tools, system,
messages), so that a later request can tell where it parted from it:

- the model, and the cache partition (`cache_salt`), one hash each;
- the tool definitions, chained: tools[i] hashes tools[0..i], so the first unequal entry is the
  first tool added, removed, reordered or serialized differently (key order counts: it is rendered);
- the system section (the leading system messages), one hash;
- the other messages, chained the same way (a rolling hash): a request that only appended
  messages has the earlier chain as its prefix;
- the prompt's length in tokens (the engine's count).

Breakpoints (`cache_control`, `prompt_cache_breakpoint`) are left out: they change what is written,
not the prompt. A fingerprint is made in two steps. The job that renders the prompt (maybe in a
worker process, which holds no secret) takes plain SHA-256 digests (`PromptDigests`, never kept);
the event loop seals them with a key derived from the server secret and the tenant (`seal`)
before anything is stored, so a kept fingerprint can be matched neither against guessed text nor
across tenants.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gateway.prompt import Chat, ChatMessage, ChatPart, TextPart, ToolCallPart

# Sealed hashes are cut to 128 bits: collisions stay out of reach, and a fingerprint stays small.
SEALED_BYTES = 16
_KEY_CONTEXT = b"kvgate cache fingerprints\x00"


@dataclass(frozen=True)
class PromptDigests:
    """One prompt's plain digests, as the prepare job takes them (picklable; sealed before they are kept)."""

    model: bytes
    partition: bytes
    tools: tuple[bytes, ...]  # chained
    system: bytes
    messages: tuple[bytes, ...]  # chained, the messages after the system section
    prompt_tokens: int
    # Each tool alone, as rendered and with its keys sorted: layout findings (gateway.cache_layout).
    tool_items: tuple[bytes, ...] = ()
    tool_shapes: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class Fingerprint:
    """What is kept of a response's prompt: `PromptDigests` sealed with the tenant's key."""

    model: bytes
    partition: bytes
    tools: tuple[bytes, ...]
    system: bytes
    messages: tuple[bytes, ...]
    prompt_tokens: int
    tool_items: tuple[bytes, ...] = ()
    tool_shapes: tuple[bytes, ...] = ()

    def as_json(self) -> str:
        return json.dumps(
            {
                "model": self.model.hex(),
                "partition": self.partition.hex(),
                "tools": [t.hex() for t in self.tools],
                "system": self.system.hex(),
                "messages": [m.hex() for m in self.messages],
                "prompt_tokens": self.prompt_tokens,
                "tool_items": [t.hex() for t in self.tool_items],
                "tool_shapes": [t.hex() for t in self.tool_shapes],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str | bytes) -> Fingerprint:
        data = json.loads(text)
        return cls(
            model=bytes.fromhex(data["model"]),
            partition=bytes.fromhex(data["partition"]),
            tools=tuple(bytes.fromhex(t) for t in data["tools"]),
            system=bytes.fromhex(data["system"]),
            messages=tuple(bytes.fromhex(m) for m in data["messages"]),
            prompt_tokens=int(data["prompt_tokens"]),
            tool_items=tuple(bytes.fromhex(t) for t in data.get("tool_items", ())),
            tool_shapes=tuple(bytes.fromhex(t) for t in data.get("tool_shapes", ())),
        )


def _digest(value: object, *, sort_keys: bool = False) -> bytes:
    # JSON keeps the pieces apart unambiguously (no separator a text could contain).
    return hashlib.sha256(json.dumps(value, ensure_ascii=False, sort_keys=sort_keys).encode()).digest()


def _chained(digests: Iterable[bytes]) -> tuple[bytes, ...]:
    chain: list[bytes] = []
    previous = b""
    for digest in digests:
        previous = hashlib.sha256(previous + digest).digest()
        chain.append(previous)
    return tuple(chain)


def _part(part: ChatPart) -> list[object]:
    if isinstance(part, TextPart):
        return ["text", part.text]
    if isinstance(part, ToolCallPart):
        return ["tool_call", part.id, part.name, part.arguments]
    return ["tool_result", part.tool_call_id, part.content, part.is_error]


def _message(message: ChatMessage) -> list[object]:
    return [message.role, [_part(p) for p in message.parts]]


def system_count(chat: Chat) -> int:
    """How many messages at the start of the chat are the system section."""
    count = 0
    for message in chat.messages:
        if message.role != "system":
            break
        count += 1
    return count


def digests_of(chat: Chat, *, model: str, client_salt: str | None, prompt_tokens: int) -> PromptDigests:
    head = system_count(chat)
    items = tuple(_digest(t.definition) for t in chat.tools)
    return PromptDigests(
        model=_digest(model),
        partition=_digest(client_salt),
        tools=_chained(items),
        system=_digest([_message(m) for m in chat.messages[:head]]),
        messages=_chained(_digest(_message(m)) for m in chat.messages[head:]),
        prompt_tokens=prompt_tokens,
        tool_items=items,
        tool_shapes=tuple(_digest(t.definition, sort_keys=True) for t in chat.tools),
    )


def tenant_key(server_secret: str, tenant_id: str) -> bytes:
    """The key a tenant's fingerprints are sealed with (never the cache salt itself: another purpose)."""
    return hmac.new(server_secret.encode(), _KEY_CONTEXT + tenant_id.encode(), hashlib.sha256).digest()


def seal(digests: PromptDigests, key: bytes) -> Fingerprint:
    def one(digest: bytes) -> bytes:
        return hmac.new(key, digest, hashlib.sha256).digest()[:SEALED_BYTES]

    def many(chain: Sequence[bytes]) -> tuple[bytes, ...]:
        return tuple(one(d) for d in chain)

    return Fingerprint(
        model=one(digests.model),
        partition=one(digests.partition),
        tools=many(digests.tools),
        system=one(digests.system),
        messages=many(digests.messages),
        prompt_tokens=digests.prompt_tokens,
        tool_items=many(digests.tool_items),
        tool_shapes=many(digests.tool_shapes),
    )
