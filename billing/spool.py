"""A local, durable, append-only spool for usage records the database could not take.

File format (one record a line, UTF-8):

    <crc32 of the JSON, 8 hex digits> <JSON object>\\n

Each append is one write() on an O_APPEND descriptor followed by fsync, so a
record is on disk before the caller goes on. A crash mid-write can leave a torn
last line; its checksum (or missing newline) shows it, and it is set aside in a
`.corrupt` file rather than replayed. A torn line is only possible for the record
whose append never returned, so no acknowledged record is lost.

Replay first renames the live file to `<name>.replay-<ns>` under a lock (appends
after that go to a fresh file), applies every record, and deletes the claimed file
only once all of them are in. Applying is idempotent (the ledger is unique by
request id), so a replay that dies half way is simply run again: exactly once.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import structlog

from kvgate.checksummed_lines import decode_line, encode_line

log = structlog.get_logger(__name__)


class SpoolError(RuntimeError):
    pass


@dataclass(frozen=True)
class ReplayResult:
    files: int
    records: int
    applied: int
    corrupt: int


class Spool:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock_path = self.path.with_name(self.path.name + ".lock")
        self._thread_lock = threading.Lock()

    @contextmanager
    def _locked(self) -> Iterator[None]:
        # A thread lock for this process, flock for other processes sharing the spool.
        with self._thread_lock:
            _make_private_dir(self.path.parent)
            fd = os.open(self._lock_path, os.O_CREAT | os.O_RDWR, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)

    def append(self, record: dict[str, Any]) -> None:
        """Durably append one record; returns only once it is fsynced."""
        line = encode_line(record)
        with self._locked():
            created = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                written = os.write(fd, line)
                if written != len(line):
                    raise SpoolError(f"short write to {self.path}: {written} of {len(line)} bytes")
                os.fsync(fd)
            finally:
                os.close(fd)
            if created:
                _fsync_dir(self.path.parent)

    def claimed_files(self) -> list[Path]:
        return sorted(self.path.parent.glob(self.path.name + ".replay-*"))

    def has_pending(self) -> bool:
        return (self.path.exists() and self.path.stat().st_size > 0) or bool(self.claimed_files())

    def pending(self) -> int:
        """Records waiting for replay (live file plus claimed files)."""
        count = 0
        for file in [self.path, *self.claimed_files()]:
            if file.exists():
                with file.open("rb") as fh:
                    count += sum(1 for _ in fh)
        return count

    def _claim(self) -> list[Path]:
        with self._locked():
            if self.path.exists() and self.path.stat().st_size > 0:
                self.path.rename(self.path.with_name(f"{self.path.name}.replay-{time.time_ns():020d}"))
                _fsync_dir(self.path.parent)
            return self.claimed_files()

    async def replay(
        self, apply: Callable[[list[dict[str, Any]]], Awaitable[int]], *, batch_size: int = 500
    ) -> ReplayResult:
        """Feed every spooled record to `apply` in batches; apply returns how many were new.

        `apply` must be idempotent and all-or-nothing per batch. If it raises, the
        claimed file stays and the error propagates; the next replay starts it over.
        """
        files = records = applied = corrupt = 0
        with self._replay_lock() as acquired:
            if not acquired:
                return ReplayResult(files=0, records=0, applied=0, corrupt=0)
            for file in self._claim():
                good, bad = read_spool_file(file)
                for start in range(0, len(good), batch_size):
                    applied += await apply(good[start : start + batch_size])
                if bad:
                    self._set_aside_lines(bad)
                    log.error("spool.corrupt_lines", file=str(file), count=len(bad))
                file.unlink()
                _fsync_dir(file.parent)
                files += 1
                records += len(good)
                corrupt += len(bad)
        return ReplayResult(files=files, records=records, applied=applied, corrupt=corrupt)

    @contextmanager
    def _replay_lock(self) -> Iterator[bool]:
        # One replayer at a time across processes; a second one just skips this round.
        _make_private_dir(self.path.parent)
        fd = os.open(self.path.with_name(self.path.name + ".replay.lock"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def set_aside(self, records: list[dict[str, Any]], reason: str) -> None:
        """Keep records the database refused in `<name>.rejected` for a person to look at."""
        path = self.path.with_name(self.path.name + ".rejected")
        with _open_private_append(path) as fh:
            for record in records:
                fh.write(encode_line({"reason": reason, "record": record}))
            fh.flush()
            os.fsync(fh.fileno())

    def _set_aside_lines(self, lines: list[bytes]) -> None:
        corrupt_path = self.path.with_name(self.path.name + ".corrupt")
        with _open_private_append(corrupt_path) as fh:
            for line in lines:
                fh.write(line if line.endswith(b"\n") else line + b"\n")
            fh.flush()
            os.fsync(fh.fileno())


def read_spool_file(file: Path) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The intact records of a spool file, and the lines that are not."""
    good: list[dict[str, Any]] = []
    bad: list[bytes] = []
    with file.open("rb") as fh:
        for line in fh:
            record = decode_line(line)
            if record is None:
                bad.append(line)
            else:
                good.append(record)
    return good, bad


def _make_private_dir(directory: Path) -> None:
    # Usage records name tenants and keys: the spool's directory is the owner's alone when we create it.
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)


def _open_private_append(path: Path) -> BinaryIO:
    """Open for appending, creating the file readable by its owner only (0600)."""
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600), "ab")


def _fsync_dir(directory: Path) -> None:
    # A new or renamed file's directory entry must reach disk too, or a crash can forget it.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
