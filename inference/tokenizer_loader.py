"""The tokenizer and served model id alone, without the weights: what a gateway in front of remote engines needs.

The gateway renders chat templates and tokenizes itself, so with KVGATE_ENGINES set to engine
URLs it loads only this, from the same KVGATE_MODEL (and KVGATE_SERVED_MODEL_NAME) the engines
run: a checkpoint dir's tokenizer files, or a bundled model's. A bundled model not yet converted
has its tokenizer read from the GGUF once and kept under the cache dir (no weights converted).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from inference.bundled_models import BUNDLED_MODELS
from inference.settings import EngineSettings


def served_model_id(settings: EngineSettings) -> str:
    """The model id an engine with these settings serves (its /v1/models id)."""
    if settings.served_model_name:
        return settings.served_model_name
    bundled = BUNDLED_MODELS.get(settings.model)
    return bundled.name if bundled is not None else Path(settings.model).expanduser().name


def load_tokenizer(settings: EngineSettings) -> tuple[Any, str]:
    """(tokenizer, served model id) for KVGATE_MODEL; FileNotFoundError naming the fix when it is neither kind."""
    from transformers import AutoTokenizer

    bundled = BUNDLED_MODELS.get(settings.model)
    if bundled is None:
        path = Path(settings.model).expanduser()
        if not (path / "config.json").exists():
            names = ", ".join(BUNDLED_MODELS)
            raise FileNotFoundError(
                f"KVGATE_MODEL={settings.model!r} is neither a bundled model ({names}) nor a checkpoint dir"
            )
        return AutoTokenizer.from_pretrained(path, local_files_only=True), served_model_id(settings)
    models = settings.cache_dir / "models"
    converted = models / bundled.checkpoint_dir
    if (converted / "config.json").exists():
        return AutoTokenizer.from_pretrained(converted, local_files_only=True), served_model_id(settings)
    only = models / f"{bundled.checkpoint_dir}.tokenizer"
    if not (only / "tokenizer_config.json").exists():
        _extract_tokenizer(bundled, only)
    return AutoTokenizer.from_pretrained(only, local_files_only=True), served_model_id(settings)


def _extract_tokenizer(bundled: Any, out: Path) -> None:
    from transformers import AutoTokenizer

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "tokenizer_config.json").exists():
            return
        with tempfile.TemporaryDirectory(prefix=f".{out.name}-", dir=out.parent) as scratch:
            gguf = bundled.gguf_path(Path(scratch))
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            tmp = Path(scratch) / "tokenizer"
            tokenizer.save_pretrained(tmp)
            shutil.rmtree(out, ignore_errors=True)
            os.rename(tmp, out)
