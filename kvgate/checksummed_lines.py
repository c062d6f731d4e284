"""The line format of kvgate's local durable files (the usage spool, the in-flight journal).

One record a line, UTF-8: `<crc32 of the JSON, 8 hex digits> <JSON object>\\n`. A line torn by
a crash mid-write, or altered, fails its checksum (or lacks its newline) and reads as None.
"""

from __future__ import annotations

import json
import zlib
from typing import Any


def encode_line(record: dict[str, Any]) -> bytes:
    body = json.dumps(record, separators=(",", ":"), sort_keys=True, ensure_ascii=True).encode()
    return b"%08x %s\n" % (zlib.crc32(body), body)


def decode_line(line: bytes) -> dict[str, Any] | None:
    """The record on a line, or None if the line is torn or altered."""
    if not line.endswith(b"\n") or len(line) < 10 or line[8:9] != b" ":
        return None
    body = line[9:-1]
    try:
        if int(line[:8], 16) != zlib.crc32(body):
            return None
        record = json.loads(body)
    except ValueError:
        return None
    return record if isinstance(record, dict) else None
