"""The OpenMP defaults kvgate sets before torch loads, and that a user's own settings win."""

from __future__ import annotations

import os
import subprocess
import sys

from inference.cpu_threads import OPENMP_DEFAULTS, set_openmp_defaults

WIRING = """
import os, sys
from kvgate.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
print(os.environ.get("OMP_WAIT_POLICY"), "torch" in sys.modules)
"""


def kvgate_env(**extra: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")}
    done = subprocess.run(
        [sys.executable, "-c", WIRING], env={**env, **extra}, capture_output=True, text=True, timeout=120, check=True
    )
    return done.stdout.strip().splitlines()[-1]


def test_the_kvgate_command_sets_passive_waiting_before_torch_loads() -> None:
    assert OPENMP_DEFAULTS == {"OMP_WAIT_POLICY": "PASSIVE"}
    assert kvgate_env() == "PASSIVE False"


def test_a_users_own_openmp_settings_win() -> None:
    assert kvgate_env(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE False"
    assert kvgate_env(GOMP_SPINCOUNT="1000") == "None False"


def test_no_effect_once_torch_is_loaded() -> None:
    import torch  # noqa: F401  (this test process has loaded it already)

    env: dict[str, str] = {}
    assert set_openmp_defaults(env) == {} and env == {}
