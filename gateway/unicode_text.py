"""Lone surrogates: code points U+D800-U+DFFF that JSON can spell (\\ud800) but UTF-8 cannot.

Python's json module turns them into str without complaint; the tokenizer, HMAC
and database drivers then fail to encode them, which would be a 500. Requests are
checked once after parsing, and refused with a 400 naming the field.
"""

from __future__ import annotations

import re
from typing import Any

# A \uD800-\uDFFF escape, or the same code point written as raw (invalid) UTF-8 bytes,
# which json.loads accepts from bytes with surrogatepass. Any body holding neither
# cannot hold a lone surrogate, so the walk below runs only for bodies that match.
_CANDIDATE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def may_hold_surrogate(raw: bytes) -> bool:
    """False when the JSON body certainly decodes to no lone surrogate."""
    return _CANDIDATE.search(raw) is not None


def lone_surrogate(value: Any) -> tuple[str, str] | None:
    """(where, code point) of the first lone surrogate in a parsed JSON value, keys included, or None."""
    stack: list[tuple[tuple[str, ...], Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            found = _SURROGATE.search(item)
            if found is not None:
                return ".".join(path), f"U+{ord(found.group()):04X}"
        elif isinstance(item, dict):
            for key, child in item.items():
                found = _SURROGATE.search(key)
                if found is not None:
                    return ".".join((*path, key.encode("utf-8", "backslashreplace").decode())), (
                        f"U+{ord(found.group()):04X}"
                    )
                stack.append(((*path, key), child))
        elif isinstance(item, list):
            stack.extend(((*path, str(i)), child) for i, child in enumerate(item))
    return None


def lone_surrogate_message(where: str, code_point: str) -> str:
    place = f"{where}: " if where else ""
    return f"{place}the text contains a lone surrogate ({code_point}), which is not valid Unicode"
