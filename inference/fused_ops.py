"""Fused decoder-layer ops for bf16 and float32 models on CPU (csrc/fused_ops.c), swapped into a loaded model.

A transformers decoder layer runs RMSNorm as seven torch ops with float32 temporaries,
rotary embeddings as ten, and the MLP's SiLU(gate) * up as two, each a pass over
memory; at 1k-token prefills they took about a third of the time the matmuls did.
`fuse_decoder_layers` replaces, in each layer of a llama-style model:
  - the norms by FusedRMSNorm (one C pass per row);
  - q/k/v by one projection (one matmul of their concatenated weights: fewer, wider
    calls are faster; in bf16 oneDNN gives every output bit-identical to the separate
    matmuls), then rotary embeddings of q and k in one C pass, then paged attention;
  - gate/up by one projection, then SiLU(gate) * up in one C pass.
Every fused op computes each row from that row alone, so outputs stay independent of
batching and chunking, which the engine's exactness rests on.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from inference.cpu_linear import can_pack, is_cpu_float32
from inference.native import load_library
from inference.paged_attention import AttentionBatch, paged_attention

FUSABLE_MODEL_TYPES = ("llama", "qwen2", "mistral")
_I64, _PTR, _F32, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float, ctypes.c_int
SUFFIXES = {torch.bfloat16: "bf16", torch.float32: "f32"}  # the element types of csrc/fused_ops.c
# In shared KV tiers' model fingerprints: bumped when what the fused ops compute changes, so no
# engine reads KV another version computed. 2: float32 models are fused too.
FUSED_OPS_VERSION = 2


class FusedOps:
    """The C functions, on bf16 or float32 tensors whose last dimension has unit stride."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        argtypes = {
            "rmsnorm": [_PTR, _I64, _PTR, _PTR, _I64, _I64, _F32, _INT],
            "silu_mul": [_PTR, _I64, _PTR, _I64, _I64, _INT],
            "rotary": [_PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _INT],
            "add_rmsnorm": [_PTR, _PTR, _PTR, _PTR, _PTR, _I64, _I64, _F32, _INT],
            "rotary_to_pool": [_PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, *[_I64] * 5, _INT],
        }
        for suffix in SUFFIXES.values():
            for name, types in argtypes.items():
                fn = getattr(lib, f"kvgate_{name}_{suffix}")
                fn.argtypes, fn.restype = types, None
        self.lib = lib

    def _fn(self, name: str, dtype: torch.dtype) -> ctypes._CFuncPtr:
        return getattr(self.lib, f"kvgate_{name}_{SUFFIXES[dtype]}")

    @classmethod
    def load(cls, cache_dir: Path, isa: str) -> FusedOps:
        """The ops built for ISA variant isa (every variant gives the same bits); KernelBuildError if not built."""
        return cls(load_library("fused_ops", str(cache_dir), isa))

    def rmsnorm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """weight * bf16(x / sqrt(mean(x^2) + eps)) over the last dimension."""
        rows = _rows(x)
        out = torch.empty(x.shape, dtype=x.dtype)
        weight = weight.contiguous()
        assert weight.dtype == x.dtype
        self._fn("rmsnorm", x.dtype)(
            rows.data_ptr(), rows.stride(0), weight.data_ptr(), out.data_ptr(), rows.shape[0], rows.shape[1],
            eps, torch.get_num_threads(),
        )  # fmt: skip
        return out

    def add_rmsnorm(
        self, hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden + delta, rmsnorm(hidden + delta)) for [T, C] rows: a residual add and the next
        norm in one pass, bit-identical to the torch add then rmsnorm."""
        assert hidden.is_contiguous() and delta.is_contiguous() and hidden.shape == delta.shape
        assert hidden.dtype == delta.dtype == weight.dtype in SUFFIXES
        total, out = torch.empty_like(hidden), torch.empty_like(hidden)
        T, C = hidden.shape
        self._fn("add_rmsnorm", hidden.dtype)(
            hidden.data_ptr(), delta.data_ptr(), weight.contiguous().data_ptr(), total.data_ptr(), out.data_ptr(),
            T, C, eps, torch.get_num_threads(),
        )  # fmt: skip
        return total, out

    def silu_mul(self, gate_up: torch.Tensor) -> torch.Tensor:
        """[..., 2N] -> [..., N]: SiLU of the first half times the second half."""
        rows = _rows(gate_up)
        n = rows.shape[1] // 2
        out = torch.empty(*gate_up.shape[:-1], n, dtype=gate_up.dtype)
        self._fn("silu_mul", gate_up.dtype)(
            rows.data_ptr(), rows.stride(0), out.data_ptr(), rows.shape[0], n, torch.get_num_threads()
        )
        return out

    def rotary(
        self, qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, heads: int, kv_heads: int, head_dim: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """qkv [T, (heads + 2 kv_heads) * head_dim], cos/sin [T, head_dim] -> rotated q [T, H, D], k [T, KVH, D]."""
        T = qkv.shape[0]
        assert qkv.stride(1) == 1 and cos.stride(1) == 1 and cos.stride() == sin.stride()
        assert qkv.dtype == cos.dtype == sin.dtype in SUFFIXES
        q = torch.empty(T, heads, head_dim, dtype=qkv.dtype)
        k = torch.empty(T, kv_heads, head_dim, dtype=qkv.dtype)
        self._fn("rotary", qkv.dtype)(
            qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), cos.stride(0), q.data_ptr(), k.data_ptr(),
            T, heads, kv_heads, head_dim, torch.get_num_threads(),
        )  # fmt: skip
        return q, k

    def rotary_to_pool(
        self,
        qkv: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        shape: tuple[int, int, int],
        k_pool: torch.Tensor,
        v_pool: torch.Tensor,
        slots: torch.Tensor,
    ) -> torch.Tensor:
        """rotary's q [T, H, D]; the rotated keys and the values of the first len(slots) rows go
        straight to those slots of k_pool and v_pool ([slots, KVH, D], contiguous), as
        index_copy_ of rotary's k and of qkv's values would put them."""
        heads, kv_heads, head_dim = shape
        T = qkv.shape[0]
        assert qkv.stride(1) == 1 and cos.stride(1) == 1 and cos.stride() == sin.stride()
        assert k_pool.is_contiguous() and v_pool.is_contiguous() and slots.dtype == torch.long
        assert k_pool.dtype == v_pool.dtype == qkv.dtype == cos.dtype == sin.dtype in SUFFIXES
        assert slots.shape[0] <= T
        q = torch.empty(T, heads, head_dim, dtype=qkv.dtype)
        self._fn("rotary_to_pool", qkv.dtype)(
            qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), sin.data_ptr(), cos.stride(0), q.data_ptr(),
            k_pool.data_ptr(), v_pool.data_ptr(), slots.data_ptr(), slots.shape[0], T, heads, kv_heads, head_dim,
            torch.get_num_threads(),
        )  # fmt: skip
        return q


def _rows(x: torch.Tensor) -> torch.Tensor:
    assert x.dtype in SUFFIXES and x.device.type == "cpu"
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()


class FusedRMSNorm(torch.nn.Module):
    def __init__(self, norm: torch.nn.Module, ops: FusedOps) -> None:
        super().__init__()
        self.weight = norm.weight
        self.eps = float(norm.variance_epsilon)
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ops.rmsnorm(x, self.weight, self.eps)


class FusedMLP(torch.nn.Module):
    def __init__(self, mlp: torch.nn.Module, ops: FusedOps) -> None:
        super().__init__()
        self.gate_up_proj = _concat_linears(mlp.gate_proj, mlp.up_proj)
        self.gate_up_proj.kvgate_silu_pairs = True  # PackedLinear may fuse the SiLU * up into its output
        self.down_proj = mlp.down_proj
        self.ops = ops

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj
        if hasattr(gate_up, "forward_silu_mul"):  # packed: the same result, in fewer passes where it can
            return self.down_proj(gate_up.forward_silu_mul(x, self.ops))
        return self.down_proj(self.ops.silu_mul(gate_up(x)))


class FusedAttention(torch.nn.Module):
    """q/k/v in one matmul, fused rotary, then kvgate's paged attention (which reads kv_batch)."""

    def __init__(self, attn: torch.nn.Module, ops: FusedOps) -> None:
        super().__init__()
        config = attn.config
        self.config = config
        self.layer_idx = attn.layer_idx
        self.head_dim = attn.head_dim
        self.scaling = attn.scaling
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.qkv_proj = _concat_linears(attn.q_proj, attn.k_proj, attn.v_proj)
        self.o_proj = attn.o_proj
        self.ops = ops

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor],
        attention_mask: torch.Tensor | None = None,
        **kwargs: object,
    ) -> tuple[torch.Tensor, None]:
        T = hidden_states.shape[1]
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(hidden_states)[0]
        cos, sin = position_embeddings
        q, k = self.ops.rotary(qkv, cos[0], sin[0], H, KVH, D)
        v = qkv[:, (H + KVH) * D :].view(T, KVH, D)
        # The [1, heads, T, D] views transformers passes to an attention function.
        query, key, value = (t.unsqueeze(0).transpose(1, 2) for t in (q, k, v))
        kwargs.pop("scaling", None)
        out, _ = paged_attention(self, query, key, value, attention_mask, scaling=self.scaling, **kwargs)
        return self.o_proj(out.reshape(1, T, H * D)), None

    def attend_rows(
        self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, batch: AttentionBatch
    ) -> torch.Tensor:
        """forward's computation on [T, hidden] rows with the CPU kernel, without the [1, ...] views
        transformers passes (inference/models/llama.py): the same ops, the same results."""
        T = hidden.shape[0]
        H, KVH, D = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv_proj(hidden)
        # New keys and values straight into the pool (a padded pass writes its real rows only).
        flat_k, flat_v = batch.kv.flat(self.layer_idx, 0), batch.kv.flat(self.layer_idx, 1)
        q = self.ops.rotary_to_pool(qkv, cos, sin, (H, KVH, D), flat_k, flat_v, batch.slot_mapping)
        out = batch.backend.attend_rows(batch, self.layer_idx, q, self.scaling)
        return self.o_proj(out.view(T, H * D))


