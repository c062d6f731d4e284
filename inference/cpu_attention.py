"""The paged CPU attention kernel (csrc/paged_attention.c): built once per machine, called through ctypes.

The kernel is plain C with no Python or torch headers, so it compiles in about a
second with the system C compiler. It is built on first use into the kvgate cache
dir, keyed by the source and the CPU, under a lock. If no compiler is available the
engine falls back to torch's own attention kernels (and loses batch invariance).
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import structlog
import torch

log = structlog.get_logger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "paged_attention.c"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-std=c11"]


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
    ]


def _cpu_key() -> str:
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "")
    return hashlib.sha256((SOURCE.read_bytes().hex() + flags + platform.machine()).encode()).hexdigest()[:16]


def _build(out: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            subprocess.run([compiler, *CFLAGS, str(SOURCE), "-o", tmp, "-lm"], check=True, capture_output=True)
            os.rename(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


@cache
def _library(cache_dir: str) -> ctypes.CDLL | None:
    path = Path(cache_dir) / "kernels" / f"paged_attention-{_cpu_key()}.so"
    try:
        if not path.exists():
            _build(path)
        lib = ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning("cpu_attention_unavailable", error=str(exc), detail=detail.decode(errors="replace")[-500:])
        return None
    lib.kvgate_paged_attention.argtypes = [ctypes.POINTER(_Args)]
    lib.kvgate_paged_attention.restype = ctypes.c_int
    lib.kvgate_uses_avx512bf16.argtypes = [ctypes.POINTER(_Args)]
    lib.kvgate_uses_avx512bf16.restype = ctypes.c_int
    return lib


@dataclass(frozen=True)
class RowLayout:
    """Per-step metadata shared by every layer: where each query row belongs."""

    row_seq: torch.Tensor  # int32 [T]
    row_pos: torch.Tensor  # int32 [T]
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks]


class CpuPagedAttention:
    """Causal attention of packed query rows over the paged pool, in one C call per layer."""

    def __init__(self, lib: ctypes.CDLL) -> None:
        self.lib = lib

    @classmethod
    def load(cls, cache_dir: Path) -> CpuPagedAttention | None:
        lib = _library(str(cache_dir))
        return None if lib is None else cls(lib)

    def supports(self, dtype: torch.dtype, head_dim: int, block_size: int) -> bool:
        return dtype in (torch.float32, torch.bfloat16) and head_dim <= 256 and block_size <= 64

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
        )
