"""Untagged calls count only when their arguments fit the tool's schema: each check from both sides."""

from __future__ import annotations

import time

import pytest

from gateway.tools.arguments_fit import arguments_fit

CASES = [
    ({"type": "integer"}, 3, 3.5),
    ({"type": "integer"}, 2.0, True),
    ({"type": "number"}, 1.5, "1.5"),
    ({"type": ["string", "null"]}, None, 1),
    ({"const": True}, True, 1),
    ({"enum": ["a", 1]}, 1, "b"),
    ({"type": "object", "required": ["a"]}, {"a": 1}, {"b": 1}),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}, {"a": "x"}, {"c": 1}),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, {"x": 1}, {"x": "1"}),
    ({"type": "array", "items": {"type": "integer"}}, [1, 2], [1, "2"]),
    ({"anyOf": [{"type": "string"}, {"type": "integer"}]}, 5, 5.5),
    ({"allOf": [{"required": ["a"]}, {"required": ["b"]}]}, {"a": 1, "b": 2}, {"a": 1}),
    (False, None, None),
]


@pytest.mark.parametrize(("schema", "fits", "does_not"), CASES)
def test_each_check_admits_a_fitting_value_and_refuses_one_that_is_not(schema, fits, does_not) -> None:
    if schema is not False:
        assert arguments_fit(fits, schema)
    assert not arguments_fit(does_not, schema)


def test_patterns_formats_and_refs_are_not_run() -> None:
    # A tenant's regex is never run on model output (catastrophic backtracking), and refs are not followed.
    assert arguments_fit({"s": "a" * 40 + "!"}, {"properties": {"s": {"type": "string", "pattern": "^(a+)+$"}}})
    assert arguments_fit({"s": 1}, {"properties": {"s": {"$ref": "#/$defs/x"}}})


def _nest(leaf: object, depth: int) -> dict:
    value: dict = {"a": leaf}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_a_hostile_schema_costs_a_bounded_number_of_steps() -> None:
    # Two identical branches per level: a value that fails at the bottom would be tried on
    # 2^30 paths; the budget stops it, and the same schema still admits a fitting value.
    schema: dict = {"type": "object"}
    for _ in range(30):
        schema = {"anyOf": [{"type": "object", "properties": {"a": schema}, "required": ["a"]}] * 2}
    started = time.perf_counter()
    assert not arguments_fit(_nest(1, 30), schema)
    assert time.perf_counter() - started < 2.0
    assert arguments_fit(_nest({}, 30), schema)
