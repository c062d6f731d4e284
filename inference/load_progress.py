"""Progress of the model's conversion and loading: a rich bar on a terminal, periodic log events otherwise.

transformers draws its own tqdm bars ("Converting and de-quantizing GGUF tensors", "Loading weights",
"Writing model shards"). On a terminal a tqdm bar under our logs is noise, and without one it writes
carriage-return frames into the JSON log stream. `reporting()` routes them here instead: through
transformers' tqdm hook (transformers.utils.logging.set_tqdm_hook) and, for the GGUF reader, which
calls tqdm.auto directly, by swapping that module's `tqdm` name for the duration.

Without a terminal a phase logs `model_progress` events: when it starts, every LOG_EVERY_S seconds
or LOG_EVERY_FRACTION of the way (whichever comes first), and when it ends; a quick phase (under
MIN_GAP_S between those points) logs its start and end only.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import structlog

log = structlog.get_logger(__name__)

LOG_EVERY_S = 5.0
LOG_EVERY_FRACTION = 0.25
MIN_GAP_S = 1.0


class Phase:
    """One step of the work, `total` units long (None: unknown); update() as units get done."""

    def update(self, n: float = 1) -> None:
        raise NotImplementedError

    def set_total(self, total: float | None) -> None:
        """The length, once known (a step whose bar transformers starts part-way through)."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class Reporter:
    """Opens phases; one reporter per conversion or load."""

    # Steps open under a label, waiting for transformers' bar of that label to give them a length.
    pending: dict[str, Phase]

    def phase(self, description: str, total: float | None) -> Phase:
        raise NotImplementedError

    def close(self) -> None:
        """Ends the display (the terminal bar stays on screen, finished)."""


class LogPhase(Phase):
    def __init__(self, description: str, total: float | None) -> None:
        self.description = description
        self.total = total
        self.done = 0.0
        self.started = self.last_logged = time.monotonic()
        self.next_fraction = LOG_EVERY_FRACTION
        self.closed = False
        self.lock = threading.Lock()  # the work's thread and the reporter's heartbeat both log
        self._log("started")

    def _log(self, state: str) -> None:
        fields: dict[str, Any] = {"phase": self.description, "state": state, "done": round(self.done)}
        if self.total:
            fields["total"] = round(self.total)
            fields["percent"] = round(100 * self.done / self.total)
        fields["elapsed_s"] = round(time.monotonic() - self.started, 1)
        log.info("model_progress", **fields)
        self.last_logged = time.monotonic()

    def update(self, n: float = 1) -> None:
        with self.lock:
            self.done += n
            since = time.monotonic() - self.last_logged
            due = since >= LOG_EVERY_S
            if self.total and self.done / self.total >= self.next_fraction:
                while self.done / self.total >= self.next_fraction:
                    self.next_fraction += LOG_EVERY_FRACTION
                # A quick phase logs its start and end only; the end is logged by close().
                due = due or (since >= MIN_GAP_S and self.done < self.total)
            if due:
                self._log("running")

    def heartbeat(self) -> None:
        """Log `running` if nothing was logged for LOG_EVERY_S: work between updates is still work."""
        with self.lock:
            if not self.closed and time.monotonic() - self.last_logged >= LOG_EVERY_S:
                self._log("running")

    def set_total(self, total: float | None) -> None:
        with self.lock:
            self.total = total

    def close(self) -> None:
        with self.lock:
            if not self.closed:
                self.closed = True
                self._log("done")


class LogReporter(Reporter):
    """Phases as log events; a heartbeat thread logs a phase that goes LOG_EVERY_S without an update."""

    def __init__(self) -> None:
        self.pending = {}
        self.phases: list[LogPhase] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, name="model-progress", daemon=True)
        self.thread.start()

    def _beat(self) -> None:
        while not self.stopped.wait(LOG_EVERY_S / 5):
            for phase in list(self.phases):
                phase.heartbeat()

    def phase(self, description: str, total: float | None) -> Phase:
        phase = LogPhase(description, total)
        self.phases.append(phase)
        return phase

    def close(self) -> None:
        self.stopped.set()
        self.thread.join()


