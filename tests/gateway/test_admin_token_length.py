"""A configured KVGATE_ADMIN_TOKEN too short to withstand guessing stops `kvgate serve` at start (issue 25)."""

from __future__ import annotations

import socket
from pathlib import Path

from gateway.settings import MIN_ADMIN_TOKEN_CHARS
from tests.gateway.test_startup import _env, failed_start


def test_kvgate_serve_refuses_a_short_admin_token_in_one_line(tmp_path: Path) -> None:
    # A model that cannot load: a start that got past the settings would fail on another line.
    env = _env(tmp_path, tmp_path / "no-such-model")
    short = failed_start({**env, "KVGATE_ADMIN_TOKEN": "x" * (MIN_ADMIN_TOKEN_CHARS - 1)})
    assert short["message"].startswith("invalid settings: KVGATE_ADMIN_TOKEN:"), short["message"]
    assert f"at least {MIN_ADMIN_TOKEN_CHARS} characters" in short["message"]
    assert "x" * (MIN_ADMIN_TOKEN_CHARS - 1) not in short["message"]  # the (would-be) secret is not echoed

    # The same start with a token just long enough gets past the settings (to the next check: the port).
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        enough = failed_start({**env, "KVGATE_ADMIN_TOKEN": "x" * MIN_ADMIN_TOKEN_CHARS}, port=port)
    assert f"port {port} is already in use" in enough["message"]
