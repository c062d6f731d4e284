"""KV cache events: what an engine tells routers about the blocks it holds, in vLLM's schema.

The shapes follow vLLM's `vllm/distributed/kv_events.py` (BlockStored, BlockRemoved,
AllBlocksCleared inside a KVEventBatch, msgpack-encoded as tagged arrays), so that a relay
can forward real vLLM engines' events unchanged. kvgate adds, at the end of each struct
where vLLM's decoder ignores nothing it needs:

- `BlockStored.ttl_s` and `expires_at` (wall-clock epoch seconds): a router forgets a block
  when it expires, even if the removal event is lost;
- `KVEventBatch.seq`: a per-engine counter, +1 per batch, from 1, so a router sees a gap
  and resyncs from the engine's snapshot (`GET /kv/snapshot`, `KVSnapshot`);
- `KVEventBatch.engine_id`.

Token ids never leave a kvgate engine: `BlockStored.token_ids` is always empty. Block hashes
are the engine's salted chained hashes (inference/hashing.py), so one hash is the routing
key, the event key and the shared tier's storage key, and two tenants never share one.

Transport: NATS JetStream, stream `STREAM_NAME`, one subject per model and engine
(`subject()`); each message is one encoded KVEventBatch.
"""

from __future__ import annotations

import re
from typing import Literal

import msgspec

# Where a block sits. vLLM says "GPU" for device memory and "CPU" for its CPU offload tier; kvgate's
# device pool is "GPU" on CUDA and "CPU" on a CPU engine, its lower tiers "HOST" and "DISK", and
# the shared Redis tier "REMOTE".
Medium = Literal["GPU", "CPU", "HOST", "DISK", "REMOTE"]
DEVICE_MEDIA: frozenset[str] = frozenset({"GPU", "CPU"})
LOWER_MEDIA: frozenset[str] = frozenset({"HOST", "DISK"})
SHARED_MEDIA: frozenset[str] = frozenset({"REMOTE"})

STREAM_NAME = "KVGATE_KV_EVENTS"
SUBJECT_PREFIX = "kvgate.kv"


class BlockStored(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    block_hashes: list[bytes]
    parent_block_hash: bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    ttl_s: int | None = None
    expires_at: float | None = None


class BlockRemoved(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    block_hashes: list[bytes]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, array_like=True, omit_defaults=True, gc=False):
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[KVEvent]
    data_parallel_rank: int | None = None
    seq: int = 0
    engine_id: str = ""


class SnapshotBlock(msgspec.Struct, frozen=True):
    block_hash: str  # hex
    medium: str
    expires_at: float


class KVSnapshot(msgspec.Struct):
    """Every live block an engine holds, as of event batch `seq` (the last one it published)."""

    engine_id: str
    seq: int
    blocks: list[SnapshotBlock]


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _encoder.encode(batch)


def decode_batch(data: bytes) -> KVEventBatch:
    """Raises msgspec.DecodeError on anything that is not a KVEventBatch."""
    return _decoder.decode(data)


def _token(value: str) -> str:
    # NATS subject tokens may not hold '.', '*', '>' or whitespace.
    return re.sub(r"[^A-Za-z0-9_-]", "_", value) or "_"


def subject(model_id: str, engine_id: str) -> str:
    """The subject one engine publishes its batches on."""
    return f"{SUBJECT_PREFIX}.{_token(model_id)}.{_token(engine_id)}"


def model_subjects(model_id: str) -> str:
    """The wildcard a router subscribes to for every engine of one model."""
    return f"{SUBJECT_PREFIX}.{_token(model_id)}.*"
