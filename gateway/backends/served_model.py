"""The model a gateway serves through remote engines: its id, tokenizer and chat template, no weights."""

from __future__ import annotations

from typing import Any

from inference.settings import EngineSettings


class ServedModel:
    """The tokenizer side of the engines' model, shared by every HttpEngine of a pool."""

    def __init__(self, model_id: str, tokenizer: Any) -> None:
        self.model_id = model_id
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, settings: EngineSettings | None = None) -> ServedModel:
        """KVGATE_MODEL's tokenizer and KVGATE_SERVED_MODEL_NAME (or the model's name) as the id."""
        from inference.tokenizer_loader import load_tokenizer

        tokenizer, model_id = load_tokenizer(settings or EngineSettings())
        return cls(model_id, tokenizer)

    def apply_chat_template(self, messages: list[dict[str, Any]], *, tools: list[dict[str, Any]] | None = None) -> str:
        """As inference.AsyncEngine.apply_chat_template: the engines render the same way."""
        kwargs: dict[str, Any] = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
