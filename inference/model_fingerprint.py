"""A model's fingerprint: equal for two engines whose KV blocks are interchangeable, different otherwise.

A block computed by one engine may be loaded by another only if it would have computed
the very same bytes: the same weights, config and dtype, and the same numerics (device
type with its ISA or GPU model, the engine's kernel plan, torch version). The shared KV tier keys every block by
this fingerprint (with the layout and the salted block hash), so a different model, a
re-quantized or fine-tuned checkpoint under the same name, another dtype or another
kernel reads nothing, instead of reading KV that would make warm output differ from cold.

The weights are hashed from the checkpoint's files (xxh3-128 over their bytes, from the
page cache, where loading just put them: 0.28 s for SmolLM2's 538 MB on this 2-core
machine under load), not from the tensors in memory: bf16 linears on CPU are repacked
into oneDNN's opaque layout.
"""

from __future__ import annotations

from pathlib import Path

import torch
import xxhash

from inference.platform import ISA_ORDER, this_cpu

# Files whose bytes decide the KV a model computes; the tokenizer's do not (token ids are hashed).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_CONFIG_FILES = ("config.json",)
_READ_CHUNK = 16 * 2**20


def model_fingerprint(path: Path, *, dtype: torch.dtype, device: torch.device, compute: str) -> str:
    """Hex digest of the checkpoint at path as this engine runs it.

    compute names what else decides the numbers (the engine passes its kernel plan's digest,
    inference/platform.py): engines that differ there compute different KV from the same weights.
    """
    digest = xxhash.xxh3_128()
    identity = f"kvgate-model/v1|{dtype}|{_hardware(device)}|torch={torch.__version__}|{compute}"
    digest.update(identity.encode())
    files = sorted(p for p in Path(path).iterdir() if p.is_file() and _counts(p))
    if not files:
        raise ValueError(f"no config or weight files in {path}")
    for file in files:
        digest.update(f"|{file.name}|{file.stat().st_size}|".encode())
        with open(file, "rb") as f:
            while chunk := f.read(_READ_CHUNK):
                digest.update(chunk)
    return digest.hexdigest()


def _hardware(device: torch.device) -> str:
    """The kernel family the device runs: torch's GEMMs pick different kernels (and roundings) per ISA or GPU
    model. On CPUs that is the best ISA variant this CPU runs (platform.ISA_ORDER): torch's capability
    string reads "AVX512" on AMX and non-AMX CPUs alike, whose oneDNN matmuls differ."""
    if device.type == "cuda":
        return f"cuda|{torch.cuda.get_device_name(device)}"
    cpu = this_cpu()
    top = next((isa for isa in reversed(ISA_ORDER) if cpu.runs(isa)), "none")
    return f"{device.type}|{cpu.arch}|{top}|{torch.backends.cpu.get_cpu_capability()}"


def _counts(path: Path) -> bool:
    return path.name in _CONFIG_FILES or path.suffix in _WEIGHT_SUFFIXES
