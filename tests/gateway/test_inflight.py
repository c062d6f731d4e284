"""The in-flight journal on its own: durability, group commit, torn lines, compaction, and ownership by flock."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gateway import inflight
from gateway.inflight import InflightEntry, InflightJournal, JournalError, SegmentContents, dead_segments, end_line
from kvgate import REPO_ROOT

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def entry(i: int) -> InflightEntry:
    return InflightEntry(
        request_id=f"req_{i:04d}",
        tenant_id="ten_a",
        api_key_id="key_a",
        model="m",
        endpoint="messages",
        started_at=T0,
        prompt_tokens=100 + i,
    )


def begin_line(i: int) -> bytes:
    return inflight.encode_line(entry(i).to_record())


def segments(directory: Path) -> list[Path]:
    return sorted(directory.glob(inflight.SEGMENT_GLOB))


def read(*paths: Path) -> SegmentContents:
    contents = SegmentContents()
    for path in paths:
        contents.read(path)
    return contents


def crash(journal: InflightJournal) -> None:
    """What SIGKILL leaves: the file as written, its lock dropped, no clean-up."""
    assert journal._segment is not None
    os.close(journal._segment.fd)
    journal._segment = None
    journal._executor.shutdown(wait=True)


async def test_a_begin_is_on_disk_when_it_returns_and_an_end_closes_it(tmp_path: Path) -> None:
    journal = InflightJournal.open(tmp_path)
    await journal.begin(entry(1))
    await journal.begin(entry(2))
    (path,) = segments(tmp_path)
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert [e.request_id for e in read(path).unfinished()] == ["req_0001", "req_0002"]
    assert read(path).unfinished()[0] == entry(1)  # every field round-trips
    journal.end("req_0001")
    await journal.aclose()  # flushes the end; req_0002 is still open, so the segment stays
    assert [e.request_id for e in read(path).unfinished()] == ["req_0002"]


async def test_a_clean_close_with_nothing_open_leaves_no_segment(tmp_path: Path) -> None:
    journal = InflightJournal.open(tmp_path)
    await journal.begin(entry(1))
    journal.end("req_0001")
    assert len(segments(tmp_path)) == 1
    await journal.aclose()
    assert segments(tmp_path) == []


async def test_concurrent_begins_share_one_fdatasync(tmp_path: Path) -> None:
    journal = InflightJournal.open(tmp_path)
    # Hold the writer thread so that everything arriving meanwhile queues up together.
    held, release = threading.Event(), threading.Event()
    journal._executor.submit(lambda: (held.set(), release.wait(10)))
    held.wait(10)
    tasks = [asyncio.create_task(journal.begin(entry(i))) for i in range(50)]
    await asyncio.sleep(0.05)
    assert not any(t.done() for t in tasks)  # nobody is told "durable" before the sync
    release.set()
    await asyncio.gather(*tasks)
    assert journal.syncs == 1  # one write and one fdatasync for all fifty
    # And one arriving while a sync is on its way waits for the next one, with whoever else came meanwhile.
    journal._executor.submit(lambda: (held.clear(), held.set(), release.clear(), release.wait(10)))
    first = asyncio.create_task(journal.begin(entry(50)))
    await asyncio.sleep(0.05)
    later = [asyncio.create_task(journal.begin(entry(i))) for i in range(51, 60)]
    await asyncio.sleep(0.05)
    release.set()
    await asyncio.gather(first, *later)
    assert journal.syncs == 3
    assert len(read(*segments(tmp_path)).unfinished()) == 60
    await journal.aclose()


async def test_ends_are_not_synced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    journal = InflightJournal.open(tmp_path)
    await journal.begin(entry(1))
    syncs: list[int] = []
    real = os.fdatasync
    monkeypatch.setattr(inflight.os, "fdatasync", lambda fd: (syncs.append(fd), real(fd))[1])
    journal.end("req_0001")
    await asyncio.sleep(0.05)
    assert syncs == []
    assert read(*segments(tmp_path)).unfinished() == []  # written all the same (page cache survives a kill)
    await journal.begin(entry(2))
    assert len(syncs) == 1
    await journal.aclose()


async def test_an_end_is_written_at_once_when_the_writer_is_idle_and_queued_behind_a_write_in_flight(
    tmp_path: Path,
) -> None:
    journal = InflightJournal.open(tmp_path)
    await journal.begin(entry(1))
    await journal.begin(entry(2))
    journal.end("req_0001")  # no await: the writer thread was idle, so the end is in the file already
    assert [e.request_id for e in read(*segments(tmp_path)).unfinished()] == ["req_0002"]
    assert journal.open_requests == 1
    third = asyncio.ensure_future(journal.begin(entry(3)))
    await asyncio.sleep(0)  # the begin's batch is on its way to the writer thread
    journal.end("req_0002")  # so this end waits for the writer, behind it
    assert "req_0002" in [e.request_id for e in read(*segments(tmp_path)).unfinished()]
    await third
    await journal.flush()
    assert [e.request_id for e in read(*segments(tmp_path)).unfinished()] == ["req_0003"]
    await journal.aclose()


async def test_a_failed_sync_refuses_the_begin_and_leaves_no_trace_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    journal = InflightJournal.open(tmp_path)
    await journal.begin(entry(1))
    (path,) = segments(tmp_path)
    size = path.stat().st_size

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(inflight.os, "fdatasync", failing)
    with pytest.raises(JournalError):
        await journal.begin(entry(2))
    assert path.stat().st_size == size  # cut off again: recovery will not find req_0002
    monkeypatch.undo()
    await journal.begin(entry(3))  # and the journal goes on
    assert [e.request_id for e in read(path).unfinished()] == ["req_0001", "req_0003"]
    await journal.aclose()


def test_a_torn_last_line_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "seg-1-1.jnl"
    good = (
        inflight.encode_line(entry(1).to_record()) + inflight.encode_line(entry(2).to_record()) + end_line("req_0002")
    )
    torn = begin_line(3)[:-7]  # the crash came mid-write
    path.write_bytes(good + torn)
    contents = read(path)
    assert [e.request_id for e in contents.unfinished()] == ["req_0001"]
    assert contents.corrupt == 1
    # An altered line fails its checksum too; the lines after it still count.
    altered = good.replace(b'"prompt_tokens":101', b'"prompt_tokens":901')
    path.write_bytes(altered + begin_line(4))
    contents = read(path)
    assert [e.request_id for e in contents.unfinished()] == ["req_0004"] and contents.corrupt == 1


async def test_rotation_compacts_to_the_open_requests(tmp_path: Path) -> None:
    journal = InflightJournal.open(tmp_path, rotate_bytes=2000)
    first = journal.path
    for i in range(40):
        await journal.begin(entry(i))
        if i % 4:
            journal.end(f"req_{i:04d}")
    await asyncio.sleep(0.05)
    assert journal.rotations >= 2
    (path,) = segments(tmp_path)  # the old segments are gone
    assert path != first and path.stat().st_size < 2000 + 300
    open_ids = [f"req_{i:04d}" for i in range(0, 40, 4)]
    assert [e.request_id for e in read(path).unfinished()] == open_ids
    assert journal.open_requests == len(open_ids)
    crash(journal)
    with dead_segments(tmp_path) as dead:
        assert [e.request_id for e in dead.contents().unfinished()] == open_ids


def test_a_crash_mid_rotation_reads_both_segments_as_one(tmp_path: Path) -> None:
    # The new segment holds copies of the open begins; the old one was not deleted yet.
    old = begin_line(1) + begin_line(2) + begin_line(3) + end_line("req_0001")
    new = begin_line(2) + begin_line(3) + end_line("req_0002") + begin_line(4)
    (tmp_path / "seg-7-1.jnl").write_bytes(old)
    (tmp_path / "seg-7-2.jnl").write_bytes(new)
    with dead_segments(tmp_path) as dead:
        assert len(dead.paths) == 2
        assert [e.request_id for e in dead.contents().unfinished()] == ["req_0003", "req_0004"]
        dead.remove()
    assert segments(tmp_path) == []


async def test_a_live_journal_is_never_claimed_a_killed_ones_is(tmp_path: Path) -> None:
    live = InflightJournal.open(tmp_path)
    await live.begin(entry(1))
    script = (
        "import asyncio, os, signal, sys\n"
        "from gateway.inflight import InflightJournal\n"
        "from tests.gateway.test_inflight import entry\n"
        "async def main():\n"
        "    journal = InflightJournal.open(sys.argv[1])\n"
        "    for i in (10, 11, 12):\n"
        "        await journal.begin(entry(i))\n"
        "    journal.end('req_0011')\n"
        "    await asyncio.sleep(0.05)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    killed = subprocess.run([sys.executable, "-c", script, str(tmp_path)], env=env, timeout=60)
    assert killed.returncode == -signal.SIGKILL
    assert len(segments(tmp_path)) == 2
    with dead_segments(tmp_path) as dead:
        assert dead.paths != [] and live.path not in dead.paths
        assert [e.request_id for e in dead.contents().unfinished()] == ["req_0010", "req_0012"]
        dead.remove()
    assert segments(tmp_path) == [live.path]
    await live.aclose()
    # Closed with req_0001 open: its segment is now a dead one, for the next start-up.
    with dead_segments(tmp_path) as dead:
        assert [e.request_id for e in dead.contents().unfinished()] == ["req_0001"]


def test_default_directory_is_per_database(tmp_path: Path) -> None:
    assert inflight.default_journal_dir(f"sqlite:///{tmp_path}/k.db") == tmp_path / "k.db.inflight"
    a = inflight.default_journal_dir("postgresql://u:secret@db1/kvgate")
    b = inflight.default_journal_dir("postgresql://u:other@db2/kvgate")
    assert a != b and a.parent == Path(".kvgate") and "secret" not in str(a)
