"""The engine's start-up checks, run before the model loads: the disk KV tier directory is usable,
KVGATE_NATS_URL is a NATS URL, the kernel settings fit this CPU (for `kvgate engine serve`, its port is
free too).

A directory that cannot be written, or a disk without room for KVGATE_KV_DISK_GIB, would
otherwise surface only after the model has loaded, or as write failures under load.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from inference.platform import ISA_ORDER, have_compiler, this_cpu
from inference.server.drain import is_loopback
from inference.settings import EngineSettings
from kvgate.preflight import StartupError, check_port

GIB = 2**30
_OFF = "or unset KVGATE_KV_DISK_DIR to run without the disk tier"


def _bytes_in_use(directory: Path) -> int:
    """What the tier already holds there: its segment files are reused in place, so they count as room."""
    total = 0
    for sub in directory.glob("kv-*"):
        for path in sub.glob("seg-*"):
            try:
                total += path.stat().st_blocks * 512
            except OSError:
                continue
    return total


def check_disk_tier(settings: EngineSettings) -> None:
    """KVGATE_KV_DISK_DIR exists (or can be made), takes a write, and has room for KVGATE_KV_DISK_GIB.

    With KVGATE_KV_DISK_BLOCKS the size depends on the model's block layout, known only once it
    loads, so only the directory is checked.
    """
    directory = settings.kv_disk_dir
    if directory is None or settings.kv_disk_blocks == 0:
        return
    directory = directory.expanduser()
    try:
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.TemporaryFile(dir=directory) as probe:
            probe.write(b"\0" * 4096)
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as exc:
        cause = exc.strerror or str(exc)
        raise StartupError(
            f"the disk KV tier directory {directory} is not writable ({cause}): "
            f"set KVGATE_KV_DISK_DIR to a writable directory, {_OFF}"
        ) from None
    if settings.kv_disk_blocks is not None:
        return
    need = settings.kv_disk_gib * GIB
    room = shutil.disk_usage(directory).free + _bytes_in_use(directory)
    if room < need:
        raise StartupError(
            f"the disk KV tier needs {settings.kv_disk_gib:g} GiB in {directory} but only {room / GIB:.1f} GiB "
            f"is free there: lower KVGATE_KV_DISK_GIB (to at most {room / GIB:.1f}), free some space, {_OFF}"
        )


NATS_SCHEMES = ("nats", "tls", "ws", "wss")


def check_nats_url(settings: EngineSettings) -> None:
    """KVGATE_NATS_URL, if set, is one or more comma-separated NATS URLs. Whether NATS answers is not
    checked: the engine serves without it (its KV events are dropped until it does)."""
    if not settings.nats_url:
        return
    for url in settings.nats_url.split(","):
        parts = urlsplit(url.strip())
        if parts.scheme not in NATS_SCHEMES or not parts.hostname:
            raise StartupError(
                f"KVGATE_NATS_URL={settings.nats_url!r} is not a NATS URL: use e.g. nats://127.0.0.1:4222, "
                "or unset it to publish no KV events"
            )


def check_kernel_settings(settings: EngineSettings) -> None:
    """The kernel settings can be planned on this machine (inference/platform.py): KVGATE_KERNEL_ISA names a
    variant this CPU runs, and KVGATE_ATTENTION_BACKEND=cpu_kernel has a C compiler and an x86-64 CPU."""
    cpu = this_cpu()
    if settings.kernel_isa != "auto" and not cpu.runs(settings.kernel_isa):
        runs = ", ".join(isa for isa in ISA_ORDER if cpu.runs(isa)) or "none (not x86-64)"
        raise StartupError(
            f"KVGATE_KERNEL_ISA={settings.kernel_isa}: this CPU does not run it (it runs: {runs}); "
            "use one of those, or auto"
        )
    wants_kernel = settings.attention_backend == "cpu_kernel" and settings.device in ("auto", "cpu")
    if wants_kernel and (not have_compiler() or not cpu.runs("generic")):
        why = "no C compiler (cc or gcc) on PATH" if cpu.runs("generic") else f"an {cpu.arch} CPU"
        raise StartupError(f"KVGATE_ATTENTION_BACKEND=cpu_kernel needs x86-64 and a C compiler, but found {why}")


def check_engine_exposure(host: str, settings: EngineSettings) -> None:
    """An engine trusts whoever reaches it (cache salts, 30-day regions): beyond loopback only with a token."""
    if settings.engine_token is not None or _is_loopback_host(host):
        return
    raise StartupError(
        f"--host {host} would serve this engine beyond this machine without auth: set KVGATE_ENGINE_TOKEN "
        "(the gateways send it) or listen on 127.0.0.1"
    )


def _is_loopback_host(host: str) -> bool:
    return host == "localhost" or is_loopback(host)


def check_engine_start(host: str, port: int, settings: EngineSettings) -> None:
    """`kvgate engine serve`'s checks: its port, the NATS URL, the kernel settings, then the disk tier;
    StartupError (one line) on the first failure."""
    check_port(host, port, port_setting="--port")
    check_engine_exposure(host, settings)
    check_nats_url(settings)
    check_kernel_settings(settings)
    check_disk_tier(settings)