class RichPhase(Phase):
    def __init__(self, progress: Any, description: str, total: float | None) -> None:
        self.progress = progress
        self.task = progress.add_task(description, total=total)
        self.total = total

    def update(self, n: float = 1) -> None:
        self.progress.update(self.task, advance=n)

    def set_total(self, total: float | None) -> None:
        self.total = total
        self.progress.update(self.task, total=total)

    def close(self) -> None:
        if self.total is None:  # a phase of unknown length shows as finished once it ends
            self.progress.update(self.task, total=1, completed=1)
        self.progress.stop_task(self.task)


class RichReporter(Reporter):
    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn("{task.description:<44}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(stderr=True),
            # Our logs go to the stderr file object structlog captured, not through sys.stderr.
            redirect_stderr=False,
            redirect_stdout=False,
        )
        self.progress.start()
        self.pending = {}

    def phase(self, description: str, total: float | None) -> Phase:
        return RichPhase(self.progress, description, total)

    def close(self) -> None:
        self.progress.stop()


def for_stderr() -> Reporter:
    """A terminal bar when stderr is a terminal, else log events (as kvgate.logs picks console or JSON)."""
    return RichReporter() if sys.stderr.isatty() else LogReporter()


class _Tqdm:
    """What transformers calls tqdm for, reporting to a Phase: iteration, update, close, with-blocks.

    `owned`: close() closes the phase; a step's phase (adopted) is closed by the step instead.
    """

    def __init__(self, phase: Phase | None, iterable: Iterable[Any] | None, *, owned: bool) -> None:
        self.phase = phase
        self.iterable = iterable
        self.owned = owned

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None
        try:
            for item in self.iterable:
                yield item
                self.update(1)
        finally:
            self.close()

    def update(self, n: float = 1) -> None:
        if self.phase is not None:
            self.phase.update(n)

    def close(self) -> None:
        if self.phase is not None and self.owned:
            self.phase.close()

    def __enter__(self) -> _Tqdm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __getattr__(self, name: str) -> Any:
        # set_description, set_postfix, refresh, ...: nothing to show beyond the phase's own line.
        return lambda *args, **kwargs: None


def _total(iterable: Any, total: Any) -> float | None:
    if total is not None:
        return float(total)
    try:
        return float(len(iterable))
    except TypeError:
        return None


@contextmanager
def reporting(reporter: Reporter, labels: dict[str, str | None]) -> Iterator[Reporter]:
    """transformers' progress bars reported to `reporter`; `labels` renames their descriptions (None: hides)."""
    import transformers.utils.logging as hf_logging

    def make(iterable: Any = None, *args: Any, **kwargs: Any) -> _Tqdm:
        description = str(kwargs.get("desc") or "working").rstrip(". ")
        label = labels.get(description, description)
        total = _total(iterable, kwargs.get("total"))
        if label is None:  # a bar not worth showing (its step has its own)
            return _Tqdm(None, iterable, owned=False)
        adopted = reporter.pending.pop(label, None)
        if adopted is not None:
            adopted.set_total(total)
            return _Tqdm(adopted, iterable, owned=False)
        return _Tqdm(reporter.phase(label, total), iterable, owned=True)

    def hook(_factory: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> _Tqdm:
        return make(*args, **kwargs)

    previous = hf_logging.set_tqdm_hook(hook)
    gguf = _gguf_module()
    gguf_tqdm = getattr(gguf, "tqdm", None)
    if gguf is not None:
        gguf.tqdm = make
    try:
        yield reporter
    finally:
        hf_logging.set_tqdm_hook(previous)
        if gguf is not None:
            gguf.tqdm = gguf_tqdm
        reporter.close()


def _gguf_module() -> Any:
    try:
        import transformers.modeling_gguf_pytorch_utils as gguf
    except ImportError:  # without the gguf package there is no GGUF reader to report on
        return None
    return gguf


@contextmanager
def step(reporter: Reporter, description: str) -> Iterator[None]:
    """A phase around a block, shown from its start. A bar of transformers' labelled `description`
    inside the block gives it its length and advances it (say, the tensors of a conversion after
    seconds spent reading the file); without one it has no length (reading a tokenizer)."""
    phase = reporter.phase(description, None)
    reporter.pending[description] = phase
    try:
        yield
    finally:
        reporter.pending.pop(description, None)
        phase.close()
