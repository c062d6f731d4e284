"""Log lines from structlog and stdlib logging, written from many threads at once, stay whole."""

from __future__ import annotations

import json
import subprocess
import sys

THREADS = 4
LINES_PER_THREAD = 3000

SCRIPT = f"""
import logging, threading
import structlog
from kvgate.logs import configure_logging

configure_logging(json=True)
events = structlog.get_logger("kvgate.test")
stdlib = logging.getLogger("uvicorn.error")

def write(worker):
    for line in range({LINES_PER_THREAD}):
        if (line + worker) % 2:
            events.info("from_structlog", worker=worker, line=line)
        else:
            stdlib.info("from stdlib %d %d", worker, line)

threads = [threading.Thread(target=write, args=(worker,)) for worker in range({THREADS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
"""


def test_lines_from_both_loggers_and_many_threads_stay_one_json_object_each() -> None:
    result = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True)
    lines = result.stderr.splitlines()
    events = [json.loads(line) for line in lines]  # a spliced line fails here
    assert len(events) == THREADS * LINES_PER_THREAD
    structlog_lines = [event for event in events if event["event"] == "from_structlog"]
    assert len(structlog_lines) == THREADS * LINES_PER_THREAD // 2
    assert {event["level"] for event in events} == {"info"}
    assert all("timestamp" in event for event in events)
