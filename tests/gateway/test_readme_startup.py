"""README.md's "What you will see" is what a fresh first start shows: in a terminal (tmux), and in JSON-log mode.

Both runs are the README's own: the default model (SmolLM2, converted from its GGUF into a fresh
cache dir), a new ./kvgate.db, no admin token configured. In the terminal block `…` stands for
anything and each run of digits for any number (times, ports, pids, counts); the JSON block must
be the run's events in order (`model_progress` events of state "running" aside, as the README says).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from kvgate import REPO_ROOT
from tests.gateway.harness import free_port

pytestmark = pytest.mark.smollm2

KVGATE = Path(sys.executable).with_name("kvgate")
TERMINAL_MARK = "<!-- what-you-will-see:terminal -->"
JSON_MARK = "<!-- what-you-will-see:json -->"
PORT_TAKEN_MARK = "<!-- what-you-will-see:port-taken -->"
LAST_LINE = "Uvicorn running on"
START_TIMEOUT_S = 600  # a conversion on a loaded 2-core machine


def readme_block(mark: str) -> list[str]:
    """The lines of the fenced block right after `mark` in README.md."""
    text = (REPO_ROOT / "README.md").read_text()
    after = text[text.index(mark) + len(mark) :].lstrip("\n")
    assert after.startswith("```")
    body = after.split("\n", 1)[1]
    return body[: body.index("\n```")].splitlines()


def line_pattern(line: str) -> re.Pattern[str]:
    pattern = "".join(
        ".*?" if part == "…" else r"\d+" if part.isdigit() else re.escape(part)
        for part in re.split(r"(…|\d+)", line.rstrip())
    )
    return re.compile(pattern)


def mismatches(expected: list[str], seen: list[str]) -> list[str]:
    """Where `seen` (screen lines up to the last README line) differs from the README block; blank lines aside."""
    want = [line for line in expected if line.strip()]
    got = [line.rstrip() for line in seen if line.strip()]
    problems = []
    for i in range(max(len(want), len(got))):
        w = want[i] if i < len(want) else None
        g = got[i] if i < len(got) else None
        if w is None or g is None or not line_pattern(w).fullmatch(g):
            problems.append(f"line {i + 1}: README {w!r} vs screen {g!r}")
    return problems


def event_key(event: dict[str, Any]) -> tuple[Any, ...]:
    name = re.sub(r"\d+", "N", event["event"])
    return (name, event.get("phase"), event.get("state"), tuple(sorted(event)))


@pytest.fixture(autouse=True)
def _drop_the_first_starts_cache(tmp_path: Path) -> Iterator[None]:
    """Each first start converts SmolLM2 into its own cache dir (about 0.4 GB); pytest keeps three runs' tmp dirs."""
    yield
    shutil.rmtree(tmp_path / "cache", ignore_errors=True)


def first_start_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a first `make run`: no KVGATE_* settings but a fresh cache dir and a free port."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVGATE_")}
    env.update(
        KVGATE_CACHE_DIR=str(tmp_path / "cache"),
        KVGATE_PORT=str(free_port()),
        KVGATE_KV_CACHE_GIB="0.1",  # kv_blocks is among what the README leaves as `…`
    )
    return env


def wait_healthy(port: str, alive: Any) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert alive(), "kvgate serve exited"
        time.sleep(0.5)
    raise AssertionError("kvgate serve did not come up")


def stop(pid: int) -> None:
    os.kill(pid, signal.SIGINT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)


def test_the_matcher_can_fail() -> None:
    block = readme_block(TERMINAL_MARK)
    screen = [line.replace("…", "x") for line in block]
    assert not mismatches(block, screen)
    assert mismatches(block, [*screen, "an extra line"])
    changed = [line.replace("kvgate tenants create", "kvgate tenant create") for line in screen]
    assert mismatches(block, changed)


