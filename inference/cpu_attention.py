"""The paged CPU attention kernel (csrc/paged_attention.c), called through ctypes.

It is built once per ISA variant by inference/native.py; the kernel plan (inference/platform.py)
says which variant runs, or torch's own attention where there is no C compiler (and then the
engine loses batch invariance).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import torch

from inference.native import load_library


class _Args(ctypes.Structure):
    _fields_ = [
        ("q", ctypes.c_void_p),
        ("q_stride_t", ctypes.c_int64),
        ("q_stride_h", ctypes.c_int64),
        ("k_cache", ctypes.c_void_p),
        ("v_cache", ctypes.c_void_p),
        ("block_tables", ctypes.c_void_p),
        ("table_stride", ctypes.c_int64),
        ("row_seq", ctypes.c_void_p),
        ("row_pos", ctypes.c_void_p),
        ("out", ctypes.c_void_p),
        ("T", ctypes.c_int64),
        ("H", ctypes.c_int64),
        ("KVH", ctypes.c_int64),
        ("D", ctypes.c_int64),
        ("block_size", ctypes.c_int64),
        ("scale", ctypes.c_float),
        ("is_bf16", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("num_decode", ctypes.c_int64),
    ]


def _library(cache_dir: str, isa: str) -> ctypes.CDLL:
    lib = load_library("paged_attention", cache_dir, isa)
    lib.kvgate_paged_attention.argtypes = [ctypes.POINTER(_Args)]
    lib.kvgate_paged_attention.restype = ctypes.c_int
    lib.kvgate_uses_avx512bf16.argtypes = [ctypes.POINTER(_Args)]
    lib.kvgate_uses_avx512bf16.restype = ctypes.c_int
    lib.kvgate_uses_amx.argtypes = [ctypes.POINTER(_Args)]
    lib.kvgate_uses_amx.restype = ctypes.c_int
    lib.kvgate_uses_avx2.argtypes = [ctypes.POINTER(_Args)]
    lib.kvgate_uses_avx2.restype = ctypes.c_int
    return lib


@dataclass(frozen=True)
class RowLayout:
    """Per-step metadata shared by every layer: where each query row belongs."""

    row_seq: torch.Tensor  # int32 [T]
    row_pos: torch.Tensor  # int32 [T]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]
    # Rows [0, num_decode) are decode rows (generated tokens' queries): on avx512_bf16 without
    # AMX, and on AVX2 with float32 pools, the kernel gives them their own loop (see
    # tile_decode_row, tile_decode_row_avx2), whatever else is in the call; with AMX every row
    # takes the tiles.
    num_decode: int = 0


class CpuPagedAttention:
    """Causal attention of packed query rows over the paged pool, in one C call per layer."""

    def __init__(self, lib: ctypes.CDLL, isa: str) -> None:
        self.lib = lib
        self.isa = isa

    @classmethod
    def load(cls, cache_dir: Path, isa: str) -> CpuPagedAttention:
        """The kernel built for ISA variant isa (inference/platform.py); KernelBuildError if it does not build."""
        return cls(_library(str(cache_dir), isa), isa)

    def __call__(
        self,
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        layout: RowLayout,
        scale: float,
    ) -> torch.Tensor:
        """query [T, H, D] (any strides with unit stride on D); caches [N, bs, KVH, D] -> [T, H, D]."""
        T, H, D = query.shape
        assert query.stride(2) == 1 and k_cache.is_contiguous() and v_cache.is_contiguous()
        assert query.dtype == k_cache.dtype == v_cache.dtype
        out = torch.empty(T, H, D, dtype=query.dtype)
        args = self._args(query, k_cache, v_cache, layout, out, scale)
        rc = self.lib.kvgate_paged_attention(ctypes.byref(args))
        if rc != 0:
            raise RuntimeError(f"paged attention kernel failed ({rc})")
        return out

    def uses_avx512bf16(self, dtype: torch.dtype, head_dim: int, block_size: int) -> bool:
        args = _Args(D=head_dim, block_size=block_size, is_bf16=int(dtype == torch.bfloat16))
        return bool(self.lib.kvgate_uses_avx512bf16(ctypes.byref(args)))

    def uses_avx2(self, dtype: torch.dtype, head_dim: int, block_size: int, heads_per_kv: int = 1) -> bool:
        """Whether rows run in the AVX2 + FMA kernel here (the avx2 build; head_dim a multiple of 8, blocks of
        up to 16 keys)."""
        args = _Args(D=head_dim, block_size=block_size, is_bf16=int(dtype == torch.bfloat16), H=heads_per_kv, KVH=1)
        return bool(self.lib.kvgate_uses_avx2(ctypes.byref(args)))

    def uses_amx(self, dtype: torch.dtype, head_dim: int, block_size: int) -> bool:
        """Whether prompt rows run on AMX tiles here (bf16, the amx build, and the OS lets this process use them)."""
        args = _Args(D=head_dim, block_size=block_size, is_bf16=int(dtype == torch.bfloat16))
        return bool(self.lib.kvgate_uses_amx(ctypes.byref(args)))

    @staticmethod
    def _args(
        query: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        layout: RowLayout,
        out: torch.Tensor,
        scale: float,
    ) -> _Args:
        T, H, D = query.shape
        return _Args(
            q=query.data_ptr(),
            q_stride_t=query.stride(0),
            q_stride_h=query.stride(1),
            k_cache=k_cache.data_ptr(),
            v_cache=v_cache.data_ptr(),
            block_tables=layout.block_tables.data_ptr(),
            table_stride=layout.block_tables.stride(0),
            row_seq=layout.row_seq.data_ptr(),
            row_pos=layout.row_pos.data_ptr(),
            out=out.data_ptr(),
            T=T,
            H=H,
            KVH=k_cache.shape[2],
            D=D,
            block_size=k_cache.shape[1],
            scale=scale,
            is_bf16=int(query.dtype == torch.bfloat16),
            num_threads=torch.get_num_threads(),
            num_decode=layout.num_decode,
        )
