"""The kernel plan (inference/platform.py) as a pure function: each kind of machine kvgate runs on gets its plan."""

from __future__ import annotations

import pytest

from inference.platform import (
    ATTENTION_CPU,
    ATTENTION_TORCH,
    ISA_ORDER,
    CpuInfo,
    KernelPlan,
    KernelSettings,
    best_variant,
    onednn_has_bf16,
    plan_kernels,
    resolve_dtype,
    this_cpu,
)

BASE = "fpu sse sse2 cx8 cmov mmx fxsr syscall nx lm"
V2 = BASE + " cx16 lahf_lm popcnt pni sse4_1 sse4_2 ssse3"
V3 = V2 + " avx avx2 bmi1 bmi2 f16c fma abm movbe xsave"
V4 = V3 + " avx512f avx512bw avx512cd avx512dq avx512vl avx512_vnni"
MACHINES = {
    "generic x86-64": CpuInfo("x86_64", frozenset(BASE.split())),
    "AVX2-only EPYC (Zen3)": CpuInfo("x86_64", frozenset(V3.split())),
    "Skylake-X (AVX-512, no bf16)": CpuInfo("x86_64", frozenset(V4.split())),
    "Zen4 (avx512_bf16)": CpuInfo("x86_64", frozenset((V4 + " avx512_bf16 avx512ifma").split())),
    "AMX Xeon": CpuInfo("x86_64", frozenset((V4 + " avx512_bf16 amx_bf16 amx_tile amx_int8 avx512_fp16").split())),
    "aarch64": CpuInfo("aarch64", frozenset(["fp", "asimd", "evtstrm", "aes", "crc32", "atomics", "bf16"])),
}
AUTO = KernelSettings()
FUSED = 2


def plan(machine: str, dtype: str = "auto", settings: KernelSettings = AUTO, **kw) -> KernelPlan:
    return plan_kernels(MACHINES[machine], device="cpu", dtype=dtype, settings=settings, fused_ops_version=FUSED, **kw)


# machine, dtype (auto), attention variant, prompt linear, decode linear, {kernel: variant}
EXPECTED = [
    ("generic x86-64", "float32", "generic", "torch", "prompt", {"fused_ops": "generic"}),
    (
        "AVX2-only EPYC (Zen3)",
        "float32",
        "avx2",
        "torch",
        "exact_blocks",
        {"fused_ops": "avx2", "decode_linear": "avx2"},
    ),
    (
        "Skylake-X (AVX-512, no bf16)",
        "float32",
        "avx2",
        "torch",
        "exact_blocks",
        {"fused_ops": "avx2", "decode_linear": "avx2"},
    ),
    (
        "Zen4 (avx512_bf16)",
        "bfloat16",
        "avx512bf16",
        "onednn_packed",
        "decode_bf16",
        {"fused_ops": "avx512bf16", "decode_linear": "avx512bf16"},
    ),
    ("AMX Xeon", "bfloat16", "amx", "amx", "prompt", {"fused_ops": "avx512bf16", "amx_linear": "amx"}),
]


@pytest.mark.parametrize(("machine", "dtype", "attention", "prompt", "decode", "others"), EXPECTED)
def test_each_kind_of_x86_machine_gets_its_plan(machine, dtype, attention, prompt, decode, others):
    p = plan(machine)
    assert p.device == "cpu" and p.dtype == dtype
    assert p.attention == ATTENTION_CPU and p.variant("paged_attention") == attention
    assert (p.prompt_linear, p.decode_linear) == (prompt, decode)
    assert p.fused_ops == FUSED and p.fused_forward
    assert dict(p.isa) == {"paged_attention": attention, **others}


def test_aarch64_runs_no_c_kernels():
    p = plan("aarch64")
    assert (p.dtype, p.attention, p.prompt_linear, p.decode_linear, p.fused_ops, p.isa) == (
        "float32",
        ATTENTION_TORCH,
        "torch",
        "prompt",
        0,
        (),
    )
    assert not p.fused_forward


def test_cuda_runs_torch_kernels_until_its_backend_is_built():
    p = plan_kernels(MACHINES["AMX Xeon"], device="cuda", dtype="auto", settings=AUTO, fused_ops_version=FUSED)
    assert (p.device, p.dtype, p.attention, p.prompt_linear, p.isa) == (
        "cuda",
        "bfloat16",
        ATTENTION_TORCH,
        "torch",
        (),
    )
    with pytest.raises(ValueError, match="CPU only"):
        plan_kernels(
            MACHINES["AMX Xeon"], device="cuda", dtype="auto", settings=KernelSettings(attention_backend="cpu_kernel")
        )


def test_float32_on_an_amx_xeon_takes_the_avx2_attention_and_exact_blocks():
    p = plan("AMX Xeon", dtype="float32")
    assert p.variant("paged_attention") == "avx2"  # the bf16 builds serve float32 pools with the generic loop
    assert (p.prompt_linear, p.decode_linear, p.variant("decode_linear")) == ("torch", "exact_blocks", "avx512bf16")


