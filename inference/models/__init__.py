"""The engine's own model forwards, by architecture: `llama.py` serves llama, qwen2 and mistral.

Each runs the decoder stack of a loaded transformers model whose layers the fused ops replaced
(inference/fused_ops.py), the same ops in the same order as transformers' forward, without its
module plumbing. Where the kernel plan has no fused forward (`KernelPlan.fused_forward`: CUDA,
no C compiler, torch attention) or the architecture has none, the transformers model's own
forward is the fallback. The engine's exactness does not depend on which runs: both are
bit-identical (tests/inference/test_fused_forward.py).
"""
