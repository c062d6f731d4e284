"""The C kernels a KernelPlan names, built and loaded for the variants it names.

This is the one place that turns a plan (inference/platform.py) into loaded libraries: the
engine asks for `load_kernels(plan, ...)` and hands the result to its ModelRunner, and the
modules that wrap each kernel (cpu_attention, fused_ops, decode_linear, amx_linear) never
decide for themselves whether, or which variant, to load.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from inference.amx_linear import AmxLinearKernel
from inference.cpu_attention import CpuPagedAttention
from inference.decode_linear import DecodeKernel
from inference.fused_ops import FUSED_OPS_VERSION, FusedOps, fusable
from inference.native import KernelBuildError
from inference.platform import (
    ATTENTION_CPU,
    KernelPlan,
    KernelSettings,
    have_compiler,
    plan_kernels,
    this_cpu,
)

if TYPE_CHECKING:
    from inference.model_loader import LoadedModel
    from inference.settings import EngineSettings


@dataclass(frozen=True)
class Kernels:
    """The plan and what it loaded: None for a kernel the plan does not use."""

    plan: KernelPlan
    attention: CpuPagedAttention | None = None
    fused: FusedOps | None = None
    decode: DecodeKernel | None = None
    amx: AmxLinearKernel | None = None


def plan_for(settings: EngineSettings, loaded: LoadedModel, *, head_dim: int) -> KernelPlan:
    """The kernel plan of this machine for a loaded model (platform.plan_kernels on this CPU's facts)."""
    return plan_kernels(
        this_cpu(),
        device=loaded.device.type,
        dtype=str(loaded.dtype).removeprefix("torch."),
        settings=KernelSettings.of(settings),
        compiler=have_compiler(),
        fused_ops_version=FUSED_OPS_VERSION if fusable(loaded.model) else 0,
        head_dim=head_dim,
        block_size=settings.block_size,
    )


def load_kernels(plan: KernelPlan, cache_dir: Path, *, decode_spin_us: int | None = None) -> Kernels:
    """Build (once per machine) and load every C kernel of the plan; KernelBuildError if one fails."""
    attention = fused = decode = amx = None
    if plan.attention == ATTENTION_CPU:
        attention = CpuPagedAttention.load(cache_dir, _variant(plan, "paged_attention"))
    if plan.fused_ops:
        fused = FusedOps.load(cache_dir, _variant(plan, "fused_ops"))
    if plan.decode_linear != "prompt":
        decode = DecodeKernel.load(cache_dir, _variant(plan, "decode_linear"), spin_us=decode_spin_us)
        want = decode.bf16 if plan.decode_linear == "decode_bf16" else decode.blocks
        if not want:
            raise KernelBuildError(f"decode_linear ({plan.variant('decode_linear')}) lacks {plan.decode_linear}")
    if plan.prompt_linear == "amx":
        amx = AmxLinearKernel.load(cache_dir)
        if amx is None:
            raise KernelBuildError("amx_linear built, but this process may not use the AMX tiles")
    return Kernels(plan, attention, fused, decode, amx)


def _variant(plan: KernelPlan, kernel: str) -> str:
    variant = plan.variant(kernel)
    assert variant is not None, f"the plan uses {kernel} but names no variant of it"
    return variant
