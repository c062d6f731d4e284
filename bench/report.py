"""Shared by the bench scripts: what machine this is, and rewriting one section of docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = """# Benchmarks

Each section is written by its script in `bench/`, from one run on the machine it names.
Rerun a script to refresh its section; the others are left alone.
"""


def machine_description() -> str:
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        text = cpuinfo.read_text()
        model = next((ln.split(":", 1)[1].strip() for ln in text.splitlines() if ln.startswith("model name")), model)
        flags = next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
        isa = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f" {f}" in flags]
        model += f" ({', '.join(isa[:2])})" if isa else ""
    return f"{model}, {os.cpu_count()} cores"


def write_section(name: str, title: str, lines: list[str]) -> None:
    """Replace the text between <!-- name:start --> and <!-- name:end -->, appending it if absent."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    body = "\n".join([start, f"## {title}", "", *lines, end])
    text = BENCHMARKS.read_text() if BENCHMARKS.exists() else HEADER
    if start in text and end in text:
        before, rest = text.split(start, 1)
        text = before + body + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + body + "\n"
    BENCHMARKS.write_text(text)
