"""The in-flight journal: a durable trace of every admitted request, so that a crash cannot lose one.

Before the engine starts on a request, the gateway appends a *begin* entry (request id,
tenant, key, model, endpoint, start time, prompt tokens) and waits until it is on disk.
When the request's usage record is written, it appends an *end* entry. After a crash,
every begin without an end is a request that was running: start-up turns each into a
usage record with status `interrupted` (gateway/recovery.py).

Files. One directory per database; each gateway process appends to its own segment,
`seg-<pid>-<ns>.jnl`, which it holds with an exclusive `flock` for as long as it lives.
A segment whose lock can be taken belongs to a dead process: that is how start-up
tells a crashed process's journal from a live neighbour's. A new segment is created
under a temporary name, locked, and only then renamed into place, so nobody ever sees
an unlocked live segment.

Lines are those of the usage spool: `<crc32 of the JSON, 8 hex> <JSON>\\n`. A torn last
line (a crash mid-write) fails its checksum and is ignored: it can only belong to a
begin whose write never returned, so that request never reached the engine.

Group commit. Begins are written by one thread: whatever queued up while the previous
write was on its way goes out in one write and one fdatasync, so concurrent admissions
share the cost. Ends are not synced: a lost end only makes recovery look up a request
whose record is already there (insert-or-ignore), so they ride along with the next
write. A failed write is cut off again (ftruncate) so that no half-written batch can
leave a begin for a request the gateway refused.

Compaction. When a segment passes `rotate_bytes`, the requests still open are copied to
a fresh segment and the old one is deleted; at a clean shutdown with nothing open the
segment is deleted. A crash between the copy and the delete leaves both, which recovery
reads as one (an entry is open if some segment begins it and none ends it).
"""

from __future__ import annotations

import asyncio
import fcntl
import os
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import structlog
from sqlalchemy.engine import make_url

from gateway.inflight_entries import InflightEntry, SegmentContents, end_line
from kvgate.checksummed_lines import encode_line

SEGMENT_GLOB = "seg-*.jnl"
TEMP_PREFIX = ".tmp-"
DEFAULT_ROTATE_BYTES = 4 * 1024 * 1024
# A temporary segment older than this was left by a crash mid-creation, never by a live process.
STALE_TEMP_S = 60.0

log = structlog.get_logger("kvgate.gateway")


class JournalError(OSError):
    """The journal could not make an entry durable."""


def default_journal_dir(database_url: str) -> Path:
    """Beside a SQLite database file (`<file>.inflight/`); otherwise `.kvgate/inflight-<hash of the URL>/`."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        return Path(url.database).with_name(Path(url.database).name + ".inflight")
    import hashlib

    digest = hashlib.sha256(url.render_as_string(hide_password=True).encode()).hexdigest()[:12]
    return Path(".kvgate") / f"inflight-{digest}"


# -- files ----------------------------------------------------------------------------------------


def _fsync_dir(directory: Path) -> None:
    # A new, renamed or deleted file's directory entry must reach disk too.
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class _Segment:
    path: Path
    fd: int
    size: int


def _create_segment(directory: Path, lines: list[bytes]) -> _Segment:
    """A new segment holding `lines`, locked by this process, durable, under its final name."""
    name = f"seg-{os.getpid()}-{time.time_ns():020d}.jnl"
    temp = directory / f"{TEMP_PREFIX}{name}"
    fd = os.open(temp, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        data = b"".join(lines)
        if data:
            written = os.pwrite(fd, data, 0)
            if written != len(data):
                raise JournalError(f"short write to {temp}: {written} of {len(data)} bytes")
        os.fdatasync(fd)
        path = directory / name
        os.rename(temp, path)
        _fsync_dir(directory)
    except BaseException:
        os.close(fd)
        with suppress(OSError):
            temp.unlink()
        raise
    return _Segment(path=path, fd=fd, size=len(data))


class DeadSegments:
    """Segments of processes that are gone, locked by us while we recover them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._held: list[tuple[Path, int]] = []

    @property
    def paths(self) -> list[Path]:
        return [path for path, _ in self._held]

    def claim(self) -> None:
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob(SEGMENT_GLOB)):
            fd = _lock_if_dead(path)
            if fd is not None:
                self._held.append((path, fd))
        for temp in self.directory.glob(TEMP_PREFIX + "*"):
            # Never renamed into place: its lines are still in the segment it was copied from.
            with suppress(OSError):
                if time.time() - temp.stat().st_mtime > STALE_TEMP_S:
                    fd = _lock_if_dead(temp)
                    if fd is not None:
                        temp.unlink()
                        os.close(fd)

    def contents(self) -> SegmentContents:
        contents = SegmentContents()
        for path in self.paths:
            contents.read(path)
        return contents

    def remove(self) -> None:
        """Delete the claimed segments (everything in them is recovered)."""
        for path, _ in self._held:
            with suppress(FileNotFoundError):
                path.unlink()
        if self._held:
            _fsync_dir(self.directory)

    def release(self) -> None:
        for _, fd in self._held:
            os.close(fd)
        self._held = []


