"""Progress of a long loop (train, eval, sft, data builds, demonstrations), on stderr.

On a terminal: a rich bar with the count, elapsed time, ETA and a status text. Anywhere
else (a log file, CI, a pipe): one plain line every ``every`` items and at the last, so
that a log shows how far a job got and where its time goes, e.g.

    train 3/24 (12s, eta 1m24s) reward 0.500 success 0.50 zero-grad 0/1 | generation 1.2s ...
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                           TimeRemainingColumn)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{seconds:02d}s" if minutes else f"{seconds}s"


class LoopProgress:
    """``with LoopProgress("eval", total) as progress: ... progress.advance(n, status)``.

    ``enabled`` False shows nothing; ``every``: items per plain line off a terminal;
    ``completed``: items done before (a resumed run); ``terminal``: None asks stderr.
    """

    def __init__(self, label: str, total: int, enabled: bool = True, every: int = 1, completed: int = 0,
                 terminal: bool | None = None):
        self.label, self.total, self.enabled, self.every = label, total, enabled, max(every, 1)
        self.done = self.start = completed
        self.terminal = sys.stderr.isatty() if terminal is None else terminal
        self._bar: Progress | None = None
        self._started = time.perf_counter()

    def __enter__(self) -> LoopProgress:
        if self.enabled and self.terminal:
            self._bar = Progress(TextColumn(f"[bold]{self.label}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                                 TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.description}"),
                                 console=Console(stderr=True))
            self._bar.__enter__()
            self._job = self._bar.add_task("", total=self.total, completed=self.done)
        self._started = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, error, trace)

    def advance(self, n: int = 1, status: str = "") -> None:
        """``n`` more items done; ``status``: what to show beside the count."""
        before, self.done = self.done, self.done + n
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._job, advance=n, description=status)
        elif self.done // self.every > before // self.every or self.done >= self.total:
            print(self.line(status), file=sys.stderr, flush=True)

    def line(self, status: str = "") -> str:
        """The plain progress line: count, elapsed, ETA at the rate so far, status."""
        elapsed = time.perf_counter() - self._started
        rate = (self.done - self.start) / elapsed if elapsed > 0 else 0.0
        eta = _clock((self.total - self.done) / rate) if rate > 0 else "?"
        return f"{self.label} {self.done}/{self.total} ({_clock(elapsed)}, eta {eta}) {status}".rstrip()
