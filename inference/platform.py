"""Which kernels the engine runs: one pure function of the CPU, the device, the dtype and the settings.

`plan_kernels` returns a frozen KernelPlan: the dtype, the attention backend, the linears of
prompt rows and of decode rows, the fused-ops version, and the ISA variant of each C kernel.
Everything else follows it: the engine loads what the plan names (inference/kernels.py), logs
it in `engine_ready`, serves it on /kv/info and /metrics, and hashes it whole into the shared
tier's and the disk tier's keys, so two engines share KV only if they compute it the same way.

Every C kernel is built once per ISA variant it has, with the explicit flags below (never
-march=native), the way ggml's CPU backend builds its variants; the plan picks, per kernel, the
best variant this CPU runs (KVGATE_KERNEL_ISA caps it, for A/B runs and tests). The variants
are the x86-64 psABI levels plus bf16 and AMX:

    generic     x86-64                 any x86-64
    avx2        x86-64-v3              AVX2 + FMA (Zen2/3, Haswell on)
    avx512bf16  x86-64-v4 + bf16       AVX-512 with avx512_bf16 (Zen4, Cooper Lake)
    amx         + AMX tiles            Sapphire Rapids on

Other architectures (aarch64) run no C kernels. CUDA has a place here (ATTENTION_CUDA) that a
Triton backend fills; until then a CUDA engine runs torch's SDPA and linears.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform as _platform
import shutil
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Literal

ISA_ORDER = ("generic", "avx2", "avx512bf16", "amx")
Isa = Literal["generic", "avx2", "avx512bf16", "amx"]

# The /proc/cpuinfo flags each variant's compiler flags assume ("abm" is how Linux names LZCNT,
# "pni" SSE3). A variant runs on a CPU that has all of them.
_V2 = frozenset({"cx16", "lahf_lm", "popcnt", "pni", "sse4_1", "sse4_2", "ssse3"})
_V3 = _V2 | {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
_V4 = _V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
ISA_REQUIRES: dict[str, frozenset[str]] = {
    "generic": frozenset(),
    "avx2": _V3,
    "avx512bf16": _V4 | {"avx512_bf16"},
    "amx": _V4 | {"avx512_bf16", "amx_tile", "amx_bf16"},
}
ISA_CFLAGS: dict[str, tuple[str, ...]] = {
    "generic": ("-march=x86-64", "-mtune=generic"),
    "avx2": ("-march=x86-64-v3",),
    "avx512bf16": ("-march=x86-64-v4", "-mavx512bf16"),
    "amx": ("-march=x86-64-v4", "-mavx512bf16", "-mamx-tile", "-mamx-bf16"),
}
# The variants each C kernel (inference/csrc/<name>.c) has code for; a build for any other
# variant would run a lesser one's code under another name.
KERNEL_VARIANTS: dict[str, tuple[str, ...]] = {
    "paged_attention": ("generic", "avx2", "avx512bf16", "amx"),
    "fused_ops": ("generic", "avx2", "avx512bf16"),
    "decode_linear": ("avx2", "avx512bf16"),
    "amx_linear": ("amx",),
}
# Attention of float32 pools: the avx512bf16 and amx builds serve bf16 pools only (their float32
# path is the generic loop), so float32 engines take the avx2 build wherever it runs.
_ATTENTION_FLOAT32_BEST = "avx2"

ATTENTION_CPU = "cpu_paged"  # csrc/paged_attention.c, reading the pool in place
ATTENTION_TORCH = "torch_sdpa"  # gather, then torch's SDPA (not batch-invariant)
ATTENTION_CUDA = "cuda_paged"  # the CUDA backend's place: not built yet, so never planned
PLAN_VERSION = 1  # bumped when what a plan field means changes


@dataclass(frozen=True)
class CpuInfo:
    """What the plan needs to know of the CPU: its architecture and /proc/cpuinfo flags."""

    arch: str  # platform.machine(): x86_64, aarch64, ...
    flags: frozenset[str] = frozenset()

    def runs(self, isa: str) -> bool:
        return self.arch in ("x86_64", "AMD64") and ISA_REQUIRES[isa] <= self.flags


@dataclass(frozen=True)
class KernelSettings:
    """The settings that choose kernels (EngineSettings fields of the same names)."""

    attention_backend: Literal["auto", "cpu_kernel", "torch"] = "auto"
    decode_linear: Literal["auto", "onednn"] = "auto"
    linear_amx: bool = True
    attention_amx: bool = True
    kernel_isa: Literal["auto", "generic", "avx2", "avx512bf16", "amx"] = "auto"

    @classmethod
    def of(cls, settings: object) -> KernelSettings:
        return cls(**{name: getattr(settings, name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class KernelPlan:
    """Which kernel computes which rows. Two engines with equal plans (and weights) compute the same KV."""

    device: str  # "cpu" or "cuda"
    dtype: str  # torch dtype name: "bfloat16", "float32", "float16"
    attention: str  # ATTENTION_CPU or ATTENTION_TORCH
    prompt_linear: str  # "amx" (csrc/amx_linear.c), "onednn_packed" (prepacked bf16) or "torch"
    decode_linear: str  # "prompt" (as prompt rows), "decode_bf16" or "exact_blocks" (csrc/decode_linear.c)
    fused_ops: int  # FUSED_OPS_VERSION, or 0 for transformers' modules
    fused_forward: bool  # the decoder stack without transformers' plumbing (inference/models/llama.py)
    isa: tuple[tuple[str, str], ...] = field(default=())  # (C kernel, variant) for each kernel loaded
    version: int = PLAN_VERSION

    def variant(self, kernel: str) -> str | None:
        return dict(self.isa).get(kernel)

    def describe(self) -> dict[str, object]:
        out = asdict(self)
        out["isa"] = dict(self.isa)
        return out

    def labels(self) -> dict[str, str]:
        """The plan as flat strings (Prometheus labels), its digest included."""
        out = {k: str(v) for k, v in self.describe().items() if k != "isa"}
        out["isa"] = ",".join(f"{k}={v}" for k, v in self.isa)
        out["digest"] = self.digest()
        return out

    def digest(self) -> str:
        """A hash of the whole plan, for the KV tiers' keys."""
        return hashlib.sha256(json.dumps(self.describe(), sort_keys=True).encode()).hexdigest()[:16]

    def __str__(self) -> str:
        isa = ",".join(f"{k}={v}" for k, v in self.isa) or "none"
        return (
            f"{self.device}/{self.dtype} attention={self.attention} prompt_linear={self.prompt_linear} "
            f"decode_linear={self.decode_linear} fused_ops={self.fused_ops} fused_forward={self.fused_forward} "
            f"isa[{isa}]"
        )


