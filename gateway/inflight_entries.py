"""The in-flight journal's entries: what a begin line holds, and what a set of segments says is still open.

A *begin* entry is written when a request is admitted, an *end* entry when its usage
record is stored; see gateway/inflight.py for the files and the writer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from kvgate.checksummed_lines import decode_line, encode_line
from kvgate.usage import Endpoint, TokenCounts, UsageEvent

BEGIN, END = "b", "e"


@dataclass(frozen=True)
class InflightEntry:
    """What is known of a request when it is admitted: enough for its usage record if it never ends."""

    request_id: str
    tenant_id: str
    api_key_id: str
    model: str
    endpoint: Endpoint
    started_at: datetime
    prompt_tokens: int

    def to_record(self) -> dict[str, Any]:
        return {
            "k": BEGIN,
            "id": self.request_id,
            "tenant_id": self.tenant_id,
            "api_key_id": self.api_key_id,
            "model": self.model,
            "endpoint": self.endpoint,
            "started_at": self.started_at.isoformat(),
            "prompt_tokens": self.prompt_tokens,
        }

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> InflightEntry:
        return cls(
            request_id=record["id"],
            tenant_id=record["tenant_id"],
            api_key_id=record["api_key_id"],
            model=record["model"],
            endpoint=record["endpoint"],
            started_at=datetime.fromisoformat(record["started_at"]),
            prompt_tokens=int(record["prompt_tokens"]),
        )

    def interrupted_event(self) -> UsageEvent:
        """The usage record of a request the process died running: the whole prompt as input, no output.

        Cache reads and writes are only known once the engine has admitted the request, so the
        prompt is all input (input + writes + reads still equals the prompt). When the request
        ended is unknown: latency 0, no TTFT.
        """
        return UsageEvent(
            request_id=self.request_id,
            tenant_id=self.tenant_id,
            api_key_id=self.api_key_id,
            model=self.model,
            endpoint=self.endpoint,
            started_at=self.started_at,
            counts=TokenCounts(input=self.prompt_tokens),
            ttft_ms=None,
            latency_ms=0,
            status="interrupted",
        )


def end_line(request_id: str) -> bytes:
    return encode_line({"k": END, "id": request_id})


@dataclass
class SegmentContents:
    """Begins and ends read from one or more segments; `corrupt` counts lines that failed their checksum."""

    begun: dict[str, InflightEntry] = field(default_factory=dict)
    ended: set[str] = field(default_factory=set)
    corrupt: int = 0

    def read(self, path: Path) -> None:
        with path.open("rb") as fh:
            for line in fh:
                record = decode_line(line)
                if record is None:
                    self.corrupt += 1
                elif record.get("k") == BEGIN:
                    try:
                        self.begun.setdefault(record["id"], InflightEntry.from_record(record))
                    except (KeyError, TypeError, ValueError):
                        self.corrupt += 1
                elif record.get("k") == END and isinstance(record.get("id"), str):
                    self.ended.add(record["id"])
                else:
                    self.corrupt += 1

    def unfinished(self) -> list[InflightEntry]:
        """Entries begun and never ended, oldest first."""
        return sorted(
            (entry for request_id, entry in self.begun.items() if request_id not in self.ended),
            key=lambda entry: (entry.started_at, entry.request_id),
        )


# -- files ----------------------------------------------------------------------------------------
