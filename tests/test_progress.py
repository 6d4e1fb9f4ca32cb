"""StepProgress: the step's name and the time left on a terminal; off one, silent or a line every few steps."""

import io

from rich.console import Console

from tandem.progress import StepProgress


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=terminal, width=120), out


def test_a_terminal_shows_steps_done_and_time_left():
    console, out = _console(terminal=True)
    with StepProgress("bench", console) as bar:
        bar.step("loading and warming up baseline", 0, 4)
        bar.step("round 1/3: baseline", 1, 4)
    text = out.getvalue()
    assert "bench" in text and "left" in text and "4/4" in text


def test_quiet_and_non_terminals_print_nothing():
    for terminal, quiet in ((False, False), (True, True)):
        console, out = _console(terminal)
        with StepProgress("bench", console, quiet=quiet) as bar:
            bar.step("round 1/3: baseline", 0, 3)
        assert out.getvalue() == ""


def test_off_a_terminal_log_every_prints_a_line_every_few_steps():
    """Training under nohup: a log file still shows the step, how it went and the time left."""
    console, out = _console(terminal=False)
    with StepProgress("target", console, log_every=4) as progress:
        for step in range(1, 11):
            progress.step(f"loss {5.0 - step * 0.1:.3f} 1,000 tok/s", step, 10)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("target step")]
    assert [line.split()[2] for line in lines] == ["4/10", "8/10", "10/10"]
    assert "loss 4.600" in lines[0] and "tok/s" in lines[0] and "left" in lines[0]
