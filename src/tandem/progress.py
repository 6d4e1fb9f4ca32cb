"""A progress bar of named steps with the time left, on stderr, for `tandem bench` and `tandem profile`.

Silent when stderr is not a terminal (a log file, a pipe, CI) or when asked to be (--quiet): the
results on stdout stay the only output. The time left is rich's estimate from the steps done so far.
"""

from __future__ import annotations

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
    """`step(what, done, total)` is called as step `done + 1` of `total`, named `what`, begins."""

    def __init__(self, label: str, console: Console | None = None, quiet: bool = False) -> None:
        self.console = console or Console(stderr=True)
        self.label = label
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

    def __enter__(self) -> StepProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        task = self._progress.tasks[0]
        if exc[0] is None and task.total is not None:
            self._progress.update(self._task, completed=task.total, description="done")
        self._progress.stop()

    def step(self, what: str, done: int, total: int) -> None:
        self._progress.update(self._task, completed=done, total=total, description=what)
