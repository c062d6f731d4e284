"""Fixtures shared by every test package: the test models."""

from __future__ import annotations

from inference.cpu_threads import set_openmp_defaults

# Before torch loads: the engines under test wait at OpenMP barriers as kvgate's do, so a
# busy neighbour on a small machine (other tests, other work) slows them down fairly.
set_openmp_defaults()

from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from tests.model_fixtures import build_tiny_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny_llama_dir() -> Path:
    return build_tiny_model("llama")


@pytest.fixture(scope="session")
def tiny_qwen2_dir() -> Path:
    return build_tiny_model("qwen2")


@pytest.fixture(scope="session")
def tiny_mistral_dir() -> Path:
    return build_tiny_model("mistral")


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The real SmolLM2-135M-Instruct, converted from the bundled GGUF on first use."""
    from inference.model_loader import resolve_model_dir
    from inference.settings import EngineSettings

    path, _ = resolve_model_dir(EngineSettings())
    return path


@pytest.fixture(scope="session")
def tiny_llama_q4_1_dir() -> Path:
    from tests.model_fixtures import build_tiny_quantized_llama

    return build_tiny_quantized_llama()
