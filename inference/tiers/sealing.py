"""The keys that seal the disk and Redis tiers' records, and the rate-limited log of records they reject.

Every record is encrypted and authenticated (AES-256-GCM, disk_format) under a key of its
own, derived with HKDF-SHA256 (RFC 5869) from the operator's tier key (KVGATE_KV_TIER_KEY):

    PRK        = HKDF-Extract(salt="kvgate/kv-tier/v2", IKM=tier key)
    key id     = HKDF-Expand(PRK, "key-id", 4)                  (u32, in the record's header)
    name       = HKDF-Expand(PRK, "name" || block hash, 32)     (the record's Redis key, in its header)
    record key = HKDF-Expand(PRK, "record" || name, 32)

The block hash is the salted chained hash (inference.hashing): the tenant's salt is in the
first block's hash and every later block inherits it, so each tenant's blocks get keys of
their own and a record opens only under the name it was written for. The name is a keyed
hash, so neither a Redis key nor a disk header lets anyone who lacks the tier key confirm a
guessed prompt, even an unsalted one. The key id is derived from the key, so rotating is
only a matter of which keys are listed (KVGATE_KV_TIER_PREVIOUS_KEYS are read, never written).

Without a configured key, the engine makes a random key when the process starts (see
TierKeys.from_settings): records then open only in the process that wrote them.
"""

from __future__ import annotations

import hmac
import secrets
import struct
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from inference.settings import EngineSettings

log = structlog.get_logger(__name__)

_EXTRACT_SALT = b"kvgate/kv-tier/v2"
_ephemeral_lock = threading.Lock()
_ephemeral_key: bytes | None = None
_warned_unset = False


def _expand(prk: bytes, info: bytes) -> bytes:
    # HKDF-Expand for an output of one hash length (32 bytes) is exactly HMAC(PRK, info || 0x01);
    # hmac.digest runs in C, so deriving a block's key costs about a microsecond on every lookup.
    return hmac.digest(prk, info + b"\x01", "sha256")


def _ephemeral() -> bytes:
    """The random key of this process: made once, so every tier and engine in the process shares it."""
    global _ephemeral_key
    with _ephemeral_lock:
        if _ephemeral_key is None:
            _ephemeral_key = secrets.token_bytes(32)
        return _ephemeral_key


class TierKeys:
    """The current tier key (seals new records) and the previous ones (still open records), by key id."""

    def __init__(self, current: bytes, previous: Sequence[bytes] = (), *, ephemeral: bool = False) -> None:
        assert current, "a tier key must not be empty"
        self.ephemeral = ephemeral
        self._prks: dict[int, bytes] = {}
        ids = [self._add(current)]
        ids += [self._add(key) for key in previous if key]
        self.current_id = ids[0]
        # Current first: a lookup tries the names of the key that writes before the older ones.
        self.read_ids: tuple[int, ...] = tuple(dict.fromkeys(ids))

    def _add(self, key: bytes) -> int:
        prk = hmac.digest(_EXTRACT_SALT, key, "sha256")
        (key_id,) = struct.unpack("<I", _expand(prk, b"key-id")[:4])
        self._prks.setdefault(key_id, prk)
        return key_id

    @classmethod
    def from_settings(cls, settings: EngineSettings) -> TierKeys:
        """KVGATE_KV_TIER_KEY (and _PREVIOUS_KEYS); unset: this process's random key, with a warning."""
        listed = settings.kv_tier_previous_keys.get_secret_value() if settings.kv_tier_previous_keys else ""
        previous = [k.strip().encode() for k in listed.split(",") if k.strip()]
        if settings.kv_tier_key is not None:
            return cls(settings.kv_tier_key.get_secret_value().encode(), previous)
        global _warned_unset
        if not _warned_unset:  # once per process, not once per tier and engine
            _warned_unset = True
            log.warning(
                "kv_tier_key_unset",
                detail="KVGATE_KV_TIER_KEY is unset: the disk and Redis tiers seal records under a random key of "
                "this process, so disk records do not survive a restart and Redis blocks are not shared with other "
                "engines",
            )
        return cls.process_keys()

    @classmethod
    def process_keys(cls) -> TierKeys:
        """This process's random key alone (a tier built without settings: tests and tools)."""
        return cls(_ephemeral(), ephemeral=True)

    def knows(self, key_id: int) -> bool:
        return key_id in self._prks

    def name(self, key_id: int, block_hash: bytes) -> bytes:
        """The block's record name under a key: its Redis key, and what its header is bound to."""
        return _expand(self._prks[key_id], b"name" + block_hash)

    def record_key(self, key_id: int, name: bytes) -> bytes | None:
        """The AES-256 key of the record called name, or None for a key id not configured (a miss)."""
        prk = self._prks.get(key_id)
        return None if prk is None else _expand(prk, b"record" + name)


class RejectLog:
    """Logs records that fail to open at most once per interval: a flood of forgeries stays one line a minute."""

    def __init__(self, event: str, *, interval_s: float = 60.0) -> None:
        self.event = event
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._suppressed = 0

    def __call__(self, **fields: object) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.interval_s:
                self._suppressed += 1
                return
            suppressed, self._suppressed, self._last = self._suppressed, 0, now
        log.warning(self.event, suppressed_since_last=suppressed, **fields)
