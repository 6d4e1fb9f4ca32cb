"""The training progress bar: on a log file (not a terminal) it prints a line every few steps."""

import io

from rich.console import Console

from tandem.zoo.progress import TrainingProgress


def test_log_lines_report_step_loss_speed_and_time_left():
    stream = io.StringIO()
    console = Console(file=stream, force_terminal=False, width=200)
    with TrainingProgress("target", total_steps=10, console=console, log_every=4) as progress:
        for step in range(1, 11):
            progress.update(step, loss=5.0 - step * 0.1, tokens=100)
    lines = [line for line in stream.getvalue().splitlines() if line.startswith("target step")]
    assert [line.split()[2] for line in lines] == ["4/10", "8/10", "10/10"]
    assert "loss 4.600" in lines[0] and "tok/s" in lines[0] and "left" in lines[0]
