"""Breakpoints to engine regions: minimum length, longest TTL first, prefixes."""

from __future__ import annotations

from gateway.cache_regions import automatic_region, breakpoint_regions
from gateway.prompt import Breakpoint
from inference.types import CacheRegion


def test_last_1h_then_last_breakpoint() -> None:
    bps = [Breakpoint(100, 3600), Breakpoint(300, 3600), Breakpoint(500, 300), Breakpoint(700, 300)]
    assert breakpoint_regions(bps, min_tokens=0) == (CacheRegion(300, 3600), CacheRegion(700, 300))


def test_only_5m_or_only_1h() -> None:
    assert breakpoint_regions([Breakpoint(200, 300)], min_tokens=0) == (CacheRegion(200, 300),)
    assert breakpoint_regions([Breakpoint(200, 3600)], min_tokens=0) == (CacheRegion(200, 3600),)


def test_breakpoints_below_the_minimum_have_no_effect() -> None:
    assert breakpoint_regions([Breakpoint(1023, 300)], min_tokens=1024) == ()
    assert breakpoint_regions([Breakpoint(1024, 300)], min_tokens=1024) == (CacheRegion(1024, 300),)
    # A short 1h breakpoint drops out; a long 5m one still caches its whole prefix.
    mixed = [Breakpoint(500, 3600), Breakpoint(2000, 300)]
    assert breakpoint_regions(mixed, min_tokens=1024) == (CacheRegion(2000, 300),)


def test_a_5m_region_ending_inside_the_1h_one_adds_nothing() -> None:
    # A template may render blocks out of request order; regions must stay prefixes.
    assert breakpoint_regions([Breakpoint(800, 3600), Breakpoint(400, 300)], min_tokens=0) == (CacheRegion(800, 3600),)


def test_no_breakpoints_means_nothing_is_written() -> None:
    assert breakpoint_regions([], min_tokens=0) == ()
    assert breakpoint_regions([Breakpoint(0, 300)], min_tokens=0) == ()


def test_automatic_region_covers_the_prompt_when_long_enough() -> None:
    assert automatic_region(2000, ttl_s=300, min_tokens=1024) == (CacheRegion(2000, 300),)
    assert automatic_region(1000, ttl_s=300, min_tokens=1024) == ()
