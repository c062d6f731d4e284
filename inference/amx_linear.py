"""bf16 linears on AMX tiles through csrc/amx_linear.c, where the CPU has AMX.

oneDNN's AMX matmul sums a row in an order that depends on how many rows the call has,
so a prompt's last rows came out differently in a cold pass over the whole prompt and in
a warm pass over its uncached tail, and greedy output changed with a cache hit. This
kernel's sums depend on the row alone (tests/inference/test_amx_linear.py), at oneDNN's
speed or better for this model's shapes (bench/prefill_profile.py).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from inference.native import load_library

_I64, _PTR, _INT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
# Output modes of kvgate_amx_linear (csrc/amx_linear.c).
PLAIN, PAIRS, SILU_MUL = 0, 1, 2


class AmxLinearKernel:
    """The C functions: pack a bf16 weight once, then multiply any number of rows by it."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        lib.kvgate_amx_linear_available.restype = _INT
        lib.kvgate_amx_linear_packed_size.argtypes = [_I64, _I64]
        lib.kvgate_amx_linear_packed_size.restype = _I64
        lib.kvgate_amx_linear_pack.argtypes = [_PTR, _I64, _I64, _INT, _PTR]
        lib.kvgate_amx_linear_pack.restype = None
        lib.kvgate_amx_linear.argtypes = [_PTR, _I64, _I64, _I64, _PTR, _I64, _PTR, _PTR, _INT, _INT]
        lib.kvgate_amx_linear.restype = _INT
        self.lib = lib

    @classmethod
    def load(cls, cache_dir: Path) -> AmxLinearKernel | None:
        """The kernel (its amx build), or None where this process may not use the tiles.

        Whether to use it at all is the kernel plan's call (inference/platform.py; the
        linear_amx setting turns it off, for A/B runs against oneDNN, which is not row-invariant on AMX)."""
        lib = load_library("amx_linear", str(cache_dir), "amx")
        kernel = cls(lib)
        return kernel if lib.kvgate_amx_linear_available() else None

    def pack(self, weight: torch.Tensor, pairs: bool = False) -> torch.Tensor:
        """[N, K] bf16 -> the kernel's tile layout (a bf16 tensor, N and K rounded up to 32).

        pairs: the weight is a fused [gate; up] (N a multiple of 32), packed so that a call may
        write SiLU(gate) * up directly (mode SILU_MUL); it is then called with PAIRS or SILU_MUL."""
        weight = weight.detach().contiguous()
        assert weight.dtype == torch.bfloat16 and weight.dim() == 2
        N, K = weight.shape
        assert not pairs or N % 32 == 0
        packed = torch.empty(self.lib.kvgate_amx_linear_packed_size(N, K), dtype=torch.bfloat16)
        self.lib.kvgate_amx_linear_pack(weight.data_ptr(), N, K, int(pairs), packed.data_ptr())
        return packed

    def linear(
        self, x: torch.Tensor, packed: torch.Tensor, out_features: int, bias: torch.Tensor | None, mode: int = PLAIN
    ) -> torch.Tensor:
        """x [M, K] bf16 (unit stride on K) @ W^T + bias -> [M, N] bf16; with SILU_MUL (a pairs-packed
        [gate; up] weight) SiLU(gate) * up, [M, N/2], rounded as FusedOps.silu_mul rounds."""
        assert x.dtype == torch.bfloat16 and x.dim() == 2 and x.stride(1) == 1
        M, K = x.shape
        out = torch.empty(M, out_features // 2 if mode == SILU_MUL else out_features, dtype=torch.bfloat16)
        if M == 0:
            return out
        rc = self.lib.kvgate_amx_linear(
            x.data_ptr(), x.stride(0), M, K, packed.data_ptr(), out_features,
            None if bias is None else bias.data_ptr(), out.data_ptr(), mode, torch.get_num_threads(),
        )  # fmt: skip
        if rc != 0:
            raise RuntimeError(f"AMX linear kernel failed ({rc})")
        return out
