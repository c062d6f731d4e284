"""Model conversion/loading progress without a terminal: log events, never a tqdm bar on stderr."""

from __future__ import annotations

import threading

import pytest
import structlog
import transformers.utils.logging as hf_logging

from inference import load_progress


def _progress(logs: list[dict]) -> list[tuple[str, str]]:
    return [(e["phase"], e["state"]) for e in logs if e["event"] == "model_progress"]


def test_transformers_bars_become_log_events(capsys: pytest.CaptureFixture[str]) -> None:
    reporter = load_progress.LogReporter()
    labels = {"Loading weights": "Loading tiny", "Hidden": None}
    with structlog.testing.capture_logs() as logs, load_progress.reporting(reporter, labels):
        assert list(hf_logging.tqdm(range(5), desc="Loading weights")) == list(range(5))
        assert list(hf_logging.tqdm(range(3), desc="Hidden")) == [0, 1, 2]
    assert _progress(logs) == [("Loading tiny", "started"), ("Loading tiny", "done")]
    assert [e["done"] for e in logs][-1] == 5 and logs[-1]["percent"] == 100
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err and "\r" not in err
    # Outside reporting(), transformers' own tqdm is back (it writes its bar to stderr).
    list(hf_logging.tqdm(range(2), desc="Afterwards", disable=False))
    assert "Afterwards" in capsys.readouterr().err


def test_a_step_adopts_the_bar_that_names_it() -> None:
    reporter = load_progress.LogReporter()
    with (
        structlog.testing.capture_logs() as logs,
        load_progress.reporting(reporter, {"Loading weights": "Loading tiny"}),
        load_progress.step(reporter, "Loading tiny"),
    ):
        list(hf_logging.tqdm(range(4), desc="Loading weights"))
        assert _progress(logs) == [("Loading tiny", "started")], "the bar's end is not the step's"
    assert _progress(logs) == [("Loading tiny", "started"), ("Loading tiny", "done")]
    assert logs[-1]["total"] == 4 and logs[-1]["done"] == 4


def test_a_phase_without_updates_still_logs_periodically(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(load_progress, "LOG_EVERY_S", 0.05)
    beat = threading.Event()
    reporter = load_progress.LogReporter()
    with structlog.testing.capture_logs() as logs:
        phase = reporter.phase("Reading", None)
        original = phase.heartbeat

        def heartbeat() -> None:
            original()
            if any(e.get("state") == "running" for e in logs):
                beat.set()

        phase.heartbeat = heartbeat  # type: ignore[method-assign]
        assert beat.wait(timeout=60), "no heartbeat event"
        phase.close()
        reporter.close()
    states = [state for _, state in _progress(logs)]
    assert states[0] == "started" and states[-1] == "done" and "running" in states


def test_a_quick_phase_logs_only_its_start_and_end() -> None:
    reporter = load_progress.LogReporter()
    with structlog.testing.capture_logs() as logs:
        phase = reporter.phase("Quick", 100)
        for _ in range(100):
            phase.update(1)
        phase.close()
        reporter.close()
    assert _progress(logs) == [("Quick", "started"), ("Quick", "done")]
