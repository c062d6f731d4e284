"""The sealed record format of the disk and Redis tiers: one fixed-size record per block.

A record is a header, padding (to a 4 KiB boundary on disk, 64 bytes in Redis), then
the block's payload (all layers' K and V, contiguous), encrypted. Everything but the
header's first 56 bytes is AES-256-GCM ciphertext under the record's own key
(sealing.TierKeys: HKDF of the tier key and the record's name, itself a keyed hash of
the salted block hash):

    clear:  magic "KVGBLK02" | key id u32 | name (32 bytes) | header nonce (12 bytes)
    sealed: layout fingerprint u64 | hash length u32 | hash (32 bytes, zero padded)
            | ttl_s u32 | block_size u32 | last_used f64 | expires_at f64 | payload length u64
            | payload nonce (12 bytes) | payload tag (16 bytes) | token ids u32 * block_size
            | header tag (16 bytes)

The header's associated data is its clear part: the version, the key id and the name
cannot change without the header failing to open, and a record copied under another
block's (or another tenant's) name opens under neither key. The payload is sealed
under the same key with its own nonce and "KVGPAY02" | key id | name as associated
data; its tag sits in the sealed header, so the header can be rewritten (a longer
expiry) without touching the payload. No token id, hash or timestamp is readable
without the tier key. Records of the plaintext format (KVGBLK01) fail the magic:
misses, never misparsed.

A record is written whole, header page and payload, in one page-aligned write
(O_DIRECT where the filesystem allows, so the CPU does not copy it into the page
cache). A crash can leave any mix of the old and the new record's pages; every mix
but all-old (the old block, intact) or all-new fails the header's or the payload's
tag, so a torn record never loads. Payloads are verified on every load; headers on
every lookup (Redis) or when the index is rebuilt (disk).
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, replace

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from inference.tiers.sealing import TierKeys

MAGIC = b"KVGBLK02"
PAYLOAD_MAGIC = b"KVGPAY02"
PAGE = 4096
NONCE = 12
TAG = 16
_CLEAR = struct.Struct("<8sI32s12s")
_SEALED = struct.Struct("<QI32sIIddQ12s16s")
MAX_HASH_LEN = 32


def header_size(block_size: int) -> int:
    return _CLEAR.size + _SEALED.size + 4 * block_size + TAG


def payload_offset(block_size: int) -> int:
    """Where the payload starts in a record: the header, rounded up to a page."""
    return -(-header_size(block_size) // PAGE) * PAGE


def record_size(block_size: int, payload_bytes: int) -> int:
    return -(-(payload_offset(block_size) + payload_bytes) // PAGE) * PAGE


def _payload_aad(key_id: int, name: bytes) -> bytes:
    return PAYLOAD_MAGIC + struct.pack("<I", key_id) + name


def seal_payload(keys: TierKeys, block_hash: bytes, payload: np.ndarray) -> tuple[int, bytes, bytes]:
    """Encrypt payload (uint8, C-contiguous) in place under the current key; returns (key id, nonce, tag)."""
    key_id = keys.current_id
    name = keys.name(key_id, block_hash)
    key = keys.record_key(key_id, name)
    assert key is not None
    nonce = os.urandom(NONCE)
    encryptor = Cipher(algorithms.AES(key), modes.GCM(nonce)).encryptor()
    encryptor.authenticate_additional_data(_payload_aad(key_id, name))
    view = memoryview(payload).cast("B")
    encryptor.update_into(view, view)  # in place: GCM is a stream mode, the staging buffer is the job's own
    encryptor.finalize()
    return key_id, nonce, encryptor.tag


def open_payload(
    keys: TierKeys, header: RecordHeader, payload: np.ndarray | memoryview, out: np.ndarray | None = None
) -> bool:
    """Decrypt payload into out (default: in place) and check its tag against header's.

    False if it fails to open: out then holds garbage, which the caller must not use.
    """
    name = keys.name(header.key_id, header.block_hash) if keys.knows(header.key_id) else b""
    key = keys.record_key(header.key_id, name) if name else None
    if key is None or len(header.payload_tag) != TAG:
        return False
    decryptor = Cipher(algorithms.AES(key), modes.GCM(header.payload_nonce, header.payload_tag)).decryptor()
    decryptor.authenticate_additional_data(_payload_aad(header.key_id, name))
    view = memoryview(payload).cast("B")
    target = view if out is None else memoryview(out).cast("B")
    if len(target) < len(view):
        return False
    decryptor.update_into(view, target)
    try:
        decryptor.finalize()
    except InvalidTag:
        return False
    return True


@dataclass(frozen=True)
class RecordHeader:
    layout: int
    block_hash: bytes
    ttl_s: int
    last_used: float
    expires_at: float
    payload_len: int
    token_ids: tuple[int, ...]
    key_id: int = 0  # the key the payload is sealed under (the header is sealed under it too)
    payload_nonce: bytes = bytes(NONCE)
    payload_tag: bytes = bytes(TAG)

    def sealed(self, key_id: int, nonce: bytes, tag: bytes) -> RecordHeader:
        return replace(self, key_id=key_id, payload_nonce=nonce, payload_tag=tag)

    def pack(self, keys: TierKeys) -> bytes:
        """The header, sealed under its key id's key with a fresh nonce (a rewrite never reuses one)."""
        assert len(self.block_hash) <= MAX_HASH_LEN
        name = keys.name(self.key_id, self.block_hash)
        key = keys.record_key(self.key_id, name)
        assert key is not None, "a header is sealed under a configured key"
        n = len(self.token_ids)
        clear = _CLEAR.pack(MAGIC, self.key_id, name, os.urandom(NONCE))
        body = _SEALED.pack(
            self.layout,
            len(self.block_hash),
            self.block_hash,
            self.ttl_s,
            n,
            self.last_used,
            self.expires_at,
            self.payload_len,
            self.payload_nonce,
            self.payload_tag,
        ) + struct.pack(f"<{n}I", *self.token_ids)
        return clear + AESGCM(key).encrypt(clear[-NONCE:], body, clear)

    @staticmethod
    def name_of(data: bytes) -> tuple[int, bytes] | None:
        """The (key id, name) a record says it is, unauthenticated; None if not this format."""
        if len(data) < _CLEAR.size or data[: len(MAGIC)] != MAGIC:
            return None
        _, key_id, name, _ = _CLEAR.unpack_from(data)
        return key_id, name

    @classmethod
    def unpack(cls, data: bytes, *, block_size: int, keys: TierKeys, name: bytes | None = None) -> RecordHeader | None:
        """The header in data, or None unless it is a whole header of this block size that opens under keys.

        name: the name the caller looked the record up by (Redis); a record under any other fails.
        """
        size = header_size(block_size)
        claimed = cls.name_of(data)
        if len(data) < size or claimed is None:
            return None
        key_id, clear_name = claimed
        if name is not None and clear_name != name:
            return None
        key = keys.record_key(key_id, clear_name)
        if key is None:  # sealed under a key that is not (or no longer) configured
            return None
        clear = data[: _CLEAR.size]
        try:
            body = AESGCM(key).decrypt(clear[-NONCE:], data[_CLEAR.size : size], clear)
        except InvalidTag:
            return None
        layout, hash_len, hash_bytes, ttl_s, n, last_used, expires_at, plen, pnonce, ptag = _SEALED.unpack_from(body)
        if n != block_size or hash_len > MAX_HASH_LEN:
            return None
        block_hash = hash_bytes[:hash_len]
        # The sealed hash must be the one the name was made of: the name alone is what the key came from.
        if keys.name(key_id, block_hash) != clear_name:
            return None
        tokens = struct.unpack_from(f"<{n}I", body, _SEALED.size)
        return cls(layout, block_hash, ttl_s, last_used, expires_at, plen, tokens, key_id, pnonce, ptag)
