"""The linears of decode rows (generated tokens) through csrc/decode_linear.c.

A decode step reads every weight once for a few rows. The kernel serves two kinds of model:
  - bf16 on avx512_bf16 CPUs: oneDNN's small-matmul path took ~180 us a call, twice the time
    to read the weights; the kernel reads weights packed for it at load (DecodeLinear keeps
    the oneDNN PackedLinear for prompt rows);
  - float32 on AVX2 CPUs, where the weights are exact GGUF blocks (exact_blocks.py): the
    kernel reads the blocks, a sixth of the float32 bytes, and rebuilds the same weights
    (BlockDecodeLinear keeps the nn.Linear for prompt rows).
Either way the kernel sums in float32 in one fixed order per output, the same for any
number of rows.

Which rows are which is the row's kind, never the batch's size or mix: a row at a
position past its request's prompt (its input is a generated token) is a decode row,
every other row a prompt row. ModelRunner puts a pass's decode rows first and sets
DecodeRows.count; every DecodeLinear of the model reads it. So a prompt row is always
computed by the prompt path and a decode row always by our kernel, whatever else runs in
the step; only prompt blocks are ever cached (kv_cache_manager.commit_computed), so cached
KV always comes from the prompt path, as it did before.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from inference.cpu_linear import PackedLinear
from inference.exact_blocks import BLOCK, BlockWeight, find_blocks
from inference.fused_ops import FusedOps
from inference.native import load_library

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
# How long a kernel thread spins after a call, within a forward pass, before it sleeps
# (between passes it sleeps at once), per weight format. The decode_spin_us setting
# (KVGATE_DECODE_SPIN_US) overrides both. Measured with bench/decode_ab.py:
#   - bf16, on the shared 2-core Zen4 machine (load 6-10): 100-200 us of spinning halved
#     decode speed against sleeping at once (0), so there workers never spin;
#   - exact blocks, on a 2-core Zen3 (AVX2): spinning 300 us (and yielding while it spins)
#     let every call of 15 us or more split between both cores, 1.18x decode speed at 1
#     stream and 1.11x at 8 idle, 0.93x and 0.94x beside a busy loop.
DEFAULT_SPIN_US = {"bf16": 0, "blocks": 300}


class DecodeKernel:
    """The C functions: pack a bf16 weight, then multiply rows by it; or multiply float32 rows by exact blocks."""

    def __init__(self, lib: ctypes.CDLL, spin_us: int | None = None) -> None:
        lib.kvgate_decode_linear_available.restype = _INT
        available = lib.kvgate_decode_linear_available()
        self.bf16 = bool(available & 1)  # avx512_bf16
        self.blocks = bool(available & 2)  # AVX2 + FMA
        lib.kvgate_decode_linear_packed_size.argtypes = [_I64, _I64]
        lib.kvgate_decode_linear_packed_size.restype = _I64
        lib.kvgate_decode_linear_pack.argtypes = [_PTR, _I64, _I64, _PTR]
        lib.kvgate_decode_linear_pack.restype = None
        lib.kvgate_decode_linear_set_spin.argtypes = [_I64]
        lib.kvgate_decode_linear_set_spin.restype = None
        lib.kvgate_decode_linear.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _I64, _INT, _INT]
        lib.kvgate_decode_linear.restype = None
        lib.kvgate_decode_blocks_linear.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _INT, _I64, _PTR, _PTR, _I64, _INT]
        lib.kvgate_decode_blocks_linear.restype = None
        lib.kvgate_decode_blocks_unpack.argtypes = [_PTR, _INT, _I64, _I64, _PTR]
        lib.kvgate_decode_blocks_unpack.restype = None
        self.lib = lib
        self.spin_ns = {fmt: 1000 * (us if spin_us is None else spin_us) for fmt, us in DEFAULT_SPIN_US.items()}

    @classmethod
    def load(cls, cache_dir: Path, isa: str, *, spin_us: int | None = None) -> DecodeKernel:
        """The kernel built for ISA variant isa (avx2: exact blocks; avx512bf16: bf16 pairs too);
        KernelBuildError if it does not build. spin_us: the decode_spin_us setting (None: DEFAULT_SPIN_US)."""
        return cls(load_library("decode_linear", str(cache_dir), isa), spin_us)

    def begin_pass(self, fmt: str) -> None:
        """The kernel's threads may spin between calls from now on (a forward pass over weights
        of format "bf16" or "blocks" is running)."""
        self.lib.kvgate_decode_linear_set_spin(self.spin_ns[fmt])

    def end_pass(self) -> None:
        """The pass is over: the kernel's threads sleep until the next call."""
        self.lib.kvgate_decode_linear_set_spin(0)

    def pack(self, weight: torch.Tensor) -> torch.Tensor:
        """[N, K] bf16 -> the kernel's layout (an opaque int32 tensor)."""
        weight = weight.detach().contiguous()
        assert self.bf16 and weight.dtype == torch.bfloat16 and weight.dim() == 2
        N, K = weight.shape
        packed = torch.empty(self.lib.kvgate_decode_linear_packed_size(N, K), dtype=torch.int32)
        self.lib.kvgate_decode_linear_pack(weight.data_ptr(), N, K, packed.data_ptr())
        return packed

    def linear(
        self,
        x: torch.Tensor,
        packed: torch.Tensor,
        out_features: int,
        bias: torch.Tensor | None = None,
        out_dtype: torch.dtype = torch.bfloat16,
    ) -> torch.Tensor:
        """x [M, K] bf16 (unit stride on K) @ W^T + bias -> [M, N] in bf16 or float32."""
        assert x.dtype == torch.bfloat16 and x.dim() == 2 and x.stride(1) == 1
        assert out_dtype in (torch.bfloat16, torch.float32)
        M, K = x.shape
        out = torch.empty(M, out_features, dtype=out_dtype)
        self.lib.kvgate_decode_linear(
            x.data_ptr(), x.stride(0), M, K, packed.data_ptr(), out_features,
            None if bias is None else bias.data_ptr(), out.data_ptr(), out.stride(0),
            int(out_dtype == torch.float32), torch.get_num_threads(),
        )  # fmt: skip
        return out

    def blocks_linear(self, x: torch.Tensor, weight: BlockWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] float32 (unit stride on K) @ W^T + bias -> [M, N] float32, W given as exact blocks."""
        assert self.blocks and x.dtype == torch.float32 and x.dim() == 2 and x.stride(1) == 1
        assert x.shape[1] == weight.in_features and weight.in_features % BLOCK == 0
        assert bias is None or (bias.dtype == torch.float32 and bias.is_contiguous())
        out = torch.empty(x.shape[0], weight.out_features, dtype=torch.float32)
        self.lib.kvgate_decode_blocks_linear(
            x.data_ptr(), x.stride(0), x.shape[0], weight.in_features, weight.packed.data_ptr(), weight.format,
            weight.out_features, None if bias is None else bias.data_ptr(), out.data_ptr(), out.stride(0),
            torch.get_num_threads(),
        )  # fmt: skip
        return out

    def unpack_blocks(self, weight: BlockWeight) -> torch.Tensor:
        """The float32 weights the kernel multiplies by (for tests)."""
        out = torch.empty(weight.out_features, weight.in_features, dtype=torch.float32)
        self.lib.kvgate_decode_blocks_unpack(
            weight.packed.data_ptr(), weight.format, weight.out_features, weight.in_features, out.data_ptr()
        )
        return out


class DecodeRows(threading.local):
    """How many leading rows of the current pass are decode rows (set by ModelRunner per pass).

    Per thread: engines over one loaded model may step at once in their own threads."""

    count = 0


class _SplitByRowKind(torch.nn.Module):
    """A linear whose pass's leading decode rows (DecodeRows.count) go to the decode kernel, the rest to `prefill`."""

    def __init__(self, prefill: torch.nn.Module, kernel: DecodeKernel, rows: DecodeRows) -> None:
        super().__init__()
        self.prefill = prefill
        self.in_features = prefill.in_features
        self.out_features = prefill.out_features
        self.kernel = kernel
        self.rows = rows

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        """The decode rows' outputs, from the kernel."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = self.rows.count
        if d == 0:
            return self.prefill(x)
        flat = x.reshape(-1, self.in_features)
        out = self.decode(flat[:d])
        if d < flat.shape[0]:
            out = torch.cat([out, self.prefill(flat[d:])])
        return out.reshape(*x.shape[:-1], self.out_features)


class DecodeLinear(_SplitByRowKind):
    """A PackedLinear for prompt rows, our kernel over bf16 weights for the pass's leading decode rows."""

    def __init__(self, prefill: PackedLinear, weight: torch.Tensor, kernel: DecodeKernel, rows: DecodeRows) -> None:
        super().__init__(prefill, kernel, rows)
        self.register_buffer("decode_weight", kernel.pack(weight), persistent=False)

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        return self.kernel.linear(rows, self.decode_weight, self.out_features, self.prefill.bias)

    def forward_silu_mul(self, x: torch.Tensor, ops: FusedOps) -> torch.Tensor:
        """SiLU(gate) * up of this [gate; up] projection: decode rows from the kernel's output, prompt
        rows as the PackedLinear gives them."""
        d = self.rows.count
        if d == 0:
            return self.prefill.forward_silu_mul(x, ops)
        flat = x.reshape(-1, self.in_features)
        act = ops.silu_mul(self.decode(flat[:d]))
        if d < flat.shape[0]:
            act = torch.cat([act, self.prefill.forward_silu_mul(flat[d:], ops)])
        return act.reshape(*x.shape[:-1], self.out_features // 2)


class BlockDecodeLinear(_SplitByRowKind):
    """A float32 nn.Linear for prompt rows, our kernel over its exact blocks for the pass's leading decode rows."""

    def __init__(self, prefill: torch.nn.Linear, blocks: BlockWeight, kernel: DecodeKernel, rows: DecodeRows) -> None:
        super().__init__(prefill, kernel, rows)
        self.blocks = blocks

    def decode(self, rows: torch.Tensor) -> torch.Tensor:
        return self.kernel.blocks_linear(rows, self.blocks, self.prefill.bias)


def use_decode_kernel(model: torch.nn.Module, kernel: DecodeKernel | None) -> DecodeRows | None:
    """Wrap the decoder layers' linears (the LM head is the runner's): bf16 ones in DecodeLinears
    (on avx512_bf16), float32 ones whose weights are exact blocks in BlockDecodeLinears (on AVX2).

    Returns the model's DecodeRows (one per model: a second runner over the same model finds
    the wrapped layers and shares it), or None where the kernel is unavailable or nothing
    was wrapped. Needs the weights before packing: call between fusing and pack_linears.
    """
    if kernel is None:
        return None
    rows = getattr(model, "kvgate_decode_rows", None)
    if rows is not None:
        return rows
    rows = DecodeRows()
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        return None
    swapped = 0
    for parent in list(layers.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is not torch.nn.Linear:
                continue
            if kernel.bf16 and child.weight.dtype == torch.bfloat16:
                setattr(parent, name, DecodeLinear(PackedLinear(child), child.weight, kernel, rows))
                swapped += 1
            elif kernel.blocks and (blocks := find_blocks(child.weight)) is not None:
                setattr(parent, name, BlockDecodeLinear(child, blocks, kernel, rows))
                swapped += 1
    if swapped == 0:
        return None
    model.kvgate_decode_rows = rows
    return rows
