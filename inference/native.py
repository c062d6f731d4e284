"""Our C kernels (inference/csrc/*.c): each built once per machine and loaded through ctypes.

The sources are plain C with no Python or torch headers, so each compiles in about a
second with the system C compiler, offline. A library is built on first use into the
kvgate cache dir, keyed by its source and the CPU's flags (it is built with
-march=native, so the CPU decides which code paths it has), under a lock, and renamed
into place, so concurrent processes never load a half-written file. Without a compiler
the callers fall back to torch.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import structlog

log = structlog.get_logger(__name__)

CSRC = Path(__file__).parent / "csrc"
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-fno-math-errno", "-std=c11"]


def _cpu_key(source: Path) -> str:
    flags = ""
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        flags = next((ln for ln in cpuinfo.read_text().splitlines() if ln.startswith("flags")), "")
    # Headers too: a kernel may include any of them.
    code = source.read_bytes() + b"".join(h.read_bytes() for h in sorted(source.parent.glob("*.h")))
    return hashlib.sha256((code.hex() + flags + platform.machine()).encode()).hexdigest()[:16]


def _build(source: Path, out: Path) -> None:
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists():
            return
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=out.parent)
        os.close(fd)
        try:
            subprocess.run([compiler, *CFLAGS, str(source), "-o", tmp, "-lm"], check=True, capture_output=True)
            os.rename(tmp, out)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


@cache
def load_library(name: str, cache_dir: str) -> ctypes.CDLL | None:
    """csrc/<name>.c as a loaded library, built if needed; None (logged) when it cannot be built."""
    source = CSRC / f"{name}.c"
    path = Path(cache_dir) / "kernels" / f"{name}-{_cpu_key(source)}.so"
    try:
        if not path.exists():
            _build(source, path)
        return ctypes.CDLL(str(path))
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        log.warning(
            "native_kernel_unavailable", name=name, error=str(exc), detail=detail.decode(errors="replace")[-500:]
        )
        return None
