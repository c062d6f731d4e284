"""KVGATE_ENGINES: embedded, or engine URLs with optional weights; bad values are one clear error."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from gateway.backends.engine_list import EngineSpec, parse_engines
from gateway.serve import _invalid_settings
from gateway.settings import GatewaySettings


def test_embedded_is_the_default() -> None:
    assert GatewaySettings().engines == "embedded"
    assert GatewaySettings().engine_specs is None
    assert parse_engines(" Embedded ") is None


def test_urls_with_optional_weights() -> None:
    specs = parse_engines("http://127.0.0.1:8001=2, http://10.0.0.6:8001/ ,https://engine.example=0.5")
    assert specs == (
        EngineSpec("http://127.0.0.1:8001", 2.0),
        EngineSpec("http://10.0.0.6:8001", 1.0),
        EngineSpec("https://engine.example", 0.5),
    )
    assert GatewaySettings(engines="http://127.0.0.1:8001").engine_specs == (EngineSpec("http://127.0.0.1:8001"),)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "empty"),
        ("http://a:1,,http://b:1", "empty item"),
        ("http://a:1=x", "not a number"),
        ("http://a:1=0", "positive"),
        ("http://a:1=-1", "positive"),
        ("http://a:1=inf", "positive"),
        ("127.0.0.1:8001", "not an http(s) URL"),
        ("ftp://a:1", "not an http(s) URL"),
        ("http://a:1?x=1", "query"),
        ("http://a:99999", "bad port"),
        ("http://a:1,http://a:1/", "more than once"),
    ],
)
def test_bad_values_are_refused_clearly(value: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_engines(value)
    with pytest.raises(ValidationError) as caught:
        GatewaySettings(engines=value)
    assert _invalid_settings(caught.value).startswith("invalid settings: KVGATE_ENGINES:")
    assert message in _invalid_settings(caught.value)


def test_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGATE_ENGINES", "http://127.0.0.1:8001=3,http://127.0.0.1:8002")
    assert GatewaySettings().engine_specs == (
        EngineSpec("http://127.0.0.1:8001", 3.0),
        EngineSpec("http://127.0.0.1:8002"),
    )
    monkeypatch.setenv("KVGATE_ENGINES", "nonsense")
    with pytest.raises(ValidationError, match="not an http"):
        GatewaySettings()
