"""Linear layers with oneDNN-prepacked weights, for bf16 on CPU.

A plain bf16 F.linear reorders its weight into oneDNN's blocked layout on every call;
for the one-row matmuls of decode that reorder costs more than the matmul. Packing
once at load time halves small-batch latency. Every row's result is independent of
the other rows in the call (tests/inference/test_cpu_kernels.py), which keeps outputs
exact under batching. Where the CPU has AMX, oneDNN's matmul is not (its sums follow the
call's row count), so there the weight is packed for our AMX kernel instead (amx_linear.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from inference import amx_linear
from inference.amx_linear import AmxLinearKernel

if TYPE_CHECKING:
    from inference.fused_ops import FusedOps


class PackedLinear(torch.nn.Module):
    def __init__(self, linear: torch.nn.Linear, amx: AmxLinearKernel | None = None) -> None:
        """amx: the AMX kernel, where the kernel plan runs bf16 linears on it; else oneDNN's matmul."""
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        weight = linear.weight.detach()
        self.amx = amx if weight.dtype == torch.bfloat16 else None
        # A fused [gate; up] (fused_ops.FusedMLP) packed so the AMX kernel can write SiLU(gate) * up itself.
        self.silu_pairs = (
            self.amx is not None and getattr(linear, "kvgate_silu_pairs", False) and self.out_features % 32 == 0
        )
        if self.amx is not None:
            packed = self.amx.pack(weight, pairs=self.silu_pairs)
        else:
            packed = torch.ops.mkldnn._reorder_linear_weight(weight)
        self.register_buffer("packed_weight", packed, persistent=False)
        bias = None if linear.bias is None else linear.bias.detach()
        self.register_buffer("bias", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.amx is not None:
            mode = amx_linear.PAIRS if self.silu_pairs else amx_linear.PLAIN
            return self._amx(x, mode, self.out_features)
        if x.numel() == self.in_features:
            # oneDNN takes a different path for a single row (its sums come out in another
            # order); padding to two rows keeps every row on the path batches use.
            padded = torch.cat([x.reshape(1, -1), x.new_zeros(1, self.in_features)])
            return self._matmul(padded)[:1].reshape(*x.shape[:-1], self.out_features)
        return self._matmul(x)

    def forward_silu_mul(self, x: torch.Tensor, ops: FusedOps) -> torch.Tensor:
        """SiLU(gate) * up of this [gate; up] projection's output, as ops.silu_mul(self(x)) computes it:
        in the AMX kernel's output stage where the weight was packed for it."""
        if not self.silu_pairs:
            return ops.silu_mul(self(x))
        return self._amx(x, amx_linear.SILU_MUL, self.out_features // 2)

    def _amx(self, x: torch.Tensor, mode: int, width: int) -> torch.Tensor:
        flat = x.reshape(-1, self.in_features)
        if flat.stride(-1) != 1:
            flat = flat.contiguous()
        out = self.amx.linear(flat, self.packed_weight, self.out_features, self.bias, mode)
        return out.reshape(*x.shape[:-1], width)

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")


def can_pack(model: torch.nn.Module) -> bool:
    """True for a bf16 CPU model on a CPU whose oneDNN has a bf16 path (AVX-512 or AVX-NE-CONVERT, not AVX2 alone)."""
    param = next(model.parameters())
    if param.device.type != "cpu" or param.dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def is_cpu_float32(model: torch.nn.Module) -> bool:
    """True for a float32 model on the CPU."""
    param = next(model.parameters())
    return param.device.type == "cpu" and param.dtype == torch.float32


def pack_linears(model: torch.nn.Module, amx: AmxLinearKernel | None = None) -> int:
    """Swap every nn.Linear of a bf16 CPU model for a PackedLinear (on the AMX kernel if given); returns how
    many were swapped."""
    if not can_pack(model):
        return 0
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear:
                setattr(parent, name, PackedLinear(child, amx))
                swapped += 1
    return swapped
