"""Constrained decoding: outputs always match their schema or grammar, even from a random model, and stay exact."""

from __future__ import annotations

import json
import random
import re

import jsonschema_rs
import pytest

from inference.engine import Engine
from inference.grammar import check_structured, lark_json
from inference.structured import StructuredOutputs, unpack_bitmask
from inference.types import CacheSpec, InvalidRequestError, SamplingParams, StructuredOutput
from tests.inference.helpers import checked, random_prompt

EOS = 2  # the tiny models' EOS (SmolLM2's <|im_end|>)

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 2, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "role"],
    "additionalProperties": False,
}
NESTED = {
    "type": "object",
    "properties": {
        "team": {"type": "string", "maxLength": 8},
        "lead": PERSON,
        "members": {"type": "array", "items": PERSON, "minItems": 1, "maxItems": 3},
        "active": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 4},
    },
    "required": ["team", "lead", "members", "active"],
    "additionalProperties": False,
}
ENUMS = {
    "type": "object",
    "properties": {
        "kind": {"const": "point"},
        "quadrant": {"enum": [1, 2, 3, 4]},
        "label": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 4}]},
    },
    "required": ["kind", "quadrant", "label"],
    "additionalProperties": False,
}
# Found by fuzzing: llguidance 1.9.1 panics on it (an error message cut inside a 4-byte character).
PANICS = {
    "$ref": {
        "type": "000000",
        "": {"type": [None, False, 3.001149320889439e84, "000\x1f\r\x0b\x80\U00010000"]},
        "0\x1f\u0800": False,
    }
}
SCHEMAS = {"person": PERSON, "nested": NESTED, "enums": ENUMS}
TOOL_ARGS = {
    "type": "object",
    "properties": {"name": {"const": "get_weather"}, "city": {"type": "string", "minLength": 1, "maxLength": 10}},
    "required": ["name", "city"],
    "additionalProperties": False,
}
TOOL_GRAMMAR = 'start: "<tool_call>\\n" ' + lark_json(TOOL_ARGS) + ' "\\n</tool_call>"'


def schema_spec(schema: dict) -> StructuredOutput:
    return StructuredOutput("json_schema", json.dumps(schema))


def constrained(spec: StructuredOutput, *, temperature: float = 0.0, seed: int | None = None) -> SamplingParams:
    return SamplingParams(max_tokens=400, temperature=temperature, seed=seed, structured=spec)


def prompts(n: int, seed: int = 7) -> list[list[int]]:
    rng = random.Random(seed)
    return [random_prompt(rng, rng.randrange(5, 40)) for _ in range(n)]


def run_together(engine: Engine, requests: dict[str, tuple[list[int], SamplingParams]]) -> dict[str, tuple[int, ...]]:
    for rid, (prompt, params) in requests.items():
        engine.add_request(rid, prompt, params, CacheSpec())
    outputs = {}
    while engine.has_unfinished():
        for out in engine.step():
            if out.finished is not None:
                assert out.finished.finish_reason in ("stop", "length"), out.finished.error
                outputs[out.request_id] = out.finished.token_ids
    return outputs


# -- outputs match ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_outputs_validate_against_their_schema(tiny_engine: Engine, name: str) -> None:
    schema = SCHEMAS[name]
    validator = jsonschema_rs.validator_for(schema)
    for i, prompt in enumerate(prompts(3)):
        for temperature, seed in ((0.0, None), (1.0, i), (0.7, 100 + i)):
            out = checked(
                tiny_engine.generate(prompt, constrained(schema_spec(schema), temperature=temperature, seed=seed))
            )
            assert out.finish_reason == "stop", out.text
            value = json.loads(out.text)
            assert validator.is_valid(value), (out.text, list(validator.iter_errors(value)))
            assert EOS not in out.token_ids[:-1]
    # The same random model without the schema writes no JSON at all: the constraint did the work.
    plain = tiny_engine.generate(prompts(1)[0], SamplingParams(max_tokens=30, temperature=0, ignore_eos=True))
    with pytest.raises(ValueError):
        json.loads(plain.text)


def test_json_object_outputs_are_objects(tiny_engine: Engine) -> None:
    """Any object: a random model rarely closes an unbounded string, but every output that ends is an object."""
    stopped = 0
    for i, prompt in enumerate(prompts(6, seed=3)):
        params = SamplingParams(max_tokens=200, temperature=1.0, seed=i, structured=StructuredOutput("json_object"))
        out = checked(tiny_engine.generate(prompt, params))
        if out.finish_reason == "stop":
            stopped += 1
            assert isinstance(json.loads(out.text), dict), out.text
        else:
            assert out.finish_reason == "length" and out.text.startswith("{")
    assert stopped >= 1


