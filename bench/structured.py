"""Structured output benchmark: three grammar libraries side by side, and the engine's cost per token with a grammar.

Run: .venv/bin/python bench/structured.py [--quick] [--no-docs]
Prints tables and rewrites the structured section of docs/benchmarks.md.

1. Libraries (llguidance, xgrammar, outlines-core) on SmolLM2's tokenizer (49,152 tokens):
   compile time of a few representative JSON schemas (to the first mask, since llguidance
   builds lazily and the others ahead), and the cost per token of computing the next-token
   bitmask and advancing the matcher, walking a valid document token by token. Each library
   emits the same compact JSON (`, ` and `: ` separators, no free whitespace).
2. The engine: SmolLM2-135M-Instruct, greedy, 64 new tokens, decode step time without and
   with a JSON schema, one request and four at once; runs interleaved.
Not a test: nothing here asserts a timing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.report import machine_description, write_section
from inference.engine import Engine
from inference.model_loader import LoadedModel, load_model
from inference.settings import EngineSettings
from inference.types import CacheSpec, SamplingParams, StructuredOutput

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "email": {"type": "string"},
        "role": {"enum": ["admin", "user", "guest"]},
    },
    "required": ["name", "age", "email", "role"],
    "additionalProperties": False,
}
ORDER = {
    "type": "object",
    "properties": {
        "id": {"type": "string"},
        "customer": PERSON,
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "sku": {"type": "string"},
                    "quantity": {"type": "integer"},
                    "price": {"type": "number"},
                    "gift": {"type": "boolean"},
                },
                "required": ["sku", "quantity", "price", "gift"],
                "additionalProperties": False,
            },
        },
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["id", "customer", "items", "note"],
    "additionalProperties": False,
}
WIDE = {
    "type": "object",
    "properties": {f"field_{i}": {"type": ["string", "integer", "boolean"][i % 3]} for i in range(24)},
    "required": [f"field_{i}" for i in range(24)],
    "additionalProperties": False,
}
DOCS: dict[str, tuple[dict[str, Any] | None, Any]] = {
    "person (4 fields, enum)": (
        PERSON,
        {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "role": "admin"},
    ),
    "order (nested, array of objects)": (
        ORDER,
        {
            "id": "ord-20931",
            "customer": {"name": "Grace Hopper", "age": 85, "email": "grace@navy.mil", "role": "user"},
            "items": [
                {"sku": "RYE-500", "quantity": 2, "price": 4.5, "gift": False},
                {"sku": "SOUR-1K", "quantity": 1, "price": 7.25, "gift": True},
                {"sku": "BAGUETTE", "quantity": 6, "price": 1.1, "gift": False},
            ],
            "note": "leave at the back door",
        },
    ),
    "wide (24 fields)": (WIDE, {f"field_{i}": ["text value", i * 37, i % 2 == 0][i % 3] for i in range(24)}),
    "json_object (any object)": (
        None,
        {"answer": "yes", "confidence": 0.93, "sources": ["a", "b"], "meta": {"lang": "en", "n": 3}},
    ),
}


def median_of(reps: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(reps))


# -- the three libraries ---------------------------------------------------------------------------


class Llguidance:
    name = "llguidance"

    def __init__(self, tokenizer: Any, vocab: int, eos: list[int]) -> None:
        import llguidance
        import llguidance.hf

        from inference.grammar import JSON_OPTIONS

        self.llg, self.options = llguidance, JSON_OPTIONS
        self.tok = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab, eos_token=eos)
        self.words = (vocab + 31) // 32
        self.mask = torch.zeros(self.words, dtype=torch.int32)

    def compile(self, schema: dict | None) -> Any:
        grammar = self.llg.LLMatcher.grammar_from_json_schema(schema or {"type": "object"}, defaults=self.options)
        matcher = self.llg.LLMatcher(self.tok, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def fill(self, matcher: Any) -> None:
        matcher.unsafe_compute_mask_ptr(self.mask.data_ptr(), self.words * 4)

    def advance(self, matcher: Any, token: int) -> None:
        assert matcher.consume_token(token), matcher.get_error()


class Xgrammar:
    name = "xgrammar"

    def __init__(self, tokenizer: Any, vocab: int, eos: list[int]) -> None:
        import xgrammar

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab, stop_token_ids=eos)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        self.mask = xgrammar.allocate_token_bitmask(1, vocab)

    def compile(self, schema: dict | None) -> Any:
        compiled = self.compiler.compile_json_schema(
            json.dumps(schema or {"type": "object"}), any_whitespace=False, separators=(", ", ": ")
        )
        return self.xgr.GrammarMatcher(compiled)

    def fill(self, matcher: Any) -> None:
        matcher.fill_next_token_bitmask(self.mask)

    def advance(self, matcher: Any, token: int) -> None:
        assert matcher.accept_token(token)


class OutlinesCore:
    name = "outlines-core"

    def __init__(self, tokenizer: Any, vocab: int, eos: list[int]) -> None:
        import outlines_core

        self.oc = outlines_core
        self.vocabulary = outlines_core.Vocabulary(eos[0], byte_vocabulary(tokenizer, set(eos)))
        self.mask = torch.zeros((vocab + 31) // 32, dtype=torch.int32)

    def compile(self, schema: dict | None) -> Any:
        # Compact separators, as the others: exactly one space after ',' and ':'.
        regex = self.oc.json_schema.build_regex_from_schema(json.dumps(schema or {"type": "object"}), " ?")
        return self.oc.Guide(self.oc.Index(regex, self.vocabulary))

    def fill(self, guide: Any) -> None:
        guide.write_mask_into(self.mask.data_ptr(), self.mask.numel(), 4)

    def advance(self, guide: Any, token: int) -> None:
        guide.advance(token, return_tokens=False)


def byte_vocabulary(tokenizer: Any, skip: set[int]) -> dict[bytes, list[int]]:
    """Token bytes for a byte-level BPE vocabulary (GPT-2's printable byte alphabet), special tokens left out."""
    alphabet = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    alphabet += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = alphabet[:], 0
    for b in range(256):
        if b not in alphabet:
            alphabet.append(b)
            chars.append(256 + extra)
            extra += 1
    decode = {chr(c): b for b, c in zip(alphabet, chars, strict=True)}
    special = set(tokenizer.all_special_ids) | skip
    out: dict[bytes, list[int]] = {}
    for token, token_id in tokenizer.get_vocab().items():
        if token_id in special or any(c not in decode for c in token):
            continue
        out.setdefault(bytes(decode[c] for c in token), []).append(token_id)
    return out


def compile_to_first_mask(lib: Any, schema: dict | None) -> float:
    start = time.perf_counter()
    lib.fill(lib.compile(schema))
    return time.perf_counter() - start


def per_token(lib: Any, schema: dict | None, tokens: list[int]) -> float:
    matcher = lib.compile(schema)
    lib.fill(matcher)
    lib.advance(matcher, tokens[0])
    start = time.perf_counter()
    for token in tokens[1:]:
        lib.fill(matcher)
        lib.advance(matcher, token)
    return (time.perf_counter() - start) / (len(tokens) - 1)


def bench_library(lib: Any, tokenizer: Any, reps: int) -> list[dict]:
    rows = []
    for label, (schema, doc) in DOCS.items():
        tokens = tokenizer.encode(json.dumps(doc), add_special_tokens=False)
        row: dict[str, Any] = {"library": lib.name, "schema": label, "tokens": len(tokens)}
        try:
            row["compile_ms"] = median_of(reps, lambda s=schema: compile_to_first_mask(lib, s)) * 1e3
            row["per_token_us"] = median_of(reps, lambda s=schema, t=tokens: per_token(lib, s, t)) * 1e6
        except Exception as exc:  # a library that cannot take a schema says so in the table
            row["error"] = repr(exc)[:80]
        rows.append(row)
    return rows


# -- the engine -----------------------------------------------------------------------------------------


def decode_steps(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> list[float]:
    """Step times after the prefill step: pure decode steps."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"b{time.monotonic_ns()}-{i}", prompt, params, CacheSpec(regions=()))
    engine.step()  # the prefill, with the first token of each
    times = []
    while engine.has_unfinished():
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    return times


def bench_engine(loaded: LoadedModel, reps: int, new_tokens: int) -> list[dict]:
    engine = Engine(EngineSettings(kv_cache_gib=0.5), loaded=loaded)
    tok = loaded.tokenizer
    text = tok.apply_chat_template(
        [{"role": "user", "content": "List eight people as JSON objects with name, age, email and role."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    prompt = tok.encode(text, add_special_tokens=False)
    schema = {"type": "array", "items": PERSON, "minItems": 8, "maxItems": 8}
    grammar = StructuredOutput("json_schema", json.dumps(schema))
    plain = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    constrained = SamplingParams(max_tokens=new_tokens, temperature=0, structured=grammar)
    engine.generate(prompt, constrained)  # warm up: the vocabulary, the compiled schema, the kernels
    rows = []
    for batch in (1, 4):
        # Several prompts that differ in their first token, so that none reads another's cache.
        prompts = [[prompt[0] + i, *prompt[1:]] for i in range(batch)]
        samples: dict[str, list[float]] = {"none": [], "json schema": []}
        for rep in range(reps):  # interleaved, each first in turn, so drift on a shared machine hits both alike
            order = [("none", plain), ("json schema", constrained)]
            for label, params in order if rep % 2 == 0 else order[::-1]:
                samples[label] += decode_steps(engine, prompts, params)
        for label, times in samples.items():
            rows.append(
                {"batch": batch, "grammar": label, "median_ms": statistics.median(times) * 1e3, "steps": len(times)}
            )
    out = engine.generate(prompt, constrained)
    rows.append({"sample": out.text[:160], "finish": out.finish_reason, "tokens": len(out.token_ids)})
    return rows


def in_engine_mask_cost(loaded: LoadedModel, new_tokens: int) -> tuple[float, float]:
    """Median and mean seconds per token in the engine's mask and advance calls (one request with a grammar)."""
    engine = Engine(EngineSettings(kv_cache_gib=0.5), loaded=loaded)
    per_token: list[float] = []
    structured = engine.structured
    apply, accept = structured.apply, structured.accept

    def timed_apply(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return apply(*args)
        finally:
            per_token.append(time.perf_counter() - t0)

    def timed_accept(*args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return accept(*args)
        finally:
            per_token[-1] += time.perf_counter() - t0

    structured.apply, structured.accept = timed_apply, timed_accept  # type: ignore[method-assign]
    schema = StructuredOutput("json_schema", json.dumps({"type": "array", "items": PERSON, "minItems": 8}))
    params = SamplingParams(max_tokens=new_tokens, temperature=0, structured=schema)
    prompt = loaded.tokenizer.encode("People as JSON:", add_special_tokens=False)
    engine.generate(prompt, params)
    per_token.clear()
    for _ in range(3):
        engine.generate(prompt, params)
    return statistics.median(per_token), statistics.fmean(per_token)


# -- report ---------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    reps = 2 if args.quick else 5
    load_before = os.getloadavg()[0]
    loaded = load_model(EngineSettings())
    tokenizer, vocab = loaded.tokenizer, int(loaded.model.config.vocab_size)
    eos = list(loaded.eos_token_ids)
    libraries, setup = [], {}
    for cls in (Llguidance, Xgrammar, OutlinesCore):
        t0 = time.perf_counter()
        libraries.append(cls(tokenizer, vocab, eos))
        setup[cls.name] = time.perf_counter() - t0
    lib_rows = [row for lib in libraries for row in bench_library(lib, tokenizer, reps)]
    engine_rows = bench_engine(loaded, 2 if args.quick else 4, 64)
    mask_cost = in_engine_mask_cost(loaded, 64)
    load_after = os.getloadavg()[0]
    lines = report(lib_rows, setup, engine_rows, mask_cost, (load_before, load_after), loaded)
    print("\n".join(lines))
    if not args.no_docs:
        write_section("structured", "Structured output (bench/structured.py)", lines)


def report(
    lib_rows: list[dict],
    setup: dict[str, float],
    engine_rows: list[dict],
    mask_cost: tuple[float, float],
    load: tuple[float, float],
    loaded: LoadedModel,
) -> list[str]:
    versions = ", ".join(f"{name} {_version(name)}" for name in ("llguidance", "xgrammar", "outlines-core"))
    lines = [
        f"Machine: {machine_description()}; load average {load[0]:.1f} at the start, {load[1]:.1f} at the end "
        f"(shared with other work); Python {platform.python_version()}, torch {torch.__version__}; {versions}.",
        f"Model SmolLM2-135M-Instruct in {str(loaded.dtype).removeprefix('torch.')}; vocabulary 49,152 tokens.",
        "",
        "### 1. Grammar libraries on SmolLM2's tokenizer (median of runs)",
        "",
        "Setup once per tokenizer: "
        + ", ".join(f"{name} {seconds * 1e3:.0f} ms" for name, seconds in setup.items())
        + ". Compile: schema to the first mask, no cache. Per token: next-token bitmask plus advancing the "
        "matcher, walking a valid document.",
        "",
        "| schema | document tokens | " + " | ".join(f"{s} compile | {s} per token" for s in setup) + " |",
        "|---|---|" + "---|---|" * len(setup),
    ]
    for label in DOCS:
        cells = []
        tokens = next(r["tokens"] for r in lib_rows if r["schema"] == label)
        for name in setup:
            row = next(r for r in lib_rows if r["schema"] == label and r["library"] == name)
            if "error" in row:
                cells += ["failed", row["error"]]
            else:
                cells += [f"{row['compile_ms']:.1f} ms", f"{row['per_token_us']:.1f} µs"]
        lines.append(f"| {label} | {tokens} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "### 2. The engine: decode step time with and without a grammar (greedy, 64 new tokens)",
        "",
        "| requests in the batch | grammar | median decode step | steps measured |",
        "|---|---|---|---|",
    ]
    base: dict[int, float] = {}
    for row in engine_rows:
        if "batch" not in row:
            continue
        extra = ""
        if row["grammar"] == "none":
            base[row["batch"]] = row["median_ms"]
        else:
            extra = f" ({row['median_ms'] / base[row['batch']] - 1:+.1%})"
        lines.append(f"| {row['batch']} | {row['grammar']} | {row['median_ms']:.2f} ms{extra} | {row['steps']} |")
    sample = next(r for r in engine_rows if "sample" in r)
    if load[0] > (os.cpu_count() or 1):
        lines += [
            "",
            "The machine was shared (load average above its core count), so the two rows of a batch size differ "
            "by run-to-run noise more than by the grammar; the in-engine cost below is measured directly.",
        ]
    lines += [
        "",
        f"Inside the engine, masking and advancing cost {mask_cost[0] * 1e6:.0f} µs per token (median; mean "
        f"{mask_cost[1] * 1e6:.0f} µs) for one request: the bitmask, putting it on the logits row, and the "
        "matcher's advance. Without a grammar in the batch none of this runs.",
        f"The grammar run's output ({sample['tokens']} tokens, finish {sample['finish']!r}) begins "
        f"`{sample['sample'][:120]}`.",
    ]
    return lines


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
