"""Incremental detokenization with stop strings, held back while they might still match."""

from __future__ import annotations

from typing import Any


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decoding the whole output each step would be quadratic; decoding tokens one by one
    breaks multi-byte characters and tokenizers that merge spaces. Like vLLM, we decode
    a short window and only emit text once it no longer ends in a partial character.
    Text that could be the start of a stop string is held back until it cannot be.
    """

    def __init__(self, tokenizer: Any, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.token_ids: list[int] = []
        self.text = ""
        self.emitted = 0
        self.prefix_offset = 0
        self.read_offset = 0
        self.stop_sequence: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> None:
        """Append one token; sets stop_sequence (and truncates the text) if a stop string appeared."""
        self.token_ids.append(token_id)
        prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
        full = self._decode(self.token_ids[self.prefix_offset :])
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return
        before = len(self.text)
        self.text += full[len(prefix) :]
        self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)
        if self.stop:
            self._check_stop(before)

    def _check_stop(self, before: int) -> None:
        window_start = max(0, before - self.hold)
        best: tuple[int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, window_start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is not None:
            self.text = self.text[: best[0]]
            self.stop_sequence = best[1]

    def take_delta(self, final: bool) -> str:
        """The text not yet emitted; while not final, the last few characters are held back."""
        if final and self.stop_sequence is None and self.read_offset < len(self.token_ids):
            # Flush a trailing partial character rather than dropping it.
            before = len(self.text)
            prefix = self._decode(self.token_ids[self.prefix_offset : self.read_offset])
            self.text += self._decode(self.token_ids[self.prefix_offset :])[len(prefix) :]
            self.read_offset = len(self.token_ids)
            if self.stop:
                self._check_stop(before)
        end = len(self.text) if final or self.stop_sequence else max(self.emitted, len(self.text) - self.hold)
        delta = self.text[self.emitted : end]
        self.emitted = end
        return delta