def test_lark_grammar_with_embedded_schema(tiny_engine: Engine) -> None:
    spec = StructuredOutput("grammar", TOOL_GRAMMAR)
    pattern = re.compile(r"<tool_call>\n(.*)\n</tool_call>", re.S)
    for i, prompt in enumerate(prompts(4, seed=11)):
        out = checked(tiny_engine.generate(prompt, constrained(spec, temperature=1.0 if i % 2 else 0.0, seed=i)))
        assert out.finish_reason == "stop"
        match = pattern.fullmatch(out.text)
        assert match, out.text
        args = json.loads(match.group(1))
        assert jsonschema_rs.validator_for(TOOL_ARGS).is_valid(args), args
        assert args["name"] == "get_weather"


def test_grammar_end_stops_without_eos_even_with_ignore_eos(tiny_engine: Engine) -> None:
    params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True, structured=schema_spec(PERSON))
    out = tiny_engine.generate(prompts(1)[0], params)
    assert out.finish_reason == "stop" and out.text.endswith("}")
    assert out.token_ids[-1] != EOS
    assert out.usage.completion_tokens == len(out.token_ids)


def test_max_tokens_cuts_a_grammar_short_with_length(tiny_engine: Engine) -> None:
    params = SamplingParams(max_tokens=3, temperature=0, structured=schema_spec(NESTED))
    out = tiny_engine.generate(prompts(1)[0], params)
    assert out.finish_reason == "length" and len(out.token_ids) == 3
    assert out.text.startswith('{"team":')
    assert tiny_engine.structured.num_live == 0


# -- the mask ----------------------------------------------------------------------------------------


def test_eos_is_allowed_only_where_the_grammar_accepts(tiny_engine: Engine) -> None:
    structured = tiny_engine.structured
    tokenizer = tiny_engine.tokenizer
    spec = schema_spec({"type": "integer"})
    structured.open("r", spec)
    try:

        def allowed() -> set[int]:
            bits = unpack_bitmask(structured.bitmask(["r"]), tiny_engine.vocab_size)[0]
            return set(bits.nonzero().flatten().tolist())

        start = allowed()
        assert EOS not in start  # nothing yet: not a number
        assert tokenizer.encode("4", add_special_tokens=False)[0] in start
        assert tokenizer.encode("x", add_special_tokens=False)[0] not in start
        assert not structured.accept("r", tokenizer.encode("4", add_special_tokens=False)[0])
        assert EOS in allowed()  # "4" is a whole integer; more digits may follow too
        assert structured.accept("r", EOS)  # EOS where it accepts completes the grammar
    finally:
        structured.release("r")
    assert structured.num_live == 0


def test_a_rejected_token_fails_only_its_request(tiny_engine: Engine) -> None:
    tiny_engine.structured.open("x", schema_spec(PERSON))
    with pytest.raises(RuntimeError, match="rejected token"):
        tiny_engine.structured.accept("x", tiny_engine.tokenizer.encode("hello", add_special_tokens=False)[0])
    tiny_engine.structured.release("x")


# -- exactness ---------------------------------------------------------------------------------------


def test_batch_mixing_grammar_and_plain_rows_equals_each_alone(make_engine, tiny_llama_dir) -> None:
    specs = [schema_spec(PERSON), schema_spec(NESTED), StructuredOutput("grammar", TOOL_GRAMMAR), None, None, None]
    requests = {}
    for i, (prompt, spec) in enumerate(zip(prompts(6, seed=21), specs, strict=True)):
        if spec is None:
            params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        else:
            params = constrained(spec, temperature=0.0 if i % 2 == 0 else 0.8, seed=i)
        requests[f"r{i}"] = (prompt, params)
    batched = run_together(make_engine(tiny_llama_dir, enable_prefix_caching=False), requests)
    alone_engine = make_engine(tiny_llama_dir, enable_prefix_caching=False)
    alone = {rid: run_together(alone_engine, {rid: req})[rid] for rid, req in requests.items()}
    assert batched == alone
    texts = {rid: alone_engine.tokenizer.decode(ids, skip_special_tokens=True) for rid, ids in alone.items()}
    assert json.loads(texts["r0"])["role"] in ("admin", "user", "guest")
    assert len(alone["r3"]) == 24  # the plain rows ran their full length beside the grammar rows


def test_prefix_cache_is_shared_between_grammar_and_plain_requests(tiny_engine: Engine) -> None:
    prompt = prompts(1, seed=5)[0] + list(range(300, 340))
    first = checked(tiny_engine.generate(prompt, SamplingParams(max_tokens=2, temperature=0)))
    second = checked(tiny_engine.generate(prompt, constrained(schema_spec(PERSON))))
    assert first.usage.cached_tokens == 0
    assert second.usage.cached_tokens == (len(prompt) - 1) // 16 * 16 > 0