def resolve_dtype(setting: str, device: str, cpu: CpuInfo) -> str:
    """auto: bfloat16 on CUDA and on CPUs with avx512_bf16 or AMX (where oneDNN has a bf16 path), else float32."""
    if setting != "auto":
        return setting
    if device == "cuda" or "avx512_bf16" in cpu.flags or "amx_bf16" in cpu.flags:
        return "bfloat16"
    return "float32"


def onednn_has_bf16(cpu: CpuInfo) -> bool:
    """Whether oneDNN has a bf16 matmul here (AVX-512 core or AVX-NE-CONVERT), as
    torch.ops.mkldnn._is_mkldnn_bf16_supported() says on the machine itself."""
    return cpu.runs("generic") and (cpu.flags >= _V4 - _V3 or "avx_ne_convert" in cpu.flags)


def best_variant(kernel: str, cpu: CpuInfo, cap: str = "amx") -> str | None:
    """The most capable variant of a C kernel that this CPU runs, at most cap; None if none."""
    allowed = ISA_ORDER[: ISA_ORDER.index(cap) + 1]
    usable = [isa for isa in KERNEL_VARIANTS[kernel] if isa in allowed and cpu.runs(isa)]
    return usable[-1] if usable else None


def plan_kernels(
    cpu: CpuInfo,
    *,
    device: str,
    dtype: str,
    settings: KernelSettings,
    compiler: bool = True,
    fused_ops_version: int = 0,
    head_dim: int = 64,
    block_size: int = 16,
) -> KernelPlan:
    """The plan for this CPU, device, dtype (or "auto") and settings; pure, so it can be table-tested.

    compiler: whether a C compiler is there to build the kernels (without one, torch's kernels).
    fused_ops_version: inference.fused_ops.FUSED_OPS_VERSION (passed in so this module imports no torch).
    """
    dtype = resolve_dtype(dtype, device, cpu)
    if device != "cpu":
        # The CUDA backend's place (ATTENTION_CUDA): until it is built, torch's kernels.
        if settings.attention_backend == "cpu_kernel":
            raise ValueError("KVGATE_ATTENTION_BACKEND=cpu_kernel runs on the CPU only")
        return KernelPlan(device, dtype, ATTENTION_TORCH, "torch", "prompt", 0, False)
    cap = ISA_ORDER[-1] if settings.kernel_isa == "auto" else settings.kernel_isa
    if settings.kernel_isa != "auto" and not cpu.runs(settings.kernel_isa):
        raise ValueError(f"KVGATE_KERNEL_ISA={settings.kernel_isa}: this CPU does not run it")
    native = compiler and cpu.runs("generic")
    isa: dict[str, str] = {}

    attention = ATTENTION_TORCH
    kernel_fits = dtype in ("float32", "bfloat16") and head_dim <= 256 and block_size <= 64
    if settings.attention_backend != "torch" and native and kernel_fits:
        attention_cap = cap
        if dtype == "float32":
            attention_cap = _lower(cap, _ATTENTION_FLOAT32_BEST)
        elif not settings.attention_amx:
            attention_cap = _lower(cap, "avx512bf16")
        variant = best_variant("paged_attention", cpu, attention_cap)
        if variant is not None:
            attention, isa["paged_attention"] = ATTENTION_CPU, variant
    if settings.attention_backend == "cpu_kernel" and attention != ATTENTION_CPU:
        why = "no C compiler" if not compiler else "this CPU or model"
        raise ValueError(f"KVGATE_ATTENTION_BACKEND=cpu_kernel but the kernel cannot serve {why}")

    bf16_packed = dtype == "bfloat16" and onednn_has_bf16(cpu)
    amx = native and bf16_packed and settings.linear_amx and best_variant("amx_linear", cpu, cap) is not None
    prompt_linear = "amx" if amx else "onednn_packed" if bf16_packed else "torch"
    if amx:
        isa["amx_linear"] = "amx"

    fused = 0
    if native and fused_ops_version and (bf16_packed or dtype == "float32"):
        variant = best_variant("fused_ops", cpu, cap)
        if variant is not None:
            fused, isa["fused_ops"] = fused_ops_version, variant

    # Decode rows have a kernel of their own where the prompt rows' linear is slow for a step's
    # few rows: oneDNN's bf16 (avx512_bf16 without AMX) and MKL's float32 (exact GGUF blocks, AVX2).
    # With AMX the AMX linear is as fast for them, and one copy of the weights.
    decode_linear = "prompt"
    if fused and attention == ATTENTION_CPU and settings.decode_linear == "auto":
        if prompt_linear == "onednn_packed" and best_variant("decode_linear", cpu, cap) == "avx512bf16":
            decode_linear, isa["decode_linear"] = "decode_bf16", "avx512bf16"
        elif dtype == "float32" and (variant := best_variant("decode_linear", cpu, cap)) is not None:
            decode_linear, isa["decode_linear"] = "exact_blocks", variant

    return KernelPlan(
        device="cpu",
        dtype=dtype,
        attention=attention,
        prompt_linear=prompt_linear,
        decode_linear=decode_linear,
        fused_ops=fused,
        fused_forward=bool(fused) and attention == ATTENTION_CPU,
        isa=tuple(sorted(isa.items())),
    )


def _lower(a: str, b: str) -> str:
    return a if ISA_ORDER.index(a) <= ISA_ORDER.index(b) else b


def this_cpu() -> CpuInfo:
    """This machine's CpuInfo, from /proc/cpuinfo (no flags where there is none), less the AMX flags
    where Linux refuses this process the tiles (a guest may list amx_tile and refuse)."""
    cpuinfo = Path("/proc/cpuinfo")
    flags: frozenset[str] = frozenset()
    if cpuinfo.exists():
        line = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith(("flags", "Features"))), "")
        flags = frozenset(line.partition(":")[2].split())
    if "amx_tile" in flags and not _amx_permitted():
        flags = frozenset(f for f in flags if not f.startswith("amx"))
    return CpuInfo(arch=_platform.machine(), flags=flags)


_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18


@cache
def _amx_permitted() -> bool:
    if _platform.system() != "Linux" or _platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_SYS_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


def find_compiler() -> str | None:
    """The C compiler the kernels are built with: $CC, else cc or gcc on PATH."""
    return os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")


def have_compiler() -> bool:
    return find_compiler() is not None
