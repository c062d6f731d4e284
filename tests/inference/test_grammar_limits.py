"""Grammars are bounded in size and time and compile off the event loop (issue 25, item 1).

Each limit is checked from both sides: a schema just inside it compiles, one just over it
is an InvalidRequestError naming it.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time

import pytest

from inference.async_engine import AsyncEngine
from inference.grammar import (
    MAX_ENUM_VALUES,
    MAX_GRAMMAR_CHARS,
    MAX_OBJECT_PROPERTIES,
    MAX_SCHEMA_BRANCHES,
    MAX_SCHEMA_DEPTH,
    MAX_SCHEMA_NODES,
    GrammarLimitError,
    check_structured,
)
from inference.settings import EngineSettings
from inference.types import CacheSpec, EngineOverloadedError, FairShare, SamplingParams, StructuredOutput
from tests.inference.helpers import random_prompt


def _spec(schema: object) -> StructuredOutput:
    return StructuredOutput("json_schema", json.dumps(schema))


def _object(n: int, tag: str = "p") -> dict:
    return {"type": "object", "properties": {f"{tag}{i}": {"type": "integer"} for i in range(n)}}


def _nested(depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


LIMITS = [
    pytest.param(
        _object(MAX_OBJECT_PROPERTIES), _object(MAX_OBJECT_PROPERTIES + 1), "properties in one object", id="properties"
    ),
    pytest.param(
        {"anyOf": [{"const": i} for i in range(MAX_SCHEMA_BRANCHES)]},
        {"anyOf": [{"const": i} for i in range(MAX_SCHEMA_BRANCHES + 1)]},
        "anyOf has",
        id="branches",
    ),
    pytest.param(
        {"enum": list(range(MAX_ENUM_VALUES))}, {"enum": list(range(MAX_ENUM_VALUES + 1))}, "enum has", id="enum"
    ),
    # Each nesting level is two JSON values (the array schema and its "items").
    pytest.param(_nested(MAX_SCHEMA_DEPTH // 2 - 1), _nested(MAX_SCHEMA_DEPTH), "nests deeper", id="depth"),
    pytest.param(
        {"type": "object", "properties": {f"o{j}": _object(200, f"o{j}_") for j in range(MAX_SCHEMA_NODES // 500)}},
        {"type": "object", "properties": {f"o{j}": _object(200, f"o{j}_") for j in range(MAX_SCHEMA_NODES // 300)}},
        "values",
        id="nodes",
    ),
]


@pytest.mark.parametrize(("inside", "over", "named"), LIMITS)
def test_each_schema_limit_admits_what_is_inside_it_and_names_itself_when_passed(inside, over, named) -> None:
    check_structured(_spec(inside))
    with pytest.raises(GrammarLimitError, match=named):
        check_structured(_spec(over))


def test_a_grammar_over_its_length_is_refused_and_one_inside_compiles() -> None:
    rule = 'start: "a" | "b"\n'
    check_structured(StructuredOutput("grammar", rule + "// " + "x" * (MAX_GRAMMAR_CHARS - len(rule) - 10) + "\n"))
    with pytest.raises(GrammarLimitError, match="characters"):
        check_structured(StructuredOutput("grammar", rule + "// " + "x" * MAX_GRAMMAR_CHARS + "\n"))


def test_the_issue_schema_is_refused_before_any_compiling() -> None:
    started = time.perf_counter()
    with pytest.raises(GrammarLimitError, match="10000 properties"):
        check_structured(_spec(_object(10_000)))
    assert time.perf_counter() - started < 1.0  # a walk of the schema, not a 15-second compile


@pytest.fixture
async def engine(tiny_llama_dir):
    eng = AsyncEngine(
        EngineSettings(
            model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.02, max_waiting=20, max_waiting_per_tenant=4
        )
    )
    await eng.start()
    yield eng
    await eng.shutdown()


def _heavy(tag: str) -> SamplingParams:
    """Inside every limit, and about half a second of compiling (4,000 properties in 10 objects)."""
    schema = {
        "type": "object",
        "properties": {f"o{j}{tag}": _object(400, f"p{j}{tag}_") for j in range(10)},
    }
    return SamplingParams(max_tokens=2, temperature=0, structured=_spec(schema))


async def _loop_turns(stop: asyncio.Event) -> int:
    turns = 0
    while not stop.is_set():
        await asyncio.sleep(0.005)
        turns += 1
    return turns


async def test_compiling_runs_on_a_thread_and_the_loop_keeps_turning(engine: AsyncEngine, monkeypatch) -> None:
    # Which thread compiled, and how often the loop turned meanwhile: a compile on the loop
    # would run on the loop's thread and hold it for the whole compile (a turn or two per
    # compile). Wall-clock lag bounds are not used: on 2 busy cores the loop thread waits
    # for a core however the compiles run.
    structured = engine.core.structured
    compile_threads: list[int] = []
    real_compile = structured.compile

    def compile_and_note(spec):
        compile_threads.append(threading.get_ident())
        return real_compile(spec)

    monkeypatch.setattr(structured, "compile", compile_and_note)
    stop = asyncio.Event()
    turns = asyncio.create_task(_loop_turns(stop))
    await asyncio.sleep(0)  # the counter is running before the first compile starts
    started = time.perf_counter()
    await asyncio.gather(*(engine.prepare(_heavy(f"t{i}"), share=FairShare(f"t{i}")) for i in range(3)))
    compile_s = time.perf_counter() - started
    stop.set()
    loop_turns = await turns
    assert all(structured.is_compiled(_heavy(f"t{i}").structured) for i in range(3))
    assert len(compile_threads) == 3
    assert threading.get_ident() not in compile_threads  # never on the loop's thread
    # The compiles took a while, and the loop kept turning through them.
    assert compile_s > 0.2, compile_s
    assert loop_turns >= 10, (loop_turns, compile_s)
    out = await engine.generate(random_prompt(random.Random(1), 20), _heavy("t0"))
    assert out.finish_reason in ("stop", "length")


async def test_a_compile_over_its_time_is_a_400_and_its_tenant_waits_for_it(tiny_llama_dir) -> None:
    eng = AsyncEngine(
        EngineSettings(model=str(tiny_llama_dir), dtype="float32", kv_cache_gib=0.02, grammar_compile_timeout_s=0.05)
    )
    await eng.start()
    try:
        with pytest.raises(GrammarLimitError, match="KVGATE_GRAMMAR_COMPILE_TIMEOUT_S"):
            await eng.prepare(_heavy("slow"), share=FairShare("a"))
        # The same tenant's next compile waits for the one still running, and times out too;
        # another tenant's small schema compiles at once.
        with pytest.raises(GrammarLimitError):
            await eng.prepare(_heavy("slow2"), share=FairShare("a"))
        small = SamplingParams(max_tokens=2, structured=_spec({"type": "object"}))
        await eng.prepare(small, share=FairShare("b"))
        assert eng.core.structured.is_compiled(small.structured)
    finally:
        await eng.shutdown()


async def test_one_tenant_fills_only_its_own_share_of_the_waiting_queue(engine: AsyncEngine) -> None:
    long = SamplingParams(max_tokens=100, temperature=0, ignore_eos=True)
    prompt = random_prompt(random.Random(2), 200)
    handles = []
    with pytest.raises(EngineOverloadedError, match="this tenant"):
        for _ in range(20):
            handles.append(engine.submit(prompt, long, CacheSpec(), share=FairShare("flooder")))
    # Another tenant still gets in while the flooder is refused.
    other = engine.submit(prompt, SamplingParams(max_tokens=2, temperature=0), CacheSpec(), share=FairShare("other"))
    assert (await other.result()).finish_reason == "length"
    for handle in handles:
        handle.cancel()
    await asyncio.gather(*(h.result() for h in handles))