def test_plain_batches_do_no_mask_work(tiny_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> None:
        raise AssertionError("masked a batch without grammars")

    monkeypatch.setattr(tiny_engine.structured, "apply", refuse)
    out = tiny_engine.generate(prompts(1)[0], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    assert out.finish_reason == "length"
    assert tiny_engine.structured._ll_tokenizer is None  # not even the vocabulary was built


# -- errors and lifetimes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (StructuredOutput("json_schema", "{not json"), "not valid JSON"),
        (StructuredOutput("json_schema", '{"type": "strin"}'), "Invalid type: strin"),
        (StructuredOutput("json_schema", '{"type": "array", "uniqueItems": true}'), "uniqueItems"),
        (StructuredOutput("json_schema", '{"$ref": "#/$defs/missing"}'), "does not exist"),
        (StructuredOutput("json_schema", "[1, 2]"), "must be an object"),
        (StructuredOutput("grammar", "start: undefined_rule"), "unknown name"),
        (StructuredOutput("grammar", 'start: "a" %json {"type": "nope"}'), "nope"),
        (StructuredOutput("regex", "a+"), "unknown structured output kind"),  # type: ignore[arg-type]
        # A panic inside llguidance is a clear refusal too, never a BaseException escaping.
        (StructuredOutput("json_schema", json.dumps(PANICS)), "is not a char boundary"),
    ],
)
def test_invalid_specs_are_refused_before_queueing(tiny_engine: Engine, spec: StructuredOutput, message: str) -> None:
    params = SamplingParams(max_tokens=8, structured=spec)
    with pytest.raises(InvalidRequestError, match=re.escape(message)) as refused:
        tiny_engine.validate([5, 6, 7], params, CacheSpec())
    assert len(str(refused.value)) < 1100 and "backtrace" not in str(refused.value)
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        tiny_engine.add_request("bad", [5, 6, 7], params, CacheSpec())
    with pytest.raises(InvalidRequestError, match=re.escape(message)):
        check_structured(spec)  # the gateway's check, without a tokenizer
    assert not tiny_engine.has_unfinished() and tiny_engine.structured.num_live == 0
    good = SamplingParams(max_tokens=8, structured=schema_spec(PERSON))
    tiny_engine.validate([5, 6, 7], good, CacheSpec())
    check_structured(good.structured)


def test_abort_mid_grammar_frees_the_matcher(tiny_engine: Engine) -> None:
    tiny_engine.add_request("g", prompts(1)[0], constrained(schema_spec(NESTED)), CacheSpec())
    tiny_engine.add_request("p", prompts(1)[0], SamplingParams(max_tokens=50, temperature=0), CacheSpec())
    for _ in range(4):
        tiny_engine.step()
    assert tiny_engine.structured.has("g") and tiny_engine.structured.num_live == 1
    out = tiny_engine.abort("g")
    assert out is not None and out.finished is not None and out.finished.finish_reason == "cancelled"
    assert tiny_engine.structured.num_live == 0
    assert tiny_engine.abort("p") is not None


def test_a_failing_request_frees_its_matcher(tiny_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("mask failed")

    monkeypatch.setattr(tiny_engine.structured, "apply", broken)
    tiny_engine.add_request(
        "p", prompts(1)[0], SamplingParams(max_tokens=3, temperature=0, ignore_eos=True), CacheSpec()
    )
    tiny_engine.add_request("g", prompts(1)[0], constrained(schema_spec(PERSON)), CacheSpec())
    done = {}
    while tiny_engine.has_unfinished():
        done.update({o.request_id: o.finished for o in tiny_engine.step() if o.finished is not None})
    assert done["g"].finish_reason == "error" and "mask failed" in done["g"].error
    assert done["p"].finish_reason == "length" and len(done["p"].token_ids) == 3  # the plain row went on
    assert tiny_engine.structured.num_live == 0


def test_compiled_grammars_are_cached_with_a_bound(tiny_engine: Engine) -> None:
    structured = StructuredOutputs(
        tiny_engine.tokenizer, vocab_size=tiny_engine.vocab_size, eos_token_ids=[EOS], cache_size=2
    )
    specs = [schema_spec({"type": "integer", "maximum": n}) for n in range(3)]
    first = structured.compile(specs[0])
    assert structured.compile(specs[0]) is first
    for spec in specs[1:]:
        structured.compile(spec)
    assert structured.num_cached == 2
    assert structured.compile(specs[0]) is not first  # evicted, compiled again
