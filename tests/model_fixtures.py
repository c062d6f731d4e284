"""Test checkpoints: tiny random-weight Llama and Qwen2 models with SmolLM2's tokenizer, built from configs.

They are written once per machine under the kvgate cache dir (atomically, under a
lock) because extracting the tokenizer from the GGUF takes a few seconds.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

import torch

from inference.model_loader import bundled_gguf_path
from inference.settings import EngineSettings

TINY_COMMON = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 49152,
    "max_position_embeddings": 4096,
    "initializer_range": 0.1,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
}
TINY_VERSION = "v1"


def test_models_root() -> Path:
    return EngineSettings().cache_dir / "test-models"


def build_tiny_model(kind: str) -> Path:
    """A tiny random model of the given family (llama, qwen2, mistral), seeded so every build is identical."""
    from transformers import (
        AutoTokenizer,
        LlamaConfig,
        LlamaForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    root = test_models_root()
    out = root / f"tiny-{kind}-{TINY_VERSION}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "config.json").exists():
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=root))
        try:
            torch.manual_seed(1234)
            if kind == "llama":
                model = LlamaForCausalLM(LlamaConfig(**TINY_COMMON))
            elif kind == "qwen2":
                model = Qwen2ForCausalLM(Qwen2Config(**TINY_COMMON, rope_theta=1_000_000.0))
            elif kind == "mistral":
                model = MistralForCausalLM(MistralConfig(**TINY_COMMON, sliding_window=None))
            else:
                raise ValueError(kind)
            model.save_pretrained(tmp)
            gguf = bundled_gguf_path()
            AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(tmp)
            os.rename(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def quantize_q4_1(weight: torch.Tensor) -> torch.Tensor:
    """float32 [N, K] -> the float32 weights a GGUF loader gets back from its Q4_1 blocks
    (ggml's quantize_row_q4_1_ref, then d * q + m in float32)."""
    blocks = weight.float().reshape(weight.shape[0], -1, 32)
    lo, hi = blocks.amin(-1, keepdim=True), blocks.amax(-1, keepdim=True)
    d = (hi - lo) / 15
    inv = torch.where(d > 0, 1 / d, 0)
    q = ((blocks - lo) * inv + 0.5).floor().clamp(max=15)
    return (d.half().float() * q + lo.half().float()).reshape(weight.shape)


def quantize_q8_0(weight: torch.Tensor) -> torch.Tensor:
    """float32 [N, K] -> the float32 weights a GGUF loader gets back from its Q8_0 blocks."""
    blocks = weight.float().reshape(weight.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, blocks / d, 0).round()
    return (d.half().float() * q).reshape(weight.shape)


def build_tiny_quantized_llama() -> Path:
    """The tiny llama with its decoder linears as Q4_1 and its LM head as Q8_0 weights (float32),
    as a GGUF model loads: what the decode kernel's exact blocks serve."""
    from transformers import AutoTokenizer, LlamaForCausalLM

    source = build_tiny_model("llama")
    out = test_models_root() / f"tiny-llama-q4_1-{TINY_VERSION}"
    with open(test_models_root() / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "config.json").exists():
            return out
        model = LlamaForCausalLM.from_pretrained(source, torch_dtype=torch.float32)
        with torch.no_grad():
            for layer in model.model.layers:
                for linear in (*layer.self_attn.children(), *layer.mlp.children()):
                    if isinstance(linear, torch.nn.Linear):
                        linear.weight.copy_(quantize_q4_1(linear.weight))
            model.lm_head.weight.copy_(quantize_q8_0(model.lm_head.weight))
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
        try:
            model.save_pretrained(tmp)
            AutoTokenizer.from_pretrained(source).save_pretrained(tmp)
            os.rename(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out
