"""Whether a call's arguments fit its tool's JSON schema: the check that lets an untagged JSON reply count as a call.

Structural only: types, enum and const, required and additional properties, items, and the
anyOf/oneOf/allOf combinators. String patterns and formats are not checked (a tenant's
pattern run by Python's backtracking `re` on model output is a way to stall the gateway),
nor are `$ref`s followed; both count as fitting. Work is bounded by a step budget, so a
hostile schema (deep anyOf nests) costs at most that many steps, and a check over its
budget does not fit: the reply stays text.
"""

from __future__ import annotations

from typing import Any

MAX_STEPS = 20_000

_TYPES: dict[str, Any] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "object": lambda v: isinstance(v, dict),
    "array": lambda v: isinstance(v, list),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "integer": lambda v: (isinstance(v, int) and not isinstance(v, bool)) or (isinstance(v, float) and v.is_integer()),
}


class _OverBudget(Exception):
    pass


def arguments_fit(arguments: Any, schema: Any, *, max_steps: int = MAX_STEPS) -> bool:
    """True when `arguments` is valid for `schema` as far as the structural checks go."""
    budget = [max_steps]
    try:
        return _fits(arguments, schema, budget)
    except _OverBudget:
        return False


def _fits(value: Any, schema: Any, budget: list[int]) -> bool:
    budget[0] -= 1
    if budget[0] < 0:
        raise _OverBudget
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict) or "$ref" in schema:
        return True
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(_TYPES.get(k, lambda _v: True)(value) for k in kinds if isinstance(k, str)):
            return False
    if "const" in schema and not _same(value, schema["const"]):
        return False
    if isinstance(schema.get("enum"), list) and not any(_same(value, option) for option in schema["enum"]):
        return False
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches and not any(_fits(value, b, budget) for b in branches):
            return False
    if isinstance(schema.get("allOf"), list) and not all(_fits(value, b, budget) for b in schema["allOf"]):
        return False
    if isinstance(value, dict):
        return _object_fits(value, schema, budget)
    if isinstance(value, list) and isinstance(schema.get("items"), dict | bool):
        return all(_fits(item, schema["items"], budget) for item in value)
    return True


def _object_fits(value: dict[str, Any], schema: dict[str, Any], budget: list[int]) -> bool:
    required = schema.get("required")
    if isinstance(required, list) and any(isinstance(k, str) and k not in value for k in required):
        return False
    properties = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            if not _fits(item, properties[key], budget):
                return False
        elif not _fits(item, extra, budget):
            return False
    return True


def _same(a: Any, b: Any) -> bool:
    # JSON equality: true is not 1.
    return type(a) is type(b) and a == b if isinstance(a, bool) or isinstance(b, bool) else a == b