@contextmanager
def tmux_session(tmp_path: Path, env: dict[str, str]) -> Iterator[tuple[list[str], Path]]:
    """A private tmux server running `kvgate serve` in tmp_path; (the tmux command prefix, the pid file)."""
    tmux = ["tmux", "-L", f"kvgate-readme-{os.getpid()}"]
    pid_file = tmp_path / "serve.pid"
    script = tmp_path / "run.sh"
    script.write_text(f"cd {tmp_path}\necho $$ > {pid_file}\nexec {KVGATE} serve\n")
    # A new tmux server takes this client's environment; a wide window keeps log lines whole.
    subprocess.run([*tmux, "new-session", "-d", "-x", "220", "-y", "120", f"sh {script}"], env=env, check=True)
    try:
        yield tmux, pid_file
    finally:
        if pid_file.exists():
            stop(int(pid_file.read_text()))
        subprocess.run([*tmux, "kill-server"], check=False)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_readme_terminal_block_matches_a_first_start_in_tmux(tmp_path: Path) -> None:
    env = first_start_env(tmp_path)
    with tmux_session(tmp_path, env) as (tmux, pid_file):

        def alive() -> bool:
            pane = subprocess.run([*tmux, "list-panes", "-F", "#{pane_dead}"], capture_output=True, text=True)
            return pane.returncode == 0

        wait_healthy(env["KVGATE_PORT"], alive)
        deadline = time.monotonic() + 60
        while True:
            screen = subprocess.run(
                [*tmux, "capture-pane", "-p", "-J", "-S", "-"], capture_output=True, text=True, check=True
            ).stdout.splitlines()
            ends = [i for i, line in enumerate(screen) if LAST_LINE in line]
            if ends or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert ends, "\n".join(screen)
        seen = screen[: ends[0] + 1]
        assert not mismatches(readme_block(TERMINAL_MARK), seen), "\n".join(
            ["README's terminal block differs from the run:", *mismatches(readme_block(TERMINAL_MARK), seen), *seen]
        )
        assert pid_file.exists()


def test_readme_json_block_matches_a_first_start_without_a_terminal(tmp_path: Path) -> None:
    env = first_start_env(tmp_path)
    log_path = tmp_path / "serve.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen([str(KVGATE), "serve"], cwd=tmp_path, env=env, stdout=log, stderr=log)
    try:
        wait_healthy(env["KVGATE_PORT"], lambda: process.poll() is None)
        deadline = time.monotonic() + 60
        while LAST_LINE not in log_path.read_text() and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=120)
    text = log_path.read_text()
    events = [json.loads(line) for line in text.splitlines() if line.strip()]  # nothing but JSON lines
    last = next(i for i, e in enumerate(events) if LAST_LINE in e["event"])
    run = [event_key(e) for e in events[: last + 1] if e.get("state") != "running"]
    readme = [event_key(json.loads(line)) for line in readme_block(JSON_MARK)]
    assert run == readme, "README's JSON block differs from the run:\n" + text
    # What the README promises about that stream: no token, banner or bar; the token in a 0600 file.
    assert "kvgadm-" not in text and "no tenants yet" not in text and "dashboard is at" not in text
    assert "\r" not in text and "━" not in text and "it/s" not in text
    (notice,) = [e for e in events if e["event"] == "admin_token_generated"]
    assert Path(notice["path"]) == tmp_path / "kvgate.db.admin-token"
    assert stat.S_IMODE(Path(notice["path"]).stat().st_mode) == 0o600
    assert Path(notice["path"]).read_text().startswith("kvgadm-")


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_readme_port_taken_line_matches_a_terminal_run(tmp_path: Path) -> None:
    """The README's example of a failed check: one plain line on a terminal, before anything loads."""
    env = first_start_env(tmp_path)
    tmux = ["tmux", "-L", f"kvgate-readme-port-{os.getpid()}"]
    script = tmp_path / "run.sh"
    script.write_text(f"cd {tmp_path}\n{KVGATE} serve\necho exited $?\nsleep 600\n")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", int(env["KVGATE_PORT"])))
        holder.listen()
        subprocess.run([*tmux, "new-session", "-d", "-x", "220", "-y", "50", f"sh {script}"], env=env, check=True)
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                screen = subprocess.run(
                    [*tmux, "capture-pane", "-p", "-J", "-S", "-"], capture_output=True, text=True, check=True
                ).stdout.splitlines()
                if any(line.startswith("exited ") for line in screen) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        finally:
            subprocess.run([*tmux, "kill-server"], check=False)
    lines = [line.rstrip() for line in screen if line.strip()]
    assert lines[-1] == "exited 1", lines
    assert not mismatches(readme_block(PORT_TAKEN_MARK), lines[:-1]), lines
    assert not (tmp_path / "cache" / "models").exists(), "the model was not touched"
