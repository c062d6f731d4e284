"""`kvgate serve` as a real subprocess for tests: the command a user runs, on a free port, with a tiny model."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

from tests.gateway.harness import free_port

ADMIN = "serve-test-admin"


class Serve:
    """`kvgate serve` as a subprocess; its log goes to a file (a pipe nobody reads would block it)."""

    def __init__(
        self,
        *,
        database_url: str,
        model_dir: Path,
        workdir: Path,
        env: dict[str, str | None] | None = None,
        args: Sequence[str] = (),
    ) -> None:
        """`env` overrides the environment below (None: unset); `args` are appended to `kvgate serve`."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / f"serve-{self.port}.log"
        merged = {
            **os.environ,
            "KVGATE_DATABASE_URL": database_url,
            "KVGATE_MODEL": str(model_dir),
            "KVGATE_DTYPE": "float32",
            "KVGATE_KV_CACHE_GIB": "0.05",
            "KVGATE_NUM_THREADS": "1",
            "KVGATE_ADMIN_TOKEN": ADMIN,
            "KVGATE_SPOOL_PATH": str(workdir / "usage-spool.jsonl"),
            "KVGATE_INFLIGHT_JOURNAL_DIR": str(workdir / "inflight"),
            **(env or {}),
        }
        env_vars = {k: v for k, v in merged.items() if v is not None}
        kvgate = Path(sys.executable).with_name("kvgate")
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [str(kvgate), "serve", "--port", str(self.port), *args], env=env_vars, stdout=log, stderr=log
            )
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(f"{self.base_url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert self.process.poll() is None, self.log()
            assert time.monotonic() < deadline, "kvgate serve did not come up:\n" + self.log()
            time.sleep(0.2)
        self.admin = httpx.Client(base_url=self.base_url, headers={"authorization": f"Bearer {ADMIN}"}, timeout=60)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self, sig: int = signal.SIGINT) -> int:
        self.admin.close()
        if self.process.poll() is None:
            os.kill(self.process.pid, sig)
        return self.process.wait(timeout=90)
