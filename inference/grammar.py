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
# What one schema may hold. Compiling grows faster than linearly in a schema's size (on a
# Zen4 core: 500 optional properties 0.06 s, 2,000 0.6 s, 10,000 15 s), and an object of
# more than about 500 optional properties fails llguidance's row limit mid-generation
# anyway, so these keep every schema that passes to well under a second of compiling.
# OpenAI's structured outputs set limits of the same kind (5,000 properties, 1,000 enum values).
MAX_SCHEMA_NODES = 10_000  # every JSON value in the schema, keys' values and array items included
MAX_SCHEMA_DEPTH = 64
MAX_OBJECT_PROPERTIES = 400  # in any one "properties" object
MAX_SCHEMA_BRANCHES = 1_000  # items of any one anyOf / oneOf / allOf / prefixItems
MAX_ENUM_VALUES = 2_000
MAX_GRAMMAR_CHARS = 100_000  # a Lark grammar's text
# llguidance's resource limits, lower than its defaults where a hostile regex spends them:
# `(a{1000}){1000}` took 1-2 s of lexer work in its first mask and `a{100000}` 30 ms a token
# with the defaults; with these both fail at once (a 400), and every schema in the tests passes.
# verbose_errors=False keeps the grammar's own text out of error messages (and so out of logs).
PARSER_LIMITS = llguidance.LLParserLimits(initial_lexer_fuel=500_000, step_lexer_fuel=100_000, verbose_errors=False)


class GrammarLimitError(InvalidRequestError):
    """A schema or grammar over one of the limits above, or one whose compiling ran out of time."""


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
        check_schema_size(schema)
        try:
            return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_OPTIONS)
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(f"invalid JSON schema: {exc}") from exc
    if spec.kind == "grammar":
        if len(spec.value) > MAX_GRAMMAR_CHARS:
            raise GrammarLimitError(f"the grammar has {len(spec.value)} characters; the most is {MAX_GRAMMAR_CHARS}")
        return llguidance.LLMatcher.grammar_from_lark(spec.value)
    raise InvalidRequestError(f"unknown structured output kind {spec.kind!r}")


def check_schema_size(schema: object) -> None:
    """GrammarLimitError naming the first limit a parsed JSON schema exceeds; a walk of its values, no recursion."""
    nodes = 0
    stack: list[tuple[object, int, str | None]] = [(schema, 0, None)]
    while stack:
        value, depth, key = stack.pop()
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise GrammarLimitError(f"the JSON schema has more than {MAX_SCHEMA_NODES} values, the most allowed")
        if depth > MAX_SCHEMA_DEPTH:
            raise GrammarLimitError(f"the JSON schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        if isinstance(value, dict):
            if key == "properties" and len(value) > MAX_OBJECT_PROPERTIES:
                raise GrammarLimitError(
                    f"the JSON schema has {len(value)} properties in one object; the most is {MAX_OBJECT_PROPERTIES}"
                )
            stack.extend((item, depth + 1, name if isinstance(name, str) else None) for name, item in value.items())
        elif isinstance(value, list):
            if key in ("anyOf", "oneOf", "allOf", "prefixItems") and len(value) > MAX_SCHEMA_BRANCHES:
                raise GrammarLimitError(f"{key} has {len(value)} branches; at most {MAX_SCHEMA_BRANCHES} are allowed")
            if key == "enum" and len(value) > MAX_ENUM_VALUES:
                raise GrammarLimitError(f"enum has {len(value)} values; at most {MAX_ENUM_VALUES} are allowed")
            stack.extend((item, depth + 1, None) for item in value)


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
        error = llguidance.LLMatcher.validate_grammar(grammar_for(spec), limits=PARSER_LIMITS)
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
