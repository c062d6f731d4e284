"""GET /kv/info and GET /kv/snapshot: what a router needs to know of this engine's KV cache.

/kv/info tells a gateway how to compute the block hashes this engine uses (model id, block
size, hash algorithm: `BlockHasher(...).hash_blocks(prompt_token_ids, cache_salt)`), where its
KV events go, whether it has a shared tier, and its kernel plan (inference/platform.py).
/kv/snapshot is every live block with its medium, as of event batch `seq`
(kvgate.kv_events.KVSnapshot): a router that sees a gap in the seqs replaces what it knows
of this engine with it, then applies the batches after seq.
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Depends, Response

from inference.server.errors import error_response
from inference.server.state import ServerState, server_state

router = APIRouter()
State = Annotated[ServerState, Depends(server_state)]


@router.get("/kv/info")
async def kv_info(state: State) -> dict[str, Any]:
    core = state.engine.core
    assert core is not None, "the app starts the engine before serving"
    tiers = core.tiers.tiers if core.tiers is not None else []
    return {
        "engine_id": core.engine_id,
        "model_id": core.model_id,
        "block_size": core.block_size,
        "hash_algo": core.hasher.algo,
        "kv_events_subject": core.kv_events_subject,
        "shared_tier": any(tier.shared for tier in tiers),
        "kernel_plan": {**core.plan.describe(), "digest": core.plan.digest()},
    }


@router.get("/kv/snapshot")
async def kv_snapshot(state: State) -> Response:
    core = state.engine.core
    assert core is not None, "the app starts the engine before serving"
    log = core.kv_events
    if log is None:
        return error_response(404, "this engine publishes no KV events (KVGATE_NATS_URL is unset): no snapshot")
    # Off the event loop: a large cache makes a large snapshot.
    snapshot = await asyncio.to_thread(log.snapshot)
    return Response(msgspec.json.encode(snapshot), media_type="application/json")
