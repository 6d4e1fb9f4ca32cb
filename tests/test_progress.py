"""StepProgress: a bar with the step's name and the time left on a terminal; silent otherwise."""

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
