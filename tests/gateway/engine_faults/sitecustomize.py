"""Test-only fault injection for a `kvgate serve` subprocess; put this directory first on its PYTHONPATH.

Python imports sitecustomize at start-up. This one waits for inference.engine to be
imported (so torch still loads after kvgate has set its OpenMP defaults) and then wraps
Engine.step, as KVGATE_TEST_ENGINE_FAULT says:

- slow: every step sleeps 20 ms, so a generation outlasts a short shutdown grace;
- die: once the file KVGATE_TEST_FAULT_TRIGGER exists, step raises a BaseException
  (the engine thread dies, as on a bug in its loop);
- stuck: once that file exists, step never returns (as a kernel that hangs).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

MODE = os.environ.get("KVGATE_TEST_ENGINE_FAULT")
TRIGGER = Path(os.environ.get("KVGATE_TEST_FAULT_TRIGGER", "/nonexistent"))


class InjectedEngineDeath(BaseException):
    pass


def _patch(module: Any) -> None:
    step = module.Engine.step
    never = threading.Event()

    def faulty(self: Any) -> Any:
        if MODE == "slow":
            time.sleep(0.02)
        elif TRIGGER.exists():
            if MODE == "die":
                raise InjectedEngineDeath("injected by the test: the engine loop broke")
            never.wait()
        return step(self)

    module.Engine.step = faulty


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "inference.engine":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.loader is not None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module: Any) -> None:
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


if MODE:
    sys.meta_path.insert(0, _Hook())
