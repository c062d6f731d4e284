"""Our C kernels (inference/csrc/*.c): each built once per ISA variant and loaded through ctypes.

The sources are plain C with no Python or torch headers, so each compiles in about a
second with the system C compiler, offline. A kernel is built for the variant the kernel
plan names (inference/platform.py: explicit -march flags per variant, never -march=native,
so every variant builds on every machine and a test can compile them all), on first use,
into the kvgate cache dir, keyed by its source, headers, variant flags and compiler, under a
lock, and renamed into place, so concurrent processes never load a half-written file.

A kernel the plan names that does not build is an error (KernelBuildError), not a fallback:
the plan, and so the KV fingerprint, would otherwise name kernels that never ran.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import subprocess
import tempfile
from functools import cache
from pathlib import Path

from inference.platform import ISA_CFLAGS, KERNEL_VARIANTS, find_compiler

CSRC = Path(__file__).parent / "csrc"
CFLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-std=c11")


class KernelBuildError(RuntimeError):
    """A C kernel the plan needs did not build or load; the message holds the compiler's words."""


def compiler() -> str:
    found = find_compiler()
    if found is None:
        raise KernelBuildError("no C compiler (cc/gcc) on PATH")
    return found


def compile_command(name: str, isa: str, out: str, *, syntax_only: bool = False) -> list[str]:
    """The compiler command that builds csrc/<name>.c for one ISA variant (or only checks it)."""
    assert isa in KERNEL_VARIANTS[name], f"{name} has no {isa} variant"
    flags = [*ISA_CFLAGS[isa], *CFLAGS]
    if syntax_only:
        return [compiler(), *ISA_CFLAGS[isa], "-fopenmp", "-std=c11", "-fsyntax-only", str(CSRC / f"{name}.c")]
    return [compiler(), *flags, str(CSRC / f"{name}.c"), "-o", out, "-lm"]


@cache
def _compiler_version(cc: str) -> str:
    lines = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()
    return lines[0] if lines else ""


def _build_key(name: str, isa: str) -> str:
    source = CSRC / f"{name}.c"
    # Headers too: a kernel may include any of them.
    code = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(CSRC.glob("*.h")))
    cc = compiler()
    identity = f"{' '.join(ISA_CFLAGS[isa] + CFLAGS)}|{cc}|{_compiler_version(cc)}".encode()
    return hashlib.sha256(code + identity).hexdigest()[:16]


def _build(name: str, isa: str, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            done = subprocess.run(compile_command(name, isa, tmp), capture_output=True, text=True)
            if done.returncode != 0:
                raise KernelBuildError(f"csrc/{name}.c ({isa}) did not build:\n{done.stderr[-2000:]}")
            os.rename(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


@cache
def load_library(name: str, cache_dir: str, isa: str) -> ctypes.CDLL:
    """csrc/<name>.c built for the ISA variant isa, loaded; KernelBuildError when it cannot be."""
    path = Path(cache_dir) / "kernels" / f"{name}-{isa}-{_build_key(name, isa)}.so"
    if not path.exists():
        _build(name, isa, path)
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise KernelBuildError(f"csrc/{name}.c ({isa}) built but did not load: {exc}") from exc
