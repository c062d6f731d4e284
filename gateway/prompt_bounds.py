"""Cheap upper bounds that refuse hopeless prompts before any tokenizing.

A prompt fits when it renders to at most max_model_len - 1 tokens. If no token of
the tokenizer covers more than L characters of text, a rendered text of more than
L x (max_model_len - 1) characters needs at least max_model_len tokens: it cannot
fit, and saying so costs a len(). In JSON each character takes at most 12 bytes
(an astral character as two \\u escapes), so a body larger than 12 x that
character bound, plus an allowance for the fields that are not rendered, cannot
hold a fitting prompt either: that one is refused from its Content-Length alone.

Both bounds are only as good as "a token covers at most L characters", so they are
derived from the tokenizer's own definition, and switched off (None) wherever that
cannot be shown:

- the model is BPE that can spell any text in its vocabulary (byte-level, or with
  byte fallback): no unknown-token piece covers a run of characters;
- L is the longest vocabulary entry or added token, in characters (a byte-level
  entry has one character per byte, and a byte covers at most one character);
- nothing before the model shrinks the text: the normalizer and pre-tokenizer
  only replace characters one for one or more, or split; no added token strips
  the whitespace around it;
- for the body bound, the chat template puts message text into the prompt
  verbatim (checked at start-up with a probe), so that the request's text is
  part of the rendered text.

The body bound assumes the body is not padded: JSON whitespace, over-long number
spellings and the fields the template does not render (stop sequences, metadata)
share NON_PROMPT_ALLOWANCE bytes.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Bytes a body may spend on what the template does not render, beyond 12 per prompt character.
NON_PROMPT_ALLOWANCE = 1024 * 1024
JSON_BYTES_PER_CHAR = 12

_SHRINK_FREE_NORMALIZERS = {"Prepend", "Append", "NFD", "NFKD", "Lowercase", "Replace", "Sequence"}
_SHRINK_FREE_PRE_TOKENIZERS = {"ByteLevel", "Metaspace", "Split", "Digits", "Punctuation", "Sequence"}


@dataclass(frozen=True)
class PromptBounds:
    """max_chars: rendered prompts longer than this cannot fit; max_body_bytes: nor can bodies larger than this.

    Either is None when it could not be shown safe for this model (why_not says why).
    """

    max_chars: int | None
    max_body_bytes: int | None
    chars_per_token: int | None
    why_not: str | None = None


NO_BOUNDS = PromptBounds(max_chars=None, max_body_bytes=None, chars_per_token=None, why_not="not derived")


def derive_bounds(
    *, tokenizer: Any, max_model_len: int, apply_chat_template: Callable[..., str] | None
) -> PromptBounds:
    """The bounds for one model, or bounds of None where its tokenizer or template rule them out."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return PromptBounds(None, None, None, "not a fast (Rust) tokenizer")
    try:
        spec = json.loads(backend.to_str())
    except (ValueError, TypeError) as exc:
        return PromptBounds(None, None, None, f"tokenizer definition unreadable: {exc}")
    problem = _shrinking_step(spec)
    if problem is not None:
        return PromptBounds(None, None, None, problem)
    chars_per_token = _longest_token_chars(spec)
    max_chars = chars_per_token * max(0, max_model_len - 1)
    if apply_chat_template is None or not template_keeps_text(apply_chat_template):
        return PromptBounds(max_chars, None, chars_per_token, "the chat template does not keep message text verbatim")
    max_body = JSON_BYTES_PER_CHAR * max_chars + NON_PROMPT_ALLOWANCE
    return PromptBounds(max_chars, max_body, chars_per_token)


def _shrinking_step(spec: dict[str, Any]) -> str | None:
    """Why this tokenizer could turn many characters into one token, or None if it cannot."""
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        return f"model type {model.get('type')!r} may map a run of unknown characters to one token"
    byte_level = _has_type(spec.get("pre_tokenizer"), "ByteLevel")
    if not byte_level and not model.get("byte_fallback"):
        return "BPE without byte-level encoding or byte fallback may drop or fuse unknown characters"
    for name, step, allowed in (
        ("normalizer", spec.get("normalizer"), _SHRINK_FREE_NORMALIZERS),
        ("pre-tokenizer", spec.get("pre_tokenizer"), _SHRINK_FREE_PRE_TOKENIZERS),
    ):
        bad = _shrinking_part(step, allowed)
        if bad is not None:
            return f"the {name} step {bad!r} may shorten the text"
    for token in spec.get("added_tokens") or []:
        if token.get("lstrip") or token.get("rstrip"):
            return f"added token {token.get('content')!r} absorbs the whitespace around it"
    return None


def _has_type(step: dict[str, Any] | None, kind: str) -> bool:
    if not step:
        return False
    if step.get("type") == kind:
        return True
    children = step.get("normalizers") or step.get("pretokenizers") or []
    return any(_has_type(child, kind) for child in children)


def _shrinking_part(step: dict[str, Any] | None, allowed: set[str]) -> str | None:
    if not step:
        return None
    kind = step.get("type")
    if kind not in allowed:
        return kind
    if kind == "Sequence":
        for child in step.get("normalizers") or step.get("pretokenizers") or []:
            bad = _shrinking_part(child, allowed)
            if bad is not None:
                return bad
    if kind == "Replace":
        pattern = step.get("pattern") or {}
        # A regex may match any length; a fixed string replaced by something no shorter cannot shrink.
        if "String" not in pattern or len(step.get("content", "")) < len(pattern["String"]):
            return "Replace"
    if kind in ("Split", "Punctuation") and str(step.get("behavior", "")).lower() == "removed":
        return f"{kind}(removed)"
    return None


def _longest_token_chars(spec: dict[str, Any]) -> int:
    vocab = (spec.get("model") or {}).get("vocab") or {}
    longest = max((len(piece) for piece in vocab), default=1)
    added = max((len(t.get("content", "")) for t in spec.get("added_tokens") or []), default=1)
    return max(1, longest, added)


def template_keeps_text(apply_chat_template: Callable[..., str]) -> bool:
    """Whether the template puts each message's content into the prompt as it is (no trimming, no escaping)."""
    probes = [f" \n\t kvgate probe {i} <&'\"> \t\n " for i in range(3)]
    for messages in (
        [{"role": "system", "content": probes[0]}, {"role": "user", "content": probes[1]}],
        [
            {"role": "user", "content": probes[1]},
            {"role": "assistant", "content": probes[2]},
            {"role": "user", "content": probes[1]},
        ],
    ):
        try:
            rendered = apply_chat_template(messages)
        except Exception:  # a template that refuses a probe conversation proves nothing either way
            return False
        if not all(m["content"] in rendered for m in messages):
            return False
    return True