def test_the_amx_switches_change_the_plan_and_its_digest():
    amx = plan("AMX Xeon")
    no_linear = plan("AMX Xeon", settings=KernelSettings(linear_amx=False))
    assert (no_linear.prompt_linear, no_linear.decode_linear) == ("onednn_packed", "decode_bf16")
    assert no_linear.variant("amx_linear") is None and no_linear.variant("paged_attention") == "amx"
    no_attention = plan("AMX Xeon", settings=KernelSettings(attention_amx=False))
    assert no_attention.variant("paged_attention") == "avx512bf16" and no_attention.prompt_linear == "amx"
    assert len({amx.digest(), no_linear.digest(), no_attention.digest()}) == 3
    assert plan("AMX Xeon").digest() == amx.digest()  # the same inputs, the same plan


def test_kernel_isa_caps_every_kernel_and_must_be_one_the_cpu_runs():
    p = plan("AMX Xeon", settings=KernelSettings(kernel_isa="avx2"))
    assert p.dtype == "bfloat16" and p.prompt_linear == "onednn_packed"
    assert dict(p.isa) == {"paged_attention": "avx2", "fused_ops": "avx2"}  # no bf16 decode kernel below avx512bf16
    generic = plan("AMX Xeon", dtype="float32", settings=KernelSettings(kernel_isa="generic"))
    assert dict(generic.isa) == {"paged_attention": "generic", "fused_ops": "generic"}
    assert generic.decode_linear == "prompt"
    with pytest.raises(ValueError, match="does not run it"):
        plan("AVX2-only EPYC (Zen3)", settings=KernelSettings(kernel_isa="avx512bf16"))


def test_without_a_compiler_or_with_torch_attention_no_c_kernel_runs():
    p = plan("Zen4 (avx512_bf16)", compiler=False)
    assert (p.attention, p.prompt_linear, p.decode_linear, p.fused_ops, p.isa) == (
        ATTENTION_TORCH,
        "onednn_packed",  # torch's own oneDNN path needs no compiler
        "prompt",
        0,
        (),
    )
    torch_attention = plan("Zen4 (avx512_bf16)", settings=KernelSettings(attention_backend="torch"))
    assert torch_attention.attention == ATTENTION_TORCH and not torch_attention.fused_forward
    assert torch_attention.decode_linear == "prompt"  # decode rows need the CPU kernel (rows in any order)
    with pytest.raises(ValueError, match="no C compiler"):
        plan("Zen4 (avx512_bf16)", compiler=False, settings=KernelSettings(attention_backend="cpu_kernel"))


def test_a_head_dim_or_block_the_kernel_cannot_take_falls_back_to_torch():
    assert plan("Zen4 (avx512_bf16)", head_dim=512).attention == ATTENTION_TORCH
    assert plan("Zen4 (avx512_bf16)", block_size=128).attention == ATTENTION_TORCH
    assert plan("Zen4 (avx512_bf16)", head_dim=64, block_size=16).attention == ATTENTION_CPU


def test_every_plan_field_is_in_the_digest():
    base = plan("Zen4 (avx512_bf16)")
    seen = {base.digest()}
    for name, value in [("dtype", "float32"), ("fused_ops", 0), ("decode_linear", "prompt"), ("isa", ())]:
        changed = KernelPlan(**{**base.__dict__, name: value})
        seen.add(changed.digest())
    assert len(seen) == 5


def test_dtype_and_onednn_rules():
    assert resolve_dtype("auto", "cpu", MACHINES["AVX2-only EPYC (Zen3)"]) == "float32"
    assert resolve_dtype("auto", "cpu", MACHINES["Zen4 (avx512_bf16)"]) == "bfloat16"
    assert resolve_dtype("float32", "cpu", MACHINES["AMX Xeon"]) == "float32"
    assert resolve_dtype("auto", "cuda", MACHINES["aarch64"]) == "bfloat16"
    assert not onednn_has_bf16(MACHINES["AVX2-only EPYC (Zen3)"])
    assert onednn_has_bf16(MACHINES["Skylake-X (AVX-512, no bf16)"])
    assert best_variant("amx_linear", MACHINES["Zen4 (avx512_bf16)"]) is None
    assert best_variant("paged_attention", MACHINES["AMX Xeon"], cap="avx2") == "avx2"


def test_this_machines_facts_agree_with_torch():
    import torch

    cpu = this_cpu()
    assert onednn_has_bf16(cpu) == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert [isa for isa in ISA_ORDER if cpu.runs(isa)] == list(ISA_ORDER[: len([i for i in ISA_ORDER if cpu.runs(i)])])


def test_a_model_the_fused_ops_do_not_serve_loads_none_of_them():
    p = plan_kernels(MACHINES["Zen4 (avx512_bf16)"], device="cpu", dtype="auto", settings=AUTO, fused_ops_version=0)
    assert p.fused_ops == 0 and p.variant("fused_ops") is None and not p.fused_forward
    assert p.decode_linear == "prompt"  # the decode kernel rides on the fused layers
    assert plan("Zen4 (avx512_bf16)").variant("fused_ops") == "avx512bf16"  # paired positive
