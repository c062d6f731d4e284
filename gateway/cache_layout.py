"""Findings that catch prompt layouts which defeat the cache, from one request and the tenant's index.

- `volatile_prefix`: the prompt parts from every earlier one at block b, yet most blocks after b
  come back with the same tokens at the same offsets. Something near the top changes on every
  request (a timestamp, a request id) and stops all the stable text after it from being read.
  It fires when at least two blocks, and at least half of those after b, repeat.
- `tools_reordered`: the same tool definitions as the tenant's previous request with tools, in
  another order (the tools render first, so every later block changes).
- `tool_key_order`: the same tools with their JSON keys in another order (rendered as given, so
  the tokens differ although the definitions are equal).

Each finding names the region (as in cache explanations: `tools[i]`, `system`, `messages[k]`) and
the token offset where it starts. Sent as the `kvgate-cache-warning` header, kept in the usage
record, and shown on the dashboard's Cache page.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.cache_block_index import Match
from gateway.cache_diagnosis import first_changed_section
from gateway.cache_fingerprints import Fingerprint
from gateway.prompt_blocks import PromptBlocks

HEADER = "kvgate-cache-warning"
MIN_REPEATED_BLOCKS = 2


@dataclass(frozen=True)
class Finding:
    type: str
    region: str | None
    token: int | None  # None: tool findings (the tools' token offsets are not measured per request)
    block: int | None
    repeated_blocks: int | None = None

    def as_dict(self) -> dict[str, object]:
        shown: dict[str, object] = {"type": self.type, "region": self.region, "token": self.token, "block": self.block}
        if self.repeated_blocks is not None:
            shown["repeated_blocks"] = self.repeated_blocks
        return shown

    def as_header(self) -> str:
        parts = [self.type] + ([f"token={self.token}", f"block={self.block}"] if self.token is not None else [])
        if self.region is not None:
            parts.insert(1, f"region={self.region}")
        return "; ".join(parts)


def region_name(earlier: Fingerprint | None, current: Fingerprint | None) -> str | None:
    """Where `current` first differs from `earlier`, as a name; None when either is unknown or nothing differs."""
    if earlier is None or current is None:
        return None
    changed = first_changed_section(earlier, current)
    if changed is None:
        return None
    section, index = changed
    if section == "partition":
        return "cache_salt"
    return section if index is None else f"{section}[{index}]"


def volatile_prefix(match: Match, blocks: PromptBlocks, current: Fingerprint | None) -> Finding | None:
    after = len(blocks) - match.shared_blocks - 1
    repeated = match.repeated_after
    if after < MIN_REPEATED_BLOCKS or repeated < MIN_REPEATED_BLOCKS or 2 * repeated < after:
        return None
    earlier = match.reference.fingerprint if match.reference is not None else None
    block = match.shared_blocks
    return Finding("volatile_prefix", region_name(earlier, current), block * blocks.block_size, block, repeated)


def tool_order(last: tuple[tuple[bytes, ...], tuple[bytes, ...]] | None, current: Fingerprint | None) -> Finding | None:
    if last is None or current is None or not current.tool_items:
        return None
    items, shapes = last
    if current.tool_items == items:
        return None
    first = next((i for i, (a, b) in enumerate(zip(items, current.tool_items, strict=False)) if a != b), 0)
    if current.tool_shapes == shapes:
        return Finding("tool_key_order", f"tools[{first}]", None, None)
    if sorted(current.tool_shapes) == sorted(shapes):
        return Finding("tools_reordered", f"tools[{first}]", None, None)
    return None
