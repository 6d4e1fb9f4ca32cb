"""A rich progress bar for training loops: step, loss, tokens/s and time left.

On a terminal it redraws in place; when the output is a log file (nohup) rich cannot redraw, so
a plain line is printed every `log_every` steps instead and the log still shows progress.
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

__all__ = ["TrainingProgress"]


class TrainingProgress:
    def __init__(self, label: str, total_steps: int, console: Console | None = None, log_every: int = 25) -> None:
        self.console = console or Console(stderr=True)
        self.label, self.total, self.log_every = label, total_steps, log_every
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.3f}"),
            TextColumn("{task.fields[tps]:,.0f} tok/s"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self._task = self._progress.add_task(label, total=total_steps, loss=float("nan"), tps=0.0)
        self._start = time.monotonic()
        self._tokens = 0

    def __enter__(self) -> TrainingProgress:
        self._progress.start()
        self._start = time.monotonic()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def update(self, step: int, loss: float, tokens: int) -> None:
        """Record that `step` (1-based) finished with `loss` after `tokens` tokens in this step."""
        self._tokens += tokens
        elapsed = max(time.monotonic() - self._start, 1e-9)
        tps = self._tokens / elapsed
        self._progress.update(self._task, completed=step, loss=loss, tps=tps)
        if not self.console.is_terminal and (step % self.log_every == 0 or step == self.total):
            left = elapsed / step * (self.total - step)
            self.console.print(
                f"{self.label} step {step}/{self.total} loss {loss:.3f} {tps:,.0f} tok/s "
                f"elapsed {elapsed / 60:.1f} min, left {left / 60:.1f} min",
                highlight=False,
            )
