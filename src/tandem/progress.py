"""A progress bar of named steps with the time left, on stderr: `tandem bench`, `tandem profile`, the zoo's training.

On a terminal it redraws in place. Elsewhere (a log file, a pipe, CI) it is silent, so the results on
stdout stay the only output; or, with `log_every=N` (training under nohup), it prints a plain line
every N steps and at the last, so the log still shows progress. `quiet` silences it everywhere. The
time left is rich's estimate from the steps done so far (off a terminal: the mean step so far).
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["StepProgress"]


class StepProgress:
    """`step(what, done, total)`: `done` of `total` steps are finished; `what` says what runs now (or how
    the last step went: "loss 4.600  1,234 tok/s")."""

    def __init__(
        self, label: str, console: Console | None = None, quiet: bool = False, *, log_every: int | None = None
    ) -> None:
        self.console = console or Console(stderr=True)
        self.label = label
        self._log_every = None if quiet else log_every
        self._progress = Progress(
            TextColumn("[bold]{task.fields[label]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=self.console,
            disable=quiet or not self.console.is_terminal,
        )
        self._task = self._progress.add_task("", total=None, label=label)
        self._start = time.monotonic()

    def __enter__(self) -> StepProgress:
        self._progress.start()
        self._start = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        task = self._progress.tasks[0]
        if exc[0] is None and task.total is not None:
            self._progress.update(self._task, completed=task.total, description="done")
        self._progress.stop()

    def step(self, what: str, done: int, total: int) -> None:
        self._progress.update(self._task, completed=done, total=total, description=what)
        every = self._log_every
        if every and not self.console.is_terminal and done > 0 and (done % every == 0 or done == total):
            elapsed = time.monotonic() - self._start
            left = elapsed / done * (total - done)
            self.console.print(
                f"{self.label} step {done}/{total} {what} elapsed {elapsed / 60:.1f} min, left {left / 60:.1f} min",
                highlight=False,
            )
