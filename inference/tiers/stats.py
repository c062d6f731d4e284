"""Counters of one lower tier, in blocks and bytes, read by the metrics exporter."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass
class TierStats:
    stores: int = 0  # blocks written into the tier
    loads: int = 0  # blocks loaded from the tier into the device (promotions)
    evictions: int = 0  # entries that left the tier for space or expiry (demoted or dropped)
    demotions: int = 0  # of the evictions, those written to the tier below
    bytes_written: int = 0
    bytes_read: int = 0
    checksum_failures: int = 0  # blocks that failed verification: dropped, treated as misses
    dropped_stores: int = 0  # blocks not stored: no slot was free of a load in flight, or an I/O error
    errors: int = 0  # calls to a remote tier that failed (refused, timed out): misses, never request errors
    skipped: int = 0  # calls to a remote tier not made while its circuit breaker was open

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}
