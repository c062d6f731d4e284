"""From a StructuredOutput to an llguidance grammar, and checking one without a tokenizer.

Imports llguidance but not torch, so the gateway can refuse a bad schema (a 400 naming
the field) while preparing a request, before it reaches the engine.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import llguidance

from inference.types import InvalidRequestError, StructuredOutput

# Compact JSON with Python's default separators: `{"a": 1, "b": [2, 3]}`. No free
# whitespace, so a small model cannot loop on newlines inside a JSON value; a schema may
# still ask for it with "x-guidance": {"whitespace_flexible": true}.
JSON_OPTIONS: llguidance.JsonCompileOptions = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
# Far above any real schema or grammar; the gateway's body limits bound it first.
MAX_SPEC_CHARS = 1_000_000
MAX_ERROR_CHARS = 1000


def grammar_for(spec: StructuredOutput) -> str:
    """llguidance's grammar text for a spec; InvalidRequestError when the value is not what its kind needs."""
    if not isinstance(spec, StructuredOutput):
        raise InvalidRequestError("structured must be a StructuredOutput")
    if not isinstance(spec.value, str) or len(spec.value) > MAX_SPEC_CHARS:
        raise InvalidRequestError(f"a structured output value must be a string of at most {MAX_SPEC_CHARS} characters")
    if spec.kind == "json_object":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if spec.kind == "json_schema":
        try:
            schema = json.loads(spec.value)
        except ValueError as exc:
            raise InvalidRequestError(f"the JSON schema is not valid JSON: {exc}") from exc
        if not isinstance(schema, dict | bool):
            raise InvalidRequestError("a JSON schema must be an object or a boolean")
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"invalid JSON schema: {exc}") from exc
    if spec.kind == "grammar":
        return llguidance.LLMatcher.grammar_from_lark(spec.value)
    raise InvalidRequestError(f"unknown structured output kind {spec.kind!r}")


def lark_json(schema: dict[str, Any] | bool) -> str:
    """`%json {...}` for a Lark grammar, with the same compact JSON as kind "json_schema" gets.

    A bare `%json` in Lark allows free whitespace, which a small model can loop on.
    """
    if isinstance(schema, bool):
        schema = {} if schema else {"not": {}}
    options = schema.get("x-guidance", {})
    return "%json " + json.dumps(
        {**schema, "x-guidance": {**JSON_OPTIONS, **(options if isinstance(options, dict) else {})}}
    )


def is_panic(exc: BaseException) -> bool:
    """A Rust panic inside llguidance (pyo3's PanicException, a BaseException, not an Exception)."""
    return type(exc).__name__ == "PanicException"


@contextmanager
def panics_as(error: Callable[[str], Exception]) -> Iterator[None]:
    """Turn a panic of the grammar library into `error(message)`: seen on odd schemas (an error
    message cut inside a multi-byte character); it must not escape as a BaseException."""
    try:
        yield
    except BaseException as exc:
        if not is_panic(exc):
            raise
        raise error(f"the grammar library failed on it: {str(exc).splitlines()[0][:200]}") from None


def check_structured(spec: StructuredOutput) -> None:
    """Raise InvalidRequestError, with llguidance's reason, for a schema or grammar it cannot enforce.

    Needs no tokenizer; the engine compiles against its tokenizer again when the request arrives.
    """
    with panics_as(lambda message: InvalidRequestError(describe(spec, message))):
        error = llguidance.LLMatcher.validate_grammar(grammar_for(spec))
    if error:
        raise InvalidRequestError(describe(spec, error))


def describe(spec: StructuredOutput, error: str) -> str:
    """The client's error message: llguidance's reason (a caret under the spot, for grammars),
    without the backtrace it appends to a caught panic, and bounded."""
    what = {"json_schema": "JSON schema", "grammar": "grammar", "json_object": "JSON object format"}.get(spec.kind)
    reason = error.split("<backtrace>", 1)[0].strip()
    if len(reason) > MAX_ERROR_CHARS:
        reason = reason[:MAX_ERROR_CHARS] + "..."
    return f"invalid {what or 'structured output'}: {reason}"
