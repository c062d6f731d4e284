"""The tokenizer alone (a gateway in front of remote engines): the engines' model id, no weights loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from inference.model_loader import resolve_model_dir
from inference.settings import EngineSettings
from inference.tokenizer_loader import load_tokenizer, served_model_id


def test_a_checkpoint_dirs_tokenizer_and_id(tiny_llama_dir: Path) -> None:
    settings = EngineSettings(model=str(tiny_llama_dir))
    tokenizer, model_id = load_tokenizer(settings)
    assert model_id == resolve_model_dir(settings)[1] == tiny_llama_dir.name
    assert tokenizer.encode("Hello there", add_special_tokens=False)
    renamed = EngineSettings(model=str(tiny_llama_dir), served_model_name="served-as")
    assert served_model_id(renamed) == resolve_model_dir(renamed)[1] == "served-as"


def test_a_bundled_models_tokenizer_without_converting_it(tmp_path: Path, tiny_llama_dir: Path) -> None:
    settings = EngineSettings(model="SmolLM2-135M-Instruct", cache_dir=tmp_path)
    tokenizer, model_id = load_tokenizer(settings)
    assert model_id == "SmolLM2-135M-Instruct"
    assert not (tmp_path / "models" / "SmolLM2-135M-Instruct-Q4_1").exists()  # no weights converted
    kept = list((tmp_path / "models").glob("*.tokenizer"))
    assert len(kept) == 1 and (kept[0] / "tokenizer_config.json").exists()
    # The test models carry SmolLM2's tokenizer: the same ids; and a second load reads the kept copy.
    reference, _ = load_tokenizer(EngineSettings(model=str(tiny_llama_dir)))
    text = "Do you fix brakes?"
    assert tokenizer.encode(text) == reference.encode(text)
    again, _ = load_tokenizer(settings)
    assert again.encode(text) == reference.encode(text)


def test_an_unknown_model_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="neither a bundled model"):
        load_tokenizer(EngineSettings(model=str(tmp_path / "nothing-here")))
