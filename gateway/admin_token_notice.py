"""Telling the operator the admin token `kvgate serve` generated on first start: on the terminal only.

The token is shown once (only its hash is stored). On a terminal it is printed there; without one,
stderr is the JSON log stream, which log shippers copy far and wide, so the token goes to a file
readable by its owner only (0600) and the log names the file, never the token.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import structlog
from sqlalchemy.engine import make_url

from gateway.settings import GatewaySettings

log = structlog.get_logger("kvgate.gateway")

TERMINAL_NOTICE = """
Generated the admin token (shown once; only its hash is stored):
  {token}
Use it as `Authorization: Bearer <token>` on /admin/v1, or set KVGATE_ADMIN_TOKEN.
"""


def default_token_file(database_url: str) -> Path:
    """Beside a SQLite database file (`<file>.admin-token`); otherwise `.kvgate/admin-token-<hash of the URL>`."""
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
        return Path(url.database).with_name(Path(url.database).name + ".admin-token")
    digest = hashlib.sha256(url.render_as_string(hide_password=True).encode()).hexdigest()[:12]
    return Path(".kvgate") / f"admin-token-{digest}"


def token_file(settings: GatewaySettings) -> Path:
    return settings.admin_token_file or default_token_file(settings.database_url)


def write_private(path: Path, text: str) -> None:
    """Write `text` to `path` with mode 0600 (also when the file was already there), atomically."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def announce_admin_token(token: str, settings: GatewaySettings) -> None:
    """Print the new token on the terminal, or (no terminal) write it to token_file() and log that path."""
    if sys.stderr.isatty():
        print(TERMINAL_NOTICE.format(token=token), file=sys.stderr, flush=True)
        return
    path = token_file(settings).absolute()
    try:
        write_private(path, token + "\n")
    except OSError as exc:
        raise RuntimeError(
            f"cannot write the generated admin token to {path} ({exc.strerror or exc}); set "
            "KVGATE_ADMIN_TOKEN_FILE to a writable path, or KVGATE_ADMIN_TOKEN to a token of your own"
        ) from None
    log.warning("admin_token_generated", path=str(path), mode="0600", hint="read it once, then delete the file")