def _concat_linears(*linears: torch.nn.Linear) -> torch.nn.Linear:
    """One nn.Linear computing the given ones' outputs side by side (packed later like any other)."""
    weight = torch.cat([lin.weight.detach() for lin in linears])
    has_bias = [lin.bias is not None for lin in linears]
    fused = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=all(has_bias), dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if all(has_bias):
            fused.bias.copy_(torch.cat([lin.bias.detach() for lin in linears]))
    return fused


def fusable(model: torch.nn.Module) -> bool:
    """Whether fuse_decoder_layers fuses this model (its architecture, dtype and device)."""
    config = model.config
    return (
        config.model_type in FUSABLE_MODEL_TYPES
        and (can_pack(model) or is_cpu_float32(model))
        and getattr(config, "hidden_act", None) in ("silu", "swish")
        and hasattr(model, "model")
        and hasattr(model.model, "layers")
    )


def fuse_decoder_layers(model: torch.nn.Module, ops: FusedOps | None) -> int:
    """Swap in the fused modules (once per model; a second call finds them); returns how many were swapped.

    Only for a bf16 CPU model whose linears oneDNN packs (where the concatenated q/k/v and
    gate/up matmuls are bit-identical to the separate ones) or a float32 CPU model (where
    they may differ from the separate ones in the last bits, as any other matmul order
    would: every row is still computed the same way in every pass), and only where every
    module of a kind agrees on biases.
    """
    if ops is None or not fusable(model):
        return 0
    swapped = 0
    for layer in model.model.layers:
        for name in ("input_layernorm", "post_attention_layernorm"):
            if _is_rmsnorm(getattr(layer, name)):
                setattr(layer, name, FusedRMSNorm(getattr(layer, name), ops))
                swapped += 1
        attn = layer.self_attn
        if not isinstance(attn, FusedAttention) and _same_bias(attn.q_proj, attn.k_proj, attn.v_proj):
            layer.self_attn = FusedAttention(attn, ops)
            swapped += 1
        mlp = layer.mlp
        if not isinstance(mlp, FusedMLP) and _same_bias(mlp.gate_proj, mlp.up_proj):
            layer.mlp = FusedMLP(mlp, ops)
            swapped += 1
    if _is_rmsnorm(model.model.norm):
        model.model.norm = FusedRMSNorm(model.model.norm, ops)
        swapped += 1
    return swapped


def _is_rmsnorm(module: torch.nn.Module) -> bool:
    return type(module).__name__.endswith("RMSNorm") and hasattr(module, "variance_epsilon")


def _same_bias(*linears: torch.nn.Module) -> bool:
    return all(type(lin) is torch.nn.Linear for lin in linears) and len({lin.bias is None for lin in linears}) == 1
