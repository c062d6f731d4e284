"""Engine settings, read from KVGATE_* environment variables."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from inference.bundled_models import SMOLLM2
from kvgate.settings import ENV_FILE

DEFAULT_MODEL = SMOLLM2.name


class EngineSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="KVGATE_", env_file=ENV_FILE, extra="ignore")

    model: str = Field(
        DEFAULT_MODEL,
        description="A bundled model by name: SmolLM2-135M-Instruct, or Qwen2.5-Coder-0.5B-Instruct (its chat "
        "template takes tools); or a path to a Hugging Face checkpoint directory.",
    )
    served_model_name: str | None = Field(None, description="Model id shown to clients; defaults to the model's name.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="auto: bfloat16 on CUDA and on CPUs with avx512_bf16/AMX, else float32."
    )
    device: str = Field("auto", description="auto, cpu or cuda[:N].")
    cache_dir: Path = Field(Path.home() / ".cache" / "kvgate", description="Where converted models are kept.")
    num_threads: int | None = Field(
        None,
        description="torch intra-op threads; defaults to all cores (or OMP_NUM_THREADS). kvgate also sets "
        "OMP_WAIT_POLICY=PASSIVE unless OMP_WAIT_POLICY or GOMP_SPINCOUNT is set (bench/neighbour.py measures it).",
    )

    attention_backend: Literal["auto", "cpu_kernel", "torch"] = Field(
        "auto",
        description="auto: our batch-invariant C kernel on x86-64 CPUs with a C compiler (a kernel that does not build "
        "stops the engine with the compiler's error), else torch SDPA; the kernel plan says which ran.",
    )
    decode_linear: Literal["auto", "onednn"] = Field(
        "auto",
        description="auto: on CPUs with avx512_bf16 but no AMX, the linears of generated tokens' rows run in "
        "kvgate's decode kernel (prompt rows in oneDNN); on CPUs with AMX every row runs in kvgate's AMX kernel; "
        "on AVX2 CPUs (float32), generated tokens' rows read the exact Q4_1/Q8_0 blocks of a GGUF model's weights. "
        "onednn: no decode kernel, every row on the prompt rows' path (oneDNN or MKL, or the AMX kernel).",
    )
    linear_amx: bool = Field(
        True,
        description="On AMX CPUs, bf16 linears run in kvgate's row-invariant AMX kernel; false: oneDNN's matmul "
        "(for A/B runs: its sums on AMX depend on the call's row count, so cache hits may change output).",
    )
    attention_amx: bool = Field(
        True, description="On AMX CPUs, bf16 attention runs on the AMX tiles; false: the avx512_bf16 kernel."
    )
    kernel_isa: Literal["auto", "generic", "avx2", "avx512bf16", "amx"] = Field(
        "auto",
        description="The most capable ISA variant of kvgate's C kernels to run (auto: the best this CPU runs); "
        "for A/B runs and tests (on AMX CPUs a cap below amx leaves bf16 linears to oneDNN, which is not "
        "row-invariant there). The engine logs its kernel plan in engine_ready.",
    )
    decode_spin_us: int | None = Field(
        None,
        ge=0,
        description="How long the decode kernel's threads spin between calls within a forward pass; unset: "
        "0 for bf16 weights, 300 for exact GGUF blocks (bench/decode_ab.py measured both).",
    )
    kv_cache_gib: float = Field(1.0, gt=0, description="Device KV-cache pool size.")
    kv_cache_blocks: int | None = Field(None, gt=1, description="Pool size in blocks; overrides kv_cache_gib.")
    block_size: int = Field(16, gt=0, description="Tokens per KV block, the unit of caching.")
    enable_prefix_caching: bool = Field(True, description="Off: nothing is read from or written to the cache.")
    hash_algo: Literal["sha256", "xxhash128"] = Field("sha256", description="Block hash function.")
    default_ttl_s: int = Field(300, gt=0, description="TTL of automatically cached blocks, in seconds.")
    max_model_len: int | None = Field(None, description="Context limit; defaults to the model's.")
    max_num_seqs: int = Field(64, gt=0, description="Most requests running at once.")
    max_num_batched_tokens: int = Field(2048, gt=0, description="Prefill token budget per engine step.")
    max_waiting: int = Field(256, ge=0, description="Waiting-queue capacity; beyond it requests are refused.")
    max_waiting_per_tenant: int | None = Field(
        None,
        ge=1,
        description="Most requests one tenant may have waiting; beyond it its requests get 529 (the others' do "
        "not). Unset: half of max_waiting.",
    )
    fair_prefill_quantum: int = Field(
        256,
        gt=0,
        description="Deficit round robin across tenants: prompt tokens a weight-1 tenant is granted per round of "
        'the waiting queue and of each step\'s prefill budget (see docs/architecture.md, "Fair share").',
    )
    contended_prefill_tokens: int | None = Field(
        256,
        gt=0,
        description="Most prompt tokens a step computes while more than one tenant has work in it (prefills or "
        "decodes), so a neighbour's long prompts add a small chunk to another's step. Unset: the whole budget.",
    )
    grammar_compile_threads: int = Field(2, gt=0, description="Threads compiling JSON schemas and grammars.")
    grammar_compile_timeout_s: float = Field(
        10.0,
        gt=0,
        description="A schema or grammar not compiled in this long (its tenant's turn included) gets a 400.",
    )
    engine_token: SecretStr | None = Field(
        None,
        min_length=16,
        description="Bearer token of the engine server: every route but /health requires it, and the gateway "
        "sends it to its remote engines (KVGATE_ENGINES; vLLM's --api-key takes the same header). Unset: "
        "`kvgate engine serve` binds loopback addresses only.",
    )
    drain_token: SecretStr | None = Field(
        None,
        description="Bearer token for the engine server's POST /drain (`kvgate engine drain`); unset: only "
        "loopback clients may drain it.",
    )

    # KV tiers below the device pool (see docs/architecture.md, "KV tiers").
    kv_host_gib: float = Field(0.0, ge=0, description="Host-memory KV tier size; 0 turns it off. Pinned on CUDA.")
    kv_disk_dir: Path | None = Field(None, description="Disk KV tier directory, kept across restarts; unset: off.")
    kv_disk_gib: float = Field(16.0, gt=0, description="Disk KV tier size.")
    kv_host_blocks: int | None = Field(None, ge=0, description="Host tier size in blocks; overrides kv_host_gib.")
    kv_disk_blocks: int | None = Field(None, ge=0, description="Disk tier size in blocks; overrides kv_disk_gib.")
    kv_pin_min_ttl_s: int = Field(3600, gt=0, description="Blocks with at least this TTL (1h regions) are soft-pinned.")
    kv_pin_share: float = Field(
        0.5,
        ge=0,
        le=1,
        description="Soft pinning: the most share of the device pool, and of each tier, in which pinned blocks "
        "are kept in preference to others. 0 turns pinning off.",
    )
    kv_disk_write_out_on_close: bool = Field(
        True,
        description="At shutdown, write the live blocks of the device pool and host tier to the disk tier, "
        "so a restart keeps them.",
    )
    kv_tier_key: SecretStr | None = Field(
        None,
        description="Key the disk and Redis KV tiers encrypt and authenticate their records with (AES-256-GCM, a "
        "key per block derived by HKDF); the same on every engine sharing a Redis tier, e.g. `openssl rand -base64 "
        "32`. Unset: a random key per process, so disk records do not survive a restart and Redis blocks are not "
        'shared (docs/deployment.md, "KV tier encryption").',
    )
    kv_tier_previous_keys: SecretStr | None = Field(
        None,
        description="Comma-separated former KVGATE_KV_TIER_KEY values whose records are still read (never "
        "written), during a key rotation; records under any other key are misses.",
    )
    kv_offload_staging_mib: float = Field(
        64.0, gt=0, description="Host buffers for blocks on their way to disk; when all are in flight, evictions wait."
    )

    # KV events (docs/architecture.md, "KV events"): what this engine's caches hold, for prefix routing.
    nats_url: str | None = Field(
        None,
        description="NATS server (with JetStream) to publish KV cache events to, e.g. nats://127.0.0.1:4222; "
        "unset: no events (gateways then route on what they sent where).",
    )
    engine_id: str | None = Field(
        None,
        description="This engine's id in KV events and GET /kv/info; unique per engine. Default: host:port "
        "under `kvgate engine serve` (the machine's hostname when listening on all addresses), else hostname-pid.",
    )
    # The shared tier in Redis (docs/architecture.md, "The Redis tier").
    kv_redis_url: str | None = Field(
        None,
        description="Shared KV tier in Redis (redis://host:port/db), read and written by every engine of the same "
        "model; unset: off. Redis down or slow means recompute, never an error.",
    )
    kv_redis_gib: float = Field(
        8.0,
        gt=0,
        description="How much of the Redis tier this engine indexes (blocks it knows to be there, for refreshes and "
        "metrics). Redis's own maxmemory and eviction policy bound the store itself.",
    )
    kv_redis_chunk_blocks: int = Field(
        32, gt=0, description="Blocks per Redis round trip: lookups, loads and stores go in pipelines of this many."
    )
    kv_redis_timeout_ms: int = Field(
        500, gt=0, description="Socket timeout of Redis calls; a call past it counts as Redis down (recompute)."
    )
    kv_redis_queue_mib: float = Field(
        128.0,
        gt=0,
        description="Blocks queued for the Redis writer thread at most; beyond that stores are dropped, never waited.",
    )

    def resolved_engine_id(self) -> str:
        """engine_id, or hostname-pid when unset."""
        return self.engine_id or f"{socket.gethostname()}-{os.getpid()}"

    @field_validator("kv_tier_key")
    @classmethod
    def _tier_key_length(cls, key: SecretStr | None) -> SecretStr | None:
        # A short key is guessable offline from any record; refuse it at start rather than seal with it.
        if key is not None and len(key.get_secret_value()) < 16:
            raise ValueError("KVGATE_KV_TIER_KEY must be at least 16 characters (e.g. `openssl rand -base64 32`)")
        return key

    @field_validator("kv_redis_url")
    @classmethod
    def _redis_url_scheme(cls, url: str | None) -> str | None:
        # A typo must stop the engine at start with this line, not read as "Redis down" forever.
        if url and not url.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("KVGATE_KV_REDIS_URL must start with redis://, rediss:// or unix://")
        return url