def _lock_if_dead(path: Path) -> int | None:
    """A descriptor holding `path`'s lock if its owner is gone, else None."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        # The owner may have rotated it away (unlinked, then closed) after we opened it.
        if os.fstat(fd).st_ino != path.stat().st_ino:
            raise FileNotFoundError(path)
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    return fd


@contextmanager
def dead_segments(directory: Path) -> Iterator[DeadSegments]:
    """The journal segments of dead processes in `directory`, locked for the duration."""
    dead = DeadSegments(directory)
    try:
        dead.claim()
        yield dead
    finally:
        dead.release()


# -- the writer -----------------------------------------------------------------------------------


@dataclass
class _Write:
    line: bytes
    request_id: str
    begin: bool
    future: asyncio.Future[None] | None


class InflightJournal:
    """This process's segment: `await begin(entry)` before the engine starts, `end(request_id)` after.

    Not thread-safe: call it from the event loop it was opened on.
    """

    def __init__(self, directory: Path, *, rotate_bytes: int = DEFAULT_ROTATE_BYTES) -> None:
        self.directory = Path(directory)
        self.rotate_bytes = rotate_bytes
        self._segment: _Segment | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvgate-journal")
        self._pending: list[_Write] = []
        self._writer: asyncio.Task[None] | None = None
        # Request id -> its begin line, for every request begun and not yet ended: what rotation copies.
        self._open: dict[str, bytes] = {}
        self.syncs = 0
        self.rotations = 0
        self._failing = False  # logged once when writes start failing, once when they work again

    @classmethod
    def open(cls, directory: Path, *, rotate_bytes: int = DEFAULT_ROTATE_BYTES) -> InflightJournal:
        journal = cls(directory, rotate_bytes=rotate_bytes)
        journal.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        journal._segment = _create_segment(journal.directory, [])
        return journal

    @property
    def path(self) -> Path | None:
        return self._segment.path if self._segment else None

    @property
    def open_requests(self) -> int:
        return len(self._open)

    async def begin(self, entry: InflightEntry) -> None:
        """Return once the entry is on disk (fdatasync), sharing the sync with concurrent begins."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._enqueue(_Write(encode_line(entry.to_record()), entry.request_id, True, future))
        await future

    def end(self, request_id: str) -> None:
        """Mark a request as recorded (or as never run). Not waited for, not synced."""
        write = _Write(end_line(request_id), request_id, False, None)
        segment = self._segment
        idle = not self._pending and (self._writer is None or self._writer.done())
        if segment is None or not idle or segment.size + len(write.line) > self.rotate_bytes:
            self._enqueue(write)
            return
        # The writer thread is idle, so nothing else writes the segment: an end, never synced, is a
        # pwrite of a few dozen bytes into the page cache, done here rather than handed to the
        # thread and back (a wake-up of each, which cost more than the write). Rotation stays
        # the writer's: an end that would pass the threshold is queued.
        error: Exception | None = None
        try:
            self._append(write.line, False)
        except Exception as exc:
            error = exc
        self._log_state(error)
        self._open.pop(request_id, None)

    def _enqueue(self, write: _Write) -> None:
        if self._segment is None:
            raise JournalError("the in-flight journal is closed")
        self._pending.append(write)
        if self._writer is None or self._writer.done():
            self._writer = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending, []
            data = b"".join(write.line for write in batch)
            sync = any(write.begin for write in batch)
            error: BaseException | None = None
            try:
                await loop.run_in_executor(self._executor, self._append, data, sync)
            except Exception as exc:
                error = exc
            self._log_state(error)
            for write in batch:
                if not write.begin:
                    self._open.pop(write.request_id, None)
                elif error is None:
                    self._open[write.request_id] = write.line
                if write.future is not None and not write.future.done():
                    if error is None:
                        write.future.set_result(None)
                    else:
                        write.future.set_exception(JournalError(f"in-flight journal write failed: {error}"))
            assert self._segment is not None
            if error is None and self._segment.size > self.rotate_bytes:
                try:
                    await loop.run_in_executor(self._executor, self._rotate, list(self._open.values()))
                except Exception as exc:  # keep appending to the old segment; the next batch tries again
                    log.warning("inflight_journal_rotation_failed", error=str(exc))

    def _log_state(self, error: BaseException | None) -> None:
        if error is not None and not self._failing:
            log.error("inflight_journal_failing", path=str(self.path), error=str(error))
        elif error is None and self._failing:
            log.warning("inflight_journal_recovered", path=str(self.path))
        self._failing = error is not None

    def _append(self, data: bytes, sync: bool) -> None:
        segment = self._segment
        assert segment is not None
        try:
            written = os.pwrite(segment.fd, data, segment.size)
            if written != len(data):
                raise JournalError(f"short write to {segment.path}: {written} of {len(data)} bytes")
            if sync:
                os.fdatasync(segment.fd)
                self.syncs += 1
        except OSError:
            # Cut the batch off again: a begin half on disk must not outlive its refusal.
            with suppress(OSError):
                os.ftruncate(segment.fd, segment.size)
            raise
        segment.size += len(data)

    def _rotate(self, open_lines: list[bytes]) -> None:
        old = self._segment
        assert old is not None
        self._segment = _create_segment(self.directory, open_lines)
        try:
            old.path.unlink()
            _fsync_dir(self.directory)
        finally:
            os.close(old.fd)
        self.rotations += 1

    async def flush(self) -> None:
        """Wait until everything queued (ends too) has been written."""
        while self._writer is not None and not self._writer.done():
            await asyncio.gather(self._writer, return_exceptions=True)

    async def aclose(self) -> None:
        """Write what is queued; delete the segment if nothing is open, else leave it for recovery."""
        await self.flush()
        segment, self._segment = self._segment, None
        if segment is not None:
            if not self._open:
                with suppress(OSError):
                    segment.path.unlink()
                    _fsync_dir(self.directory)
            else:
                with suppress(OSError):
                    os.fdatasync(segment.fd)
            os.close(segment.fd)
        self._executor.shutdown(wait=True)
