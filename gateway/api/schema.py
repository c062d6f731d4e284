"""The OpenAPI description of bodies that routes read themselves.

The completion routes take the Request and parse their JSON body on their own
terms (gateway.api.body), so FastAPI does not know their body model. Each names it
with openapi_extra=json_body(Model), which puts the request body into its
operation; install_body_schemas adds the models' schemas to the components, named
as FastAPI would have named them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

REF_TEMPLATE = "#/components/schemas/{model}"

_BODY_MODELS: dict[str, type[BaseModel]] = {}


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """openapi_extra for a route whose JSON body is `model`, read by the route itself."""
    _BODY_MODELS[model.__name__] = model
    schema = {"$ref": REF_TEMPLATE.format(model=model.__name__)}
    return {"requestBody": {"content": {"application/json": {"schema": schema}}, "required": True}}


def install_body_schemas(app: FastAPI) -> None:
    """Make app.openapi() include the schemas of every json_body model."""
    generate: Callable[[], dict[str, Any]] = app.openapi

    def openapi() -> dict[str, Any]:
        schema = generate()
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name, definition in _body_definitions().items():
            existing = components.setdefault(name, definition)
            if existing != definition:
                raise RuntimeError(f"two different OpenAPI schemas are named {name!r}")
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def _body_definitions() -> dict[str, Any]:
    models = sorted(_BODY_MODELS.values(), key=lambda m: m.__name__)
    _, top = models_json_schema([(m, "validation") for m in models], ref_template=REF_TEMPLATE)
    return top.get("$defs", {})
