"""Sampling controls and stop conditions."""

from __future__ import annotations

import random

import pytest
import torch

from inference.detokenizer import IncrementalDetokenizer
from inference.sampler import filter_logits
from inference.types import CacheSpec, InvalidRequestError, SamplingParams
from tests.inference.helpers import random_prompt

PROMPT = random_prompt(random.Random(31), 40)


def test_seeded_sampling_repeats_and_other_seeds_differ(tiny_engine):
    def run(seed):
        return tiny_engine.generate(PROMPT, SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True))

    assert run(7).token_ids == run(7).token_ids
    assert run(7).token_ids != run(8).token_ids


def test_top_k_1_and_a_tiny_top_p_are_greedy(tiny_engine):
    greedy = tiny_engine.generate(PROMPT, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)).token_ids
    for params in (SamplingParams(top_k=1), SamplingParams(top_p=1e-6)):
        p = SamplingParams(
            max_tokens=16, temperature=1.5, seed=3, ignore_eos=True, top_k=params.top_k, top_p=params.top_p
        )
        assert tiny_engine.generate(PROMPT, p).token_ids == greedy
    hot = SamplingParams(max_tokens=16, temperature=1.5, seed=3, ignore_eos=True)
    assert tiny_engine.generate(PROMPT, hot).token_ids != greedy


def test_filter_logits_keeps_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.8)).isfinite().tolist()
    assert kept == [True, True, False, False]
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_p=0.81)).isfinite().tolist()
    assert kept == [True, True, True, False]
    kept = filter_logits(logits, SamplingParams(temperature=1.0, top_k=3)).isfinite().tolist()
    assert kept == [True, True, True, False]


def test_stop_token_ids_and_max_tokens(tiny_engine):
    free = tiny_engine.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    assert free.finish_reason == "length" and len(free.token_ids) == 20
    stop_at = free.token_ids[5]
    first = free.token_ids.index(stop_at)
    stopped = tiny_engine.generate(
        PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop_token_ids=(stop_at,))
    )
    assert stopped.finish_reason == "stop" and stopped.token_ids == free.token_ids[: first + 1]


def test_eos_stops_unless_ignored(tiny_engine):
    eos = tiny_engine.loaded.eos_token_ids[0]
    tiny_engine.logits_observer = None
    # Force EOS by making it the only allowed token through a stop check on a 1-token vocabulary is
    # impractical with a random model, so check the flag plumbing on the tracked request instead.
    tiny_engine.add_request("e", PROMPT, SamplingParams(max_tokens=3), CacheSpec())
    tiny_engine.add_request("i", PROMPT, SamplingParams(max_tokens=3, ignore_eos=True), CacheSpec())
    assert eos in tiny_engine._tracked["e"].eos_token_ids
    assert not tiny_engine._tracked["i"].eos_token_ids
    while tiny_engine.has_unfinished():
        tiny_engine.step()


def test_stop_strings_truncate_and_are_held_back_across_tokens(tiny_engine):
    tok = tiny_engine.tokenizer
    ids = tok.encode("The answer is forty-two. Done.")
    detok = IncrementalDetokenizer(tok, stop=("forty-two",))
    deltas = []
    for t in ids:
        detok.add(t)
        deltas.append(detok.take_delta(final=detok.stop_sequence is not None))
        if detok.stop_sequence:
            break
    assert detok.stop_sequence == "forty-two"
    assert "".join(deltas) == "The answer is "
    assert all("forty" not in d for d in deltas)
    plain = IncrementalDetokenizer(tok)
    for t in ids:
        plain.add(t)
    assert plain.take_delta(final=True) == "The answer is forty-two. Done."


def test_stop_string_through_the_engine(tiny_engine):
    free = tiny_engine.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True))
    assert len(free.text) > 6
    stop = free.text[3:6]
    out = tiny_engine.generate(PROMPT, SamplingParams(max_tokens=20, temperature=0, ignore_eos=True, stop=(stop,)))
    assert out.finish_reason == "stop" and out.stop_sequence == stop
    assert out.text == free.text[: free.text.index(stop)]


def test_degenerate_sampling_values_are_greedy_and_harm_no_one(tiny_engine):
    greedy = tiny_engine.generate(PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)).token_ids
    for params in (
        SamplingParams(max_tokens=8, temperature=1e-300, ignore_eos=True),
        SamplingParams(max_tokens=8, temperature=1.0, top_p=1e-300, ignore_eos=True, seed=1),
    ):
        tiny_engine.add_request(
            "bystander", PROMPT, SamplingParams(max_tokens=8, temperature=0, ignore_eos=True), CacheSpec()
        )
        assert tiny_engine.generate(PROMPT, params).token_ids == greedy
        while tiny_engine.has_unfinished():
            tiny_engine.step()
    with pytest.raises(InvalidRequestError, match="temperature"):
        tiny_engine.add_request("nan", PROMPT, SamplingParams(temperature=float("nan")), CacheSpec())
